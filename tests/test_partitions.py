"""Flower Datasets partitioners (run config ``partitioner``) on the bundled real data: the partitions
equal what flwr_datasets' own partitioners give, the k-sample draw, the server's held-out test set,
data-dir datasets written by ``save_to_disk``, and the run-config checks (fl_attack/federation/partition.py,
fl_attack/run_config.py)."""

from __future__ import annotations

import csv
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict
from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, PathologicalPartitioner
from PIL import Image

from clients.client_app import _load_split, node_settings
from fl_attack.audit.replay import open_run
from fl_attack.audit.settings import RunSettings
from fl_attack.evaluation.victims import private_samples
from fl_attack.federation import data as D
from fl_attack.federation import partition
from fl_attack.federation.data import (
    DataSettings,
    client_partition,
    flower_partitions,
    load_bundled,
    load_client_split,
    load_pool,
    partition_sizes,
    server_test_set,
)
from strategies.server_app import build_strategy, write_run_config

HELD_OUT = 1000  # server-test-samples: the default


@pytest.fixture(scope="module")
def femnist():
    return load_bundled("femnist")


@pytest.fixture(scope="module")
def cifar():
    return load_bundled("cifar100")


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Client tensor (n,C,H,W) in [0,1] -> pool layout uint8."""
    x = (images * 255).round().to(torch.uint8).numpy()
    return x[:, 0] if x.shape[1] == 1 else x.transpose(0, 2, 3, 1)


def client_rows(pool, held_out: int, seed: int) -> np.ndarray:
    """The pool indices a client may get, computed here from the documented rules: femnist LEAF
    train; cifar100 all but the last ``held_out`` of the seed's permutation (the server's)."""
    if pool.dataset == "femnist":
        return np.flatnonzero(pool.split == 0)
    server = np.random.default_rng(seed).permutation(len(pool))[len(pool) - held_out :]
    return np.setdiff1d(np.arange(len(pool)), server)


def library_partitions(pool, partitioner, held_out: int, seed: int) -> list[np.ndarray]:
    """flwr_datasets' partitioner called directly on a Dataset built here (shuffled with the seed,
    as FederatedDataset does): each partition's pool indices."""
    idx = client_rows(pool, held_out, seed)
    ds = Dataset.from_dict({"index": idx, "label": pool.labels[idx]}).shuffle(seed=seed)
    partitioner.dataset = ds
    return [np.asarray(partitioner.load_partition(p)["index"]) for p in range(partitioner.num_partitions)]


def assert_same(ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


# --- the partitions are flwr_datasets' -------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7])
def test_dirichlet_partitions_are_the_librarys(cifar, seed):
    ours = flower_partitions(cifar, "dirichlet", 10, seed=seed, alpha=0.5, held_out=HELD_OUT)
    theirs = library_partitions(
        cifar,
        DirichletPartitioner(num_partitions=10, partition_by="label", alpha=0.5, min_partition_size=10, seed=seed),
        HELD_OUT,
        seed,
    )
    assert_same(ours, theirs)
    counts = [np.bincount(cifar.labels[p], minlength=100) for p in ours]
    assert [c.tolist() for c in counts] == [np.bincount(cifar.labels[p], minlength=100).tolist() for p in theirs]
    assert sum(len(p) for p in ours) == len(cifar) - HELD_OUT  # every client sample in one partition
    assert min(len(p) for p in ours) >= D.DIRICHLET_MIN_PARTITION_SIZE
    # non-IID: some partition has a label share far from the pool's
    shares = np.stack([c / c.sum() for c in counts])
    assert np.abs(shares - shares.mean(0)).max() > 0.05


def test_dirichlet_alpha_changes_the_partitions(cifar):
    a = flower_partitions(cifar, "dirichlet", 10, alpha=0.5, held_out=HELD_OUT)
    b = flower_partitions(cifar, "dirichlet", 10, alpha=100.0, held_out=HELD_OUT)
    assert any(len(x) != len(y) or not np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("dataset,classes", [("cifar100", 5), ("femnist", 3)])
def test_pathological_gives_each_partition_exactly_c_classes(dataset, classes):
    pool = load_bundled(dataset)
    held_out = HELD_OUT if dataset == "cifar100" else 0
    ours = flower_partitions(pool, "pathological", 8, seed=3, classes=classes, held_out=held_out)
    theirs = library_partitions(
        pool,
        PathologicalPartitioner(num_partitions=8, partition_by="label", num_classes_per_partition=classes, seed=3),
        held_out,
        3,
    )
    assert_same(ours, theirs)
    assert [len(np.unique(pool.labels[p])) for p in ours] == [classes] * 8


@pytest.mark.parametrize("dataset", ["cifar100", "femnist"])
def test_iid_partition_sizes_differ_by_at_most_one(dataset):
    pool = load_bundled(dataset)
    held_out = HELD_OUT if dataset == "cifar100" else 0
    ours = flower_partitions(pool, "iid", 7, seed=1, held_out=held_out)
    assert_same(ours, library_partitions(pool, IidPartitioner(num_partitions=7), held_out, 1))
    sizes = [len(p) for p in ours]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(client_rows(pool, held_out, 1))
    assert len(np.unique(np.concatenate(ours))) == sum(sizes)  # disjoint


def test_natural_partitions_are_the_leaf_writers(femnist):
    parts = flower_partitions(femnist, "natural")
    writers = sorted({str(femnist.writer_names[w]) for w in femnist.writers[femnist.split == 0]})
    assert len(parts) == len(writers)
    for p in (0, 1, len(writers) // 2, len(writers) - 1):
        w = int(np.flatnonzero(femnist.writer_names == writers[p])[0])
        expected = np.flatnonzero((femnist.writers == w) & (femnist.split == 0))
        np.testing.assert_array_equal(np.sort(parts[p]), expected)
    data = DataSettings("femnist", 0, partitioner="natural")
    split = load_client_split(data, 2)
    assert split.train.client_id == writers[2] and len(split.train) == len(parts[2])


@pytest.mark.parametrize(
    "partitioner,classes", [("iid", None), ("dirichlet", None), ("pathological", 4), ("natural", None)]
)
def test_partitions_are_reproducible_for_a_seed(partitioner, classes):
    dataset = "femnist" if partitioner == "natural" else "cifar100"
    pool = load_bundled(dataset)
    args = dict(num_partitions=6, classes=classes, held_out=0)  # held_out=0: only the partitioner sees the seed
    partition._flower_partitions.cache_clear()  # recomputed, not the cached arrays
    a = flower_partitions(pool, partitioner, seed=5, **args)
    partition._flower_partitions.cache_clear()
    b = flower_partitions(pool, partitioner, seed=5, **args)
    c = flower_partitions(pool, partitioner, seed=6, **args)
    assert_same(a, b)
    if partitioner == "natural":  # the writers decide membership; the seed only orders
        assert [set(x.tolist()) for x in a] == [set(x.tolist()) for x in c]
    else:
        assert any(len(x) != len(y) or not np.array_equal(x, y) for x, y in zip(a, c))
    # the k-sample draw too
    data = DataSettings(
        dataset, 8, classes=classes, held_out=args["held_out"], partitioner=partitioner, num_partitions=6
    )
    first, again = load_client_split(data, 1, pool), load_client_split(data, 1, pool)
    assert torch.equal(first.train.images, again.train.images) and torch.equal(first.train.labels, again.train.labels)
    other = load_client_split(dataclasses.replace(data, seed=9), 1, pool)
    assert not torch.equal(first.train.images, other.train.images)


# --- the client's k samples --------------------------------------------------------------------


def test_samples_per_client_zero_is_the_whole_partition(cifar):
    data = DataSettings("cifar100", 0, held_out=HELD_OUT, partitioner="dirichlet", num_partitions=10, seed=2)
    part = flower_partitions(cifar, "dirichlet", 10, seed=2, held_out=HELD_OUT)[4]
    split = load_client_split(data, 4, cifar)
    np.testing.assert_array_equal(to_uint8(split.train.images), cifar.images[part])
    np.testing.assert_array_equal(split.train.labels.numpy(), cifar.labels[part])
    assert len(split.test) == 0 and split.train.client_id == "cifar100-dirichlet-4" and split.train.partition_id == 4
    assert partition_sizes(data, cifar).tolist() == [
        len(p) for p in flower_partitions(cifar, "dirichlet", 10, 2, 0.5, None, HELD_OUT)
    ]


def test_k_samples_are_drawn_from_the_partition_and_the_test_set_is_the_rest(cifar):
    data = DataSettings("cifar100", 20, held_out=HELD_OUT, partitioner="iid", num_partitions=10)
    part = flower_partitions(cifar, "iid", 10, held_out=HELD_OUT)[3]
    split = load_client_split(data, 3, cifar)
    assert len(split.train) == 20 and len(split.test) == max(1, len(part) // 5)
    rows = {bytes(r) for r in cifar.images[part].reshape(len(part), -1)}
    train = [bytes(r) for r in to_uint8(split.train.images).reshape(20, -1)]
    test = [bytes(r) for r in to_uint8(split.test.images).reshape(len(split.test), -1)]
    assert set(train) <= rows and set(test) <= rows and not set(train) & set(test)
    order = np.random.default_rng([0, 3]).permutation(len(part))
    np.testing.assert_array_equal(split.train.labels.numpy(), cifar.labels[part[order[:20]]])


def test_more_samples_than_a_partition_is_refused_before_the_federation(cifar):
    sizes = partition_sizes(DataSettings("cifar100", 0, held_out=HELD_OUT, partitioner="dirichlet", num_partitions=10))
    k = int(sizes.min()) + 1
    small = int(np.argmin(sizes))
    settings = RunSettings.from_run_config(
        {"dataset": "cifar100", "partitioner": "dirichlet", "samples-per-client": k, "batch-size": 4}
    )
    with pytest.raises(ValueError, match=rf"invalid run config: samples-per-client: partition {small} has only "):
        settings.check_partitions(10)
    with pytest.raises(ValueError, match=rf"partition {small} has only {int(sizes.min())} samples, asked for {k}"):
        load_client_split(settings.with_partitions(10).data, small)
    dataclasses.replace(settings, samples_per_client=int(sizes.min())).check_partitions(10)  # just fits


def test_whole_partitions_check_the_batch_size_per_client(cifar):
    sizes = partition_sizes(DataSettings("cifar100", 0, held_out=HELD_OUT, partitioner="dirichlet", num_partitions=10))
    base = {"dataset": "cifar100", "partitioner": "dirichlet", "samples-per-client": 0}
    RunSettings.from_run_config({**base, "batch-size": int(sizes.min())}).check_partitions(10)
    with pytest.raises(ValueError, match=r"invalid run config: batch-size: partition \d+ has only \d+ samples"):
        RunSettings.from_run_config({**base, "batch-size": int(sizes.min()) + 1}).check_partitions(10)


def test_natural_needs_as_many_writers_as_nodes(femnist):
    writers = len(flower_partitions(femnist, "natural"))
    settings = RunSettings.from_run_config({"partitioner": "natural", "samples-per-client": 0, "batch-size": 1})
    settings.check_partitions(writers)
    with pytest.raises(ValueError, match=rf"only {writers} writers with training samples"):
        settings.check_partitions(writers + 1)


@pytest.mark.parametrize(
    "partitioner,classes", [("iid", None), ("dirichlet", None), ("pathological", 5), ("natural", None)]
)
def test_the_server_test_set_is_in_no_partition(partitioner, classes):
    dataset = "femnist" if partitioner == "natural" else "cifar100"
    pool = load_bundled(dataset)
    parts = np.concatenate(flower_partitions(pool, partitioner, 10, classes=classes, held_out=HELD_OUT))
    if dataset == "femnist":
        assert (pool.split[parts] == 0).all()  # the server's test set is LEAF-test
    else:
        server = server_test_set(pool, HELD_OUT, seed=0)
        assert not {bytes(r) for r in to_uint8(server.images).reshape(HELD_OUT, -1)} & {
            bytes(r) for r in pool.images[parts].reshape(len(parts), -1)
        }
        if partitioner != "pathological":  # which leaves the classes it assigns nobody unused
            assert len(parts) == len(pool) - HELD_OUT
    for pid in range(3):  # and the clients' own samples
        train = private_samples(DataSettings(dataset, 0, None, classes, 0, HELD_OUT, partitioner, 0.5, 10), pid)
        assert len(train) > 0


# --- the paper's partitions are unchanged ----------------------------------------------------------


@pytest.mark.parametrize("dataset,classes", [("femnist", None), ("cifar100", None), ("cifar100", 5)])
def test_paper_goes_through_client_partition_unchanged(dataset, classes):
    pool = load_bundled(dataset)
    settings = RunSettings.from_run_config(
        {"dataset": dataset, "classes-per-client": classes or 0, "samples-per-client": 16, "batch-size": 4}
    )
    assert settings.partitioner == "paper" and settings.data.partitioner == "paper"
    ours = load_client_split(settings.data, 2)
    ref = client_partition(pool, 2, 16, classes, seed=0, held_out=settings.held_out)
    for a, b in ((ours.train, ref.train), (ours.test, ref.test)):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels) and a.client_id == b.client_id


# --- the ClientApp, the evaluator and replay see the same partitions -----------------------------


def test_client_app_and_evaluator_cut_the_same_data(tmp_path):
    run_config = {
        "dataset": "cifar100",
        "partitioner": "dirichlet",
        "dirichlet-alpha": 0.3,
        "samples-per-client": 12,
        "batch-size": 4,
        "seed": 4,
    }
    context = SimpleNamespace(run_config=run_config, node_config={"partition-id": 2, "num-partitions": 6})
    client = _load_split(node_settings(context), 2).train
    settings = RunSettings.from_run_config(run_config)
    truth = private_samples(settings.with_partitions(6).data, 2)
    assert torch.equal(client.images, truth.images) and torch.equal(client.labels, truth.labels)
    assert client.client_id == "cifar100-dirichlet-2"
    # the server's strategy carries its node count
    _, strategy, _ = build_strategy(settings, tmp_path / "run", 6, settings.new_model(seed=0).state_dict())
    assert strategy.settings.num_partitions == 6
    assert torch.equal(private_samples(strategy.settings.data, 2).images, truth.images)
    # a replay reads the node count back from config.json
    write_run_config(tmp_path / "run", settings, run_config, num_nodes=6)
    (tmp_path / "run" / "updates").mkdir(exist_ok=True)
    with open(tmp_path / "run" / "updates" / "index.csv", "w", newline="") as f:
        csv.writer(f).writerows([["round", "partition_id"], [1, 2]])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["num_nodes"] == 6
    run = open_run(tmp_path / "run")
    assert run.data == truth_data(settings, 6)
    assert torch.equal(private_samples(run.data, 2).images, truth.images)
    strategy.finish(timeout=10)


def truth_data(settings: RunSettings, nodes: int) -> DataSettings:
    return settings.with_partitions(nodes).data


def test_a_flower_partitioner_needs_the_partition_count():
    with pytest.raises(ValueError, match="needs the federation's number of partitions"):
        load_client_split(DataSettings("cifar100", 8, partitioner="iid"), 0)
    context = SimpleNamespace(run_config={"partitioner": "iid"}, node_config={"partition-id": 0, "num-partitions": "x"})
    with pytest.raises(ValueError, match="num-partitions"):
        node_settings(context)


@pytest.mark.heavy
def test_an_in_process_federation_scores_attacks_on_dirichlet_clients(tmp_path):
    from tests.inprocess import federate

    settings, strategy, _, jobs = federate(
        tmp_path,
        partitions=(0, 1),
        dataset="cifar100",
        partitioner="dirichlet",
        samples_per_client=6,
        batch_size=3,
        attack_clients="0",
        attack_iterations=2,
    )
    assert len(jobs) == 1 and jobs[0].update.metadata.num_samples == 6
    with open(tmp_path / "attacks.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["client_id"] for r in rows] == ["cifar100-dirichlet-0"]
    assert rows[0]["status"] == "ok" and rows[0]["psnr"] != ""


# --- data-dir: a dataset written by save_to_disk -------------------------------------------------


def test_a_saved_cifar_dataset_loads_through_data_dir(tmp_path, cifar):
    n = 200
    Dataset.from_dict({"image": list(cifar.images[:n]), "label": cifar.labels[:n]}).save_to_disk(tmp_path / "c")
    pool = load_pool("cifar100", tmp_path / "c")
    np.testing.assert_array_equal(pool.images, cifar.images[:n])
    np.testing.assert_array_equal(pool.labels, cifar.labels[:n])
    settings = RunSettings.from_run_config(
        {
            "dataset": "cifar100",
            "data-dir": str(tmp_path / "c"),
            "partitioner": "iid",
            "samples-per-client": 0,
            "batch-size": 4,
            "server-test-samples": 50,
        }
    )
    settings.check_partitions(5)
    split = load_client_split(settings.with_partitions(5).data, 1)
    assert len(split.train) == 30  # (200 - 50) / 5
    with pytest.raises(ValueError, match=r"invalid run config: data-dir: .*needs \(28, 28\) per image"):
        RunSettings.from_run_config({"data-dir": str(tmp_path / "c"), "server-test-samples": 0}).check_partitions(2)


def test_a_saved_femnist_dataset_dict_keeps_writers_and_splits(tmp_path, femnist):
    def part(mask):
        idx = np.flatnonzero(mask)[:300]
        return Dataset.from_dict(
            {
                "image": [Image.fromarray(a) for a in femnist.images[idx]],
                "label": femnist.labels[idx],
                "writer_id": femnist.writer_names[femnist.writers[idx]].tolist(),
            }
        ), idx

    train, train_idx = part(femnist.split == 0)
    test, test_idx = part(femnist.split == 1)
    DatasetDict({"train": train, "test": test}).save_to_disk(tmp_path / "f")
    pool = load_pool("femnist", str(tmp_path / "f"))
    np.testing.assert_array_equal(pool.images, femnist.images[np.concatenate([train_idx, test_idx])])
    assert (pool.split == 0).sum() == 300 and (pool.split == 1).sum() == 300
    names = pool.writer_names[pool.writers]
    np.testing.assert_array_equal(names, femnist.writer_names[femnist.writers[np.concatenate([train_idx, test_idx])]])
    data = DataSettings("femnist", 0, str(tmp_path / "f"), partitioner="natural")
    first = load_client_split(data, 0)
    assert first.train.client_id == sorted(set(names[pool.split == 0].tolist()))[0]
    assert len(server_test_set(pool, 100)) == 100  # from the test split


def test_a_saved_dataset_without_the_columns_is_refused(tmp_path, cifar):
    Dataset.from_dict({"img": list(cifar.images[:4]), "fine_label": cifar.labels[:4]}).save_to_disk(tmp_path / "x")
    with pytest.raises(ValueError, match=r"needs 'image' and 'label'"):
        load_pool("cifar100", tmp_path / "x")


# --- the run-config checks -----------------------------------------------------------------------


BAD = [
    ({"partitioner": "shards"}, "partitioner must be one of paper, natural, iid, dirichlet, pathological"),
    ({"partitioner": "dirichlet", "dirichlet-alpha": 0.0}, "dirichlet-alpha must be > 0"),
    ({"partitioner": "dirichlet", "dirichlet-alpha": -1.0}, "dirichlet-alpha must be > 0"),
    ({"partitioner": "natural", "dataset": "cifar100"}, "partitioner 'natural' partitions by writer id: femnist only"),
    ({"partitioner": "pathological", "dataset": "cifar100"}, "'pathological' needs classes-per-client >= 1"),
    (
        {"partitioner": "iid", "dataset": "cifar100", "classes-per-client": 5},
        "classes-per-client applies to partitioner 'paper' \\(cifar100\\) and 'pathological' only, not 'iid'",
    ),
    ({"partitioner": "dirichlet", "classes-per-client": 5}, "not 'dirichlet'"),
    ({"partitioner": "paper", "samples-per-client": 0}, "samples-per-client must be >= 1 \\(0 = each client's whole"),
    ({"partitioner": "iid", "samples-per-client": -1}, "samples-per-client must be >= 1"),
]


@pytest.mark.parametrize("config,message", BAD)
def test_bad_partitioner_configs_are_refused_before_anything_starts(config, message):
    with pytest.raises(ValueError, match="invalid run config: .*" + message):
        RunSettings.from_run_config(config)


def test_good_partitioner_configs_parse():
    assert RunSettings.from_run_config({"partitioner": "pathological", "classes-per-client": 3}).classes == 3
    s = RunSettings.from_run_config({"partitioner": "iid", "samples-per-client": 0, "batch-size": 64})
    assert s.data.samples == 0 and s.data.partitioner == "iid" and s.num_partitions is None
    assert RunSettings.from_run_config({"partitioner": "dirichlet", "dirichlet-alpha": 2}).data.alpha == 2.0
