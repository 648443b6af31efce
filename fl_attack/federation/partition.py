"""Client partitions: which samples each client of a federation holds, and the server's own test set.

* The paper's partitions (``client_partition``, run config ``partitioner = "paper"``), as in the
  PI-SME / SME victim protocol: femnist one client per LEAF writer (femnist.py), cifar100 k-sample
  clients, optionally restricted to C classes (cifar.py). What femnist says holds for every dataset
  whose clients are writers (``DatasetSpec.writers``: femnist-digits), what cifar100 says for the
  others. ``server_test_set`` is the server's held-out test set, which no client gets.
* The partitioners of Flower Datasets (flwr_datasets: natural, iid, dirichlet, pathological), applied
  to a ``datasets.Dataset`` of the pool's indices and labels (``flower_client_partition``).

The ClientApp and the evaluator both go through ``load_client_split(DataSettings, partition_id)``.
The public names are re-exported by fl_attack.federation.data.
"""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass

import numpy as np

from fl_attack.federation.cifar import _cifar_client, _cifar_server_indices, _cifar_test_size
from fl_attack.federation.femnist import _femnist_client, _femnist_eligible, _femnist_server_indices, partition_writers
from fl_attack.federation.loading import load_pool
from fl_attack.federation.pools import ClientData, ClientSplit, Pool, _as_index, _check_args, _to_client, get_spec

# ---------------------------------------------------------------------------
# The paper's partitions
# ---------------------------------------------------------------------------


def num_partitions(pool: Pool, num_samples: int, classes: int | None = None, held_out: int = 0) -> int:
    """Number of clients ``client_partition`` accepts for this pool and k = ``num_samples``.

    * femnist: writers with >= k LEAF-train samples (a writer with fewer is not a client).
    * cifar100: ``(N - held_out) // (k + t)`` with t = max(1, k // 5) held-out samples, i.e. how many
      disjoint clients fit beside the server's ``held_out`` test samples (``server_test_set``). The
      same count bounds partition ids in class-restricted mode.

    Raises ValueError for num_samples < 1, classes outside 1..num_classes or classes for femnist.
    """
    spec, k, _, _ = _check_args(pool, num_samples, classes)
    if spec.writers:
        return int(len(_femnist_eligible(pool, k)[0]))
    return max(0, len(pool) - int(held_out)) // (k + _cifar_test_size(k, None))


def server_test_set(pool: Pool, num_samples: int, seed: int = 0) -> ClientData:
    """The server's own held-out test set, for centralised evaluation of the global model.

    * femnist: ``num_samples`` of the LEAF-test samples of all writers (drawn with
      ``default_rng(seed)``; all of them when there are fewer). No client trains on LEAF-test samples.
    * cifar100: the last ``num_samples`` images of the seed's permutation, the ones ``client_partition``
      never gives a client when called with ``held_out=num_samples`` (the federation does).

    Images float32 (n,C,H,W) in [0,1], labels int64 (n,), ``client_id`` "server-test".
    Raises ValueError for num_samples < 1 or more than the pool can hold out.
    """
    n = _as_index("num_samples", num_samples)
    if n < 1:
        raise ValueError(f"the server's test set needs num_samples >= 1, got {n}")
    if get_spec(pool.dataset).writers:
        idx = _femnist_server_indices(pool, n, seed)
    else:
        if n >= len(pool):
            raise ValueError(f"cannot hold out {n} of the {len(pool)} {pool.dataset} images for the server")
        idx = _cifar_server_indices(pool, n, seed)
    return _to_client(pool, idx, "server-test", -1)


def client_partition(
    pool: Pool,
    partition_id: int,
    num_samples: int,
    classes: int | None = None,
    seed: int = 0,
    test_samples: int | None = None,
    held_out: int = 0,
) -> ClientSplit:
    """Cut client ``partition_id``'s data from ``pool``: ``train`` exactly k = ``num_samples`` samples
    (the private set the attack targets) and ``test`` its held-out samples, disjoint from train.

    Images are float32 (n,C,H,W) in [0,1] (uint8/255; FEMNIST keeps LEAF's white background),
    labels int64 (n,). Deterministic in (pool, partition_id, num_samples, classes, seed, test_samples).

    * femnist (LEAF, Caldas et al. 2018): one client per writer. Eligible writers have >= k LEAF-train
      samples, ordered by writer name; ``partition_id`` indexes that list. Train = k of the writer's
      LEAF-train samples drawn with ``np.random.default_rng([seed, partition_id])``; test = the
      writer's LEAF-test samples (if none, its remaining train samples), at most ``test_samples``
      (drawn with the same generator) when given. ``client_id`` = writer name.
    * cifar100, ``classes`` None: a permutation of the pool by ``default_rng(seed)``; client p takes
      block ``[p*(k+t), p*(k+t)+k)`` as train and the next t as test, t = ``test_samples`` or
      max(1, k // 5). Clients with the same seed are disjoint.
    * cifar100, ``classes`` = C: client p picks C distinct classes present in the pool with
      ``default_rng([seed, p])`` and draws train then test samples from those classes only, without
      replacement, spread as evenly as possible over the C classes (a class with too few samples
      passes its share to the others; if C > k, only k classes appear in train). Test gets what the
      classes have left, up to t. Clients may overlap in this mode.
      ``client_id`` = "cifar100-client-<p>".
    * cifar100, ``held_out`` = H > 0: the H images of ``server_test_set(pool, H, seed)`` are never
      given to a client (unrestricted clients are unchanged, there are just fewer of them).

    Raises (ValueError, before any sampling): num_samples < 1; classes outside 1..num_classes or given
    for femnist; partition_id outside ``range(num_partitions(...))`` (for cifar100 with the given t);
    "client ... has only N samples, asked for k" when the pool or the chosen classes are too small;
    test_samples < 0. TypeError for non-integer counts.
    """
    spec, k, classes, test_samples = _check_args(pool, num_samples, classes, test_samples)
    p = _as_index("partition_id", partition_id)
    if spec.writers:
        return _femnist_client(pool, p, k, seed, test_samples)
    return _cifar_client(pool, p, k, classes, seed, test_samples, held_out)


# ---------------------------------------------------------------------------
# Flower Datasets partitioners
# ---------------------------------------------------------------------------

# "paper": client_partition above; the others are flwr_datasets' partitioners of the same names.
PARTITIONERS = ("paper", "natural", "iid", "dirichlet", "pathological")
# The smallest partition DirichletPartitioner accepts before it draws again (at most 10 more draws):
# the library's default, min_partition_size=10.
DIRICHLET_MIN_PARTITION_SIZE = 10


@dataclass(frozen=True)
class DataSettings:
    """How a federation's clients get their private data (run config: dataset, data-dir,
    samples-per-client, classes-per-client, seed, server-test-samples, partitioner, dirichlet-alpha)
    and the federation's partition count; :func:`load_client_split` cuts client p's data from it.

    * samples: k. partitioner "paper": k >= 1; a Flower partitioner: k >= 0, 0 = the whole partition.
    * data_dir: None for the bundled real sample (else what :func:`load_pool` reads).
    * classes: C. "paper": C classes per CIFAR-100 client; "pathological": num_classes_per_partition;
      None otherwise (unrestricted).
    * seed: the run's seed (the permutation, the partitioners' draws, each client's k-sample draw).
    * held_out: samples the server keeps for its own test set (:func:`server_test_set`).
    * partitioner: one of PARTITIONERS. alpha: the Dirichlet concentration (> 0; dirichlet only).
    * num_partitions: N, the federation's node count (num-supernodes in the simulation, the node
      config's num-partitions on the deployment engine): iid, dirichlet and pathological cut the
      data into N partitions; natural has one per writer (N of them are used); "paper" ignores it.
      None = not known; a Flower partitioner then raises ValueError.
    """

    dataset: str
    samples: int
    data_dir: str | None = None
    classes: int | None = None
    seed: int = 0
    held_out: int = 0
    partitioner: str = "paper"
    alpha: float = 0.5
    num_partitions: int | None = None

    @property
    def flower(self) -> bool:
        """True for the partitioners of Flower Datasets (every one but "paper")."""
        return self.partitioner != "paper"


def _client_indices(pool: Pool, held_out: int, seed: int) -> np.ndarray:
    """Pool indices a client may get, ascending: femnist LEAF-train samples (the server's test set
    is LEAF-test); cifar100 all but the server's ``held_out`` images (:func:`server_test_set`)."""
    if get_spec(pool.dataset).writers:
        return np.flatnonzero(pool.split == 0)
    keep = np.ones(len(pool), dtype=bool)
    keep[_cifar_server_indices(pool, int(held_out), seed)] = False
    return np.flatnonzero(keep)


def partition_dataset(pool: Pool, held_out: int = 0, seed: int = 0):
    """The ``datasets.Dataset`` the Flower partitioners cut: one row per sample a client may get,
    in pool order, without images (fast): ``index`` int64 (into ``pool``), ``label`` int64 in
    0..num_classes-1 and, for femnist, ``writer_id`` (str, the LEAF writer name).

    femnist rows are the LEAF-train samples; cifar100 rows all images but the ``held_out`` ones of
    ``server_test_set(pool, held_out, seed)``, so no client ever gets the server's test set.
    Raises ValueError for an unknown dataset."""
    from datasets import Dataset

    idx = _client_indices(pool, held_out, seed)
    columns = {"index": idx.astype(np.int64), "label": pool.labels[idx].astype(np.int64)}
    if get_spec(pool.dataset).writers:
        columns["writer_id"] = pool.writer_names[pool.writers[idx]].astype(str).tolist()
    return Dataset.from_dict(columns)


def flower_partitioner(
    partitioner: str, num_partitions: int | None = None, seed: int = 0, alpha: float = 0.5, classes: int | None = None
):
    """A fresh partitioner of Flower Datasets (flwr_datasets.partitioner, https://flower.ai/docs/datasets/)
    for the rows of :func:`partition_dataset`:

    * "natural": ``NaturalIdPartitioner(partition_by="writer_id")``: one partition per writer,
      partition ids in sorted writer-name order (femnist only; ``num_partitions`` unused).
    * "iid": ``IidPartitioner(num_partitions)``: contiguous shards of the (shuffled) rows; sizes
      differ by at most 1.
    * "dirichlet": ``DirichletPartitioner(num_partitions, partition_by="label", alpha,
      min_partition_size=DIRICHLET_MIN_PARTITION_SIZE, self_balancing=False, shuffle=True, seed)``:
      each class's samples split over the partitions in proportions drawn from Dir(alpha)
      (Hsu et al. 2019, "Measuring the effects of non-identical data distribution"; smaller alpha
      = more skewed).
    * "pathological": ``PathologicalPartitioner(num_partitions, partition_by="label",
      num_classes_per_partition=classes, class_assignment_mode="random", shuffle=True, seed)``:
      each partition gets exactly ``classes`` classes (McMahan et al. 2017's pathological non-IID
      split; Li et al. 2022).

    Raises ValueError for another partitioner, num_partitions < 1 (iid, dirichlet, pathological),
    alpha <= 0 (dirichlet) or classes < 1 (pathological)."""
    from flwr_datasets import partitioner as fp

    if partitioner == "natural":
        return fp.NaturalIdPartitioner(partition_by="writer_id")
    if partitioner not in PARTITIONERS or partitioner == "paper":
        raise ValueError(
            f"unknown Flower partitioner {partitioner!r}; choose one of {', '.join(p for p in PARTITIONERS[1:])}"
        )
    if num_partitions is None or _as_index("num_partitions", num_partitions) < 1:
        raise ValueError(f"the {partitioner} partitioner needs num_partitions >= 1, got {num_partitions}")
    if partitioner == "iid":
        return fp.IidPartitioner(num_partitions=num_partitions)
    if partitioner == "dirichlet":
        if not float(alpha) > 0:
            raise ValueError(f"the dirichlet partitioner needs alpha > 0, got {alpha}")
        return fp.DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=float(alpha),
            min_partition_size=DIRICHLET_MIN_PARTITION_SIZE,
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )
    if classes is None or _as_index("classes", classes) < 1:
        raise ValueError(f"the pathological partitioner needs classes >= 1 (classes-per-client), got {classes}")
    return fp.PathologicalPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        num_classes_per_partition=classes,
        class_assignment_mode="random",
        shuffle=True,
        seed=seed,
    )


@functools.lru_cache(maxsize=16)
def _flower_partitions(
    pool: Pool,
    partitioner: str,
    num_partitions: int | None,
    seed: int,
    alpha: float,
    classes: int | None,
    held_out: int,
) -> tuple[tuple[np.ndarray, ...], tuple[str, ...]]:
    spec = get_spec(pool.dataset)
    if partitioner == "natural" and not spec.writers:
        raise ValueError(
            f"the natural partitioner needs writer ids: femnist only (datasets of writers), not {spec.name}"
        )
    part = flower_partitioner(partitioner, num_partitions, seed=seed, alpha=alpha, classes=classes)
    # As FederatedDataset(shuffle=True, seed=seed) does before partitioning.
    part.dataset = partition_dataset(pool, held_out, seed).shuffle(seed=seed)
    try:
        # NaturalIdPartitioner reports its progress on stderr (tqdm): kept out of the clients' logs.
        with contextlib.redirect_stderr(io.StringIO()) if partitioner == "natural" else contextlib.nullcontext():
            count = part.num_partitions
            subsets = [part.load_partition(p) for p in range(count)]
    except ValueError as exc:
        raise ValueError(
            f"the {partitioner} partitioner cannot cut the {spec.name} data ({part.dataset.num_rows} client "
            f"samples) into {num_partitions if partitioner != 'natural' else 'writer'} partitions: {exc}"
        ) from None
    indices = []
    for subset in subsets:
        idx = np.asarray(subset.with_format("numpy")[:]["index"] if len(subset) else [], dtype=np.int64)
        idx.flags.writeable = False
        indices.append(idx)
    if partitioner == "natural":
        names = tuple(str(part.partition_id_to_natural_id[p]) for p in range(count))
    else:
        names = tuple(f"{spec.name}-{partitioner}-{p}" for p in range(count))
    return tuple(indices), names


def flower_partitions(
    pool: Pool,
    partitioner: str,
    num_partitions: int | None = None,
    seed: int = 0,
    alpha: float = 0.5,
    classes: int | None = None,
    held_out: int = 0,
) -> list[np.ndarray]:
    """Every partition of ``pool`` by a Flower partitioner (:func:`flower_partitioner`): a list of
    read-only int64 arrays of pool indices, one per partition id (natural: one per writer with LEAF-
    train samples; else ``num_partitions`` of them), each in the partitioner's order.

    The partitioner runs on :func:`partition_dataset` shuffled with ``seed`` (as FederatedDataset
    does), and draws with ``seed``: same arguments, same partitions. Partitions are disjoint and
    never hold the server's test set (femnist LEAF-test, cifar100 ``held_out``). Cached per pool.
    Raises ValueError for bad arguments, natural for cifar100, or when the library cannot cut
    the data (e.g. dirichlet's partitions stay below DIRICHLET_MIN_PARTITION_SIZE, or pathological
    needs a class in more partitions than it has samples)."""
    data = DataSettings(pool.dataset, 0, None, classes, seed, held_out, partitioner, alpha, num_partitions)
    return list(_flower_partitions(pool, *_flower_args(data))[0])


def _flower_args(data: DataSettings) -> tuple:
    """The cache key of :func:`_flower_partitions` for ``data`` (what does not matter normalised away)."""
    if data.partitioner not in PARTITIONERS or not data.flower:
        raise ValueError(
            f"unknown Flower partitioner {data.partitioner!r}; choose one of {', '.join(PARTITIONERS[1:])}"
        )
    natural = data.partitioner == "natural"
    if not natural and data.num_partitions is None:
        raise ValueError(
            f"the {data.partitioner} partitioner needs the federation's number of partitions (num_partitions: "
            "num-supernodes, or the node config's num-partitions); none was given"
        )
    return (
        data.partitioner,
        None if natural else _as_index("num_partitions", data.num_partitions),
        _as_index("seed", data.seed),
        float(data.alpha) if data.partitioner == "dirichlet" else 0.5,
        _as_index("classes", data.classes) if data.partitioner == "pathological" and data.classes is not None else None,
        _as_index("held_out", data.held_out),
    )


def partition_sizes(data: DataSettings, pool: Pool | None = None) -> np.ndarray:
    """int64 (P,): the whole size of each partition 0..P-1 of a Flower partitioner (P = num_partitions,
    natural: the writers with LEAF-train samples), what a client with samples-per-client = 0 trains on.
    ``pool``: an already loaded pool (default ``load_pool(data.dataset, data.data_dir)``).
    Raises ValueError for partitioner "paper" (its clients have k samples each, see
    :func:`num_partitions`) and as :func:`flower_partitions`."""
    if not data.flower:
        raise ValueError("partition_sizes is for the Flower partitioners; 'paper' clients have samples-per-client each")
    pool = load_pool(data.dataset, data.data_dir) if pool is None else pool
    indices, _ = _flower_partitions(pool, *_flower_args(data))
    return np.array([len(i) for i in indices], dtype=np.int64)


def flower_client_partition(data: DataSettings, partition_id: int, pool: Pool | None = None) -> ClientSplit:
    """Client ``partition_id``'s data from a Flower partitioner (``data.partitioner``, see
    :func:`flower_partitioner` and :func:`flower_partitions`): partition p has n samples.

    * k = ``data.samples`` > 0: train = k samples of the partition drawn without replacement with
      ``np.random.default_rng([seed, p])``; test = the next of that draw, the rest of the partition,
      at most max(1, n // 5) samples (empty when k = n).
    * k = 0: train = the whole partition (in the partitioner's order), as a real Flower client has
      it; test is empty (the ClientApp then evaluates on the train set).

    Images float32 (n,C,H,W) in [0,1], labels int64 (n,), like :func:`client_partition`.
    ``client_id``: the writer name for natural (e.g. "f0014_19"), else "<dataset>-<partitioner>-<p>"
    (e.g. "cifar100-dirichlet-3"); ``partition_id`` = p. Deterministic in (data, pool).
    Raises ValueError: p outside 0..P-1; "partition p has only n samples, asked for k"; an empty
    partition with k = 0; and as :func:`flower_partitions`.
    """
    pool = load_pool(data.dataset, data.data_dir) if pool is None else pool
    k = _as_index("num_samples", data.samples)
    p = _as_index("partition_id", partition_id)
    if k < 0:
        raise ValueError(f"num_samples must be >= 0 (0 = the whole partition), got {k}")
    indices, names = _flower_partitions(pool, *_flower_args(data))
    if not 0 <= p < len(indices):
        raise ValueError(
            f"partition {p} out of range: the {data.partitioner} partitioner made {len(indices)} partitions"
        )
    own, n = indices[p], len(indices[p])
    if k > n:
        raise ValueError(f"partition {p} has only {n} samples, asked for {k} ({data.partitioner} partitioner)")
    if n == 0:
        raise ValueError(f"partition {p} has no samples ({data.partitioner} partitioner)")
    if k == 0:
        train_idx, test_idx = own, own[:0]
    else:
        order = np.random.default_rng([data.seed, p]).permutation(n)
        train_idx = own[order[:k]]
        test_idx = own[order[k : k + max(1, n // 5)]]
    name = names[p]
    return ClientSplit(_to_client(pool, train_idx, name, p), _to_client(pool, test_idx, name, p))


def load_client_split(data: DataSettings, partition_id: int, pool: Pool | None = None) -> ClientSplit:
    """Client ``partition_id``'s private training set and held-out samples under ``data``: the one
    way the ClientApp (clients/client_app.py) and the evaluator (fl_attack.evaluation.victims.private_samples,
    replay) get a client's data, so both always see the same samples.

    partitioner "paper": :func:`client_partition` (k samples, classes, seed, held_out), unchanged;
    any other: :func:`flower_client_partition`. ``pool``: an already loaded pool (default
    ``load_pool(data.dataset, data.data_dir)``). Raises ValueError / FileNotFoundError as those do,
    and for an unknown partitioner.
    """
    if data.partitioner not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {data.partitioner!r}; choose one of {', '.join(PARTITIONERS)}")
    pool = load_pool(data.dataset, data.data_dir) if pool is None else pool
    if not data.flower:
        return client_partition(pool, partition_id, data.samples, data.classes, seed=data.seed, held_out=data.held_out)
    return flower_client_partition(data, partition_id, pool)


def run_writers(data: DataSettings, pool: Pool | None = None) -> tuple[str, ...]:
    """The LEAF writer names (sorted) whose samples a federation's clients hold: every writer with a
    sample in partitions 0..N-1 (N = ``data.num_partitions``) as :func:`load_client_split` cuts them,
    train and held-out samples alike. For keeping the evaluator's public data apart from the run's
    writers (fl_attack.evaluation.verdict).

    * partitioner "paper": the writers of partitions 0..N-1 (:func:`partition_writers`).
    * "natural": the first N writers by name with LEAF-train samples (one partition each).
    * iid, dirichlet, pathological: every writer with a sample in one of the N partitions (these
      mix writers, so with all of the LEAF-train samples cut up, every writer that has one).

    cifar100: () (a CIFAR-100 client has no writer). ``pool``: an already loaded pool (default
    ``load_pool(data.dataset, data.data_dir)``). Raises ValueError when femnist's N is None ("the
    federation's number of partitions is not known") and as :func:`partition_writers` /
    :func:`flower_partitions`."""
    spec = get_spec(data.dataset)
    if not spec.writers:
        return ()
    if data.num_partitions is None:
        raise ValueError("run_writers: the federation's number of partitions is not known (num_partitions=None)")
    n = _as_index("num_partitions", data.num_partitions)
    pool = load_pool(data.dataset, data.data_dir) if pool is None else pool
    if not data.flower:
        ids = partition_writers(pool, data.samples)[:n]
    else:
        indices, _ = _flower_partitions(pool, *_flower_args(data))
        parts = [np.asarray(i, dtype=np.int64) for i in indices[:n]]
        ids = np.unique(pool.writers[np.concatenate(parts)]) if parts else np.empty(0, dtype=np.int64)
    return tuple(sorted(str(name) for name in pool.writer_names[ids]))
