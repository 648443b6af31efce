"""Datasets, loaders and client partitions for the federated simulation: the one import for all of them.

Two datasets, as in the PI-SME / SME victim protocol:

* FEMNIST (LEAF, Caldas et al. 2018): 1x28x28 handwriting, 62 classes, one client per writer.
  LEAF convention is kept throughout: 255 (1.0) = white background, ink dark.
* CIFAR-100 (Krizhevsky 2009): 3x32x32 RGB, 100 fine classes, k-sample clients cut from a pool.

Pools hold a whole dataset as uint8 arrays; ``client_partition`` cuts one client's private
training set (exactly k samples) plus held-out samples and returns float32 NCHW tensors in [0,1].
Normalisation (``DatasetSpec.normalize``) is applied by the model side, not here.

Besides the paper's partitions (``client_partition``), the federation can cut its clients with the
partitioners of Flower Datasets (flwr_datasets: natural, iid, dirichlet, pathological), applied to a
``datasets.Dataset`` of the pool's indices and labels (``flower_client_partition``). The ClientApp and
the evaluator both go through ``load_client_split(DataSettings, partition_id)``.

This module re-exports the public names of the modules that hold them, one per dataset and one per role:

* pools.py: ``DatasetSpec``, ``DATASETS``, ``get_spec``, ``Pool``, ``ClientData``, ``ClientSplit``.
* femnist.py: LEAF FEMNIST, ``load_femnist_leaf``, ``partition_writers`` (the writer of each client).
* cifar.py: CIFAR-100, ``load_cifar100_pickles``.
* loading.py: ``load_pool``, ``load_bundled``, ``load_saved_dataset`` (bundled, .npz, save_to_disk).
* partition.py: the paper's partitions (``client_partition``, ``num_partitions``, ``server_test_set``),
  the Flower Datasets partitioners, ``DataSettings``, ``load_client_split``, ``run_writers``.
"""

from __future__ import annotations

from pathlib import Path

from fl_attack.federation.cifar import load_cifar100_pickles
from fl_attack.federation.femnist import load_femnist_leaf, partition_writers
from fl_attack.federation.loading import load_bundled, load_pool, load_saved_dataset
from fl_attack.federation.partition import (
    DIRICHLET_MIN_PARTITION_SIZE,
    PARTITIONERS,
    DataSettings,
    client_partition,
    flower_client_partition,
    flower_partitioner,
    flower_partitions,
    load_client_split,
    num_partitions,
    partition_dataset,
    partition_sizes,
    run_writers,
    server_test_set,
)
from fl_attack.federation.pools import DATASETS, ClientData, ClientSplit, DatasetSpec, Pool, get_spec

__all__ = [
    "DatasetSpec",
    "DATASETS",
    "get_spec",
    "ClientData",
    "ClientSplit",
    "Pool",
    "load_femnist_leaf",
    "load_cifar100_pickles",
    "load_bundled",
    "load_pool",
    "num_partitions",
    "client_partition",
    "load_saved_dataset",
    "PARTITIONERS",
    "DataSettings",
    "partition_dataset",
    "flower_partitioner",
    "flower_partitions",
    "partition_sizes",
    "flower_client_partition",
    "load_client_split",
    "partition_writers",
    "run_writers",
    # public, though not in the original __all__
    "server_test_set",
    "DIRICHLET_MIN_PARTITION_SIZE",
]

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"
