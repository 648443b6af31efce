"""Datasets, loaders and client partitions for the federated simulation.

Two datasets, as in the PI-SME / SME victim protocol:

* FEMNIST (LEAF, Caldas et al. 2018): 1x28x28 handwriting, 62 classes, one client per writer.
  LEAF convention is kept throughout: 255 (1.0) = white background, ink dark.
* CIFAR-100 (Krizhevsky 2009): 3x32x32 RGB, 100 fine classes, k-sample clients cut from a pool.

Pools hold a whole dataset as uint8 arrays; ``client_partition`` cuts one client's private
training set (exactly k samples) plus held-out samples and returns float32 NCHW tensors in [0,1].
Normalisation (``DatasetSpec.normalize``) is applied by the model side, not here.
"""

from __future__ import annotations

import functools
import json
import operator
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .paths import asset

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
]

ASSETS_DIR = Path(__file__).resolve().parent / "assets"


# ---------------------------------------------------------------------------
# Dataset specs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """Static description of a dataset: shape, classes and input normalisation.

    ``mean``/``std`` are the per-channel statistics of the paper protocol (docs/PISME.md,
    "Input normalisation"): CIFAR-100 (0.5071, 0.4866, 0.4409) / (0.2673, 0.2564, 0.2762);
    FEMNIST in LEAF format (white background, x/255) 0.9642 / 0.1577.
    """

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def _stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if not torch.is_floating_point(x):
            raise TypeError(f"{self.name}: expected a floating-point tensor, got {x.dtype}")
        c = self.image_shape[0]
        if x.dim() < 3 or x.shape[-3] != c:
            raise ValueError(f"{self.name}: expected images (N,{c},H,W) or ({c},H,W), got shape {tuple(x.shape)}")
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(c, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(c, 1, 1)
        return mean, std

    def normalize(self, images: Tensor) -> Tensor:
        """Map images in [0,1], (N,C,H,W) or (C,H,W), to ``(images - mean) / std`` (same shape,
        dtype and device). Raises TypeError for non-float input, ValueError for a wrong channel count."""
        mean, std = self._stats(images)
        return (images - mean) / std

    def denormalize(self, x: Tensor) -> Tensor:
        """Inverse of :meth:`normalize`: ``x * std + mean``. No clamping, so values of a
        reconstruction may fall outside [0,1]."""
        mean, std = self._stats(x)
        return x * std + mean

    def pixel_box(self) -> tuple[Tensor, Tensor]:
        """Per-channel bounds ``(lo, hi)`` of valid normalised pixels: the normalised values of 0 and 1.

        Each is a float32 CPU tensor of shape (1,C,1,1); e.g. FEMNIST lo = -0.9642/0.1577 = -6.114,
        hi = 0.0358/0.1577 = 0.227."""
        mean = torch.tensor(self.mean, dtype=torch.float32)
        std = torch.tensor(self.std, dtype=torch.float32)
        lo = ((0.0 - mean) / std).view(1, -1, 1, 1)
        hi = ((1.0 - mean) / std).view(1, -1, 1, 1)
        return lo, hi


DATASETS: dict[str, DatasetSpec] = {
    "femnist": DatasetSpec(
        name="femnist",
        image_shape=(1, 28, 28),
        num_classes=62,
        mean=(0.9642,),
        std=(0.1577,),
    ),
    "cifar100": DatasetSpec(
        name="cifar100",
        image_shape=(3, 32, 32),
        num_classes=100,
        mean=(0.5071, 0.4866, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
    ),
}


def get_spec(name: str) -> DatasetSpec:
    """Return the :class:`DatasetSpec` for ``name`` ("femnist" or "cifar100", case-insensitive).

    Raises ValueError("unknown dataset 'x'; choose one of: cifar100, femnist")."""
    spec = DATASETS.get(str(name).strip().lower())
    if spec is None:
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(sorted(DATASETS))}")
    return spec


# ---------------------------------------------------------------------------
# Containers
# ---------------------------------------------------------------------------


# eq=False on the containers below: fields are arrays/tensors, so the generated __eq__ would be
# ambiguous; identity equality keeps them hashable (usable as cache keys).
@dataclass(frozen=True, eq=False)
class ClientData:
    """One client's samples: ``images`` float32 (k,C,H,W) in [0,1], ``labels`` int64 (k,).

    ``client_id`` is the LEAF writer name for FEMNIST (e.g. "f0014_19") and
    "cifar100-client-<p>" for CIFAR-100; ``partition_id`` is the index passed to
    :func:`client_partition`."""

    images: Tensor
    labels: Tensor
    client_id: str
    partition_id: int

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True, eq=False)
class ClientSplit:
    """A client's private training set (exactly k samples, the attack's target) and its held-out
    samples (Flower evaluate; empty only when the client has none)."""

    train: ClientData
    test: ClientData


@dataclass(frozen=True, eq=False)
class Pool:
    """A whole dataset in memory.

    * ``images``: uint8, (N,28,28) for FEMNIST (LEAF convention, 255 = white background),
      (N,32,32,3) RGB NHWC for CIFAR-100.
    * ``labels``: int64 (N,).
    * ``writers``: FEMNIST int64 (N,) index into ``writer_names``; CIFAR-100 None.
    * ``writer_names``: FEMNIST str (W,) LEAF writer ids; CIFAR-100 None.
    * ``split``: FEMNIST int8 (N,), 0 = LEAF train, 1 = LEAF test; CIFAR-100 None.

    Pools returned by the loaders of this module are cached and their arrays are read-only.
    Raises ValueError on inconsistent arrays.
    """

    dataset: str
    images: np.ndarray
    labels: np.ndarray
    writers: np.ndarray | None = None
    writer_names: np.ndarray | None = None
    split: np.ndarray | None = None

    def __post_init__(self) -> None:
        spec = get_spec(self.dataset)
        c, h, w = spec.image_shape
        want = (h, w) if c == 1 else (h, w, c)
        n = self.labels.shape[0] if self.labels.ndim == 1 else -1
        if self.images.dtype != np.uint8 or self.images.shape != (n, *want):
            raise ValueError(
                f"{spec.name} pool: expected uint8 images (N,{','.join(map(str, want))}) and int64 "
                f"labels (N,), got {self.images.dtype} {self.images.shape} and labels {self.labels.shape}"
            )
        if self.labels.dtype != np.int64:
            raise ValueError(f"{spec.name} pool: labels must be int64, got {self.labels.dtype}")
        if n and (self.labels.min() < 0 or self.labels.max() >= spec.num_classes):
            raise ValueError(f"{spec.name} pool: labels outside 0..{spec.num_classes - 1}")
        if spec.name == "femnist":
            if self.writers is None or self.writer_names is None or self.split is None:
                raise ValueError("femnist pool needs writers, writer_names and split")
            if self.writers.shape != (n,) or self.split.shape != (n,):
                raise ValueError("femnist pool: writers and split must have shape (N,)")
            if n and (self.writers.min() < 0 or self.writers.max() >= len(self.writer_names)):
                raise ValueError("femnist pool: writer index outside writer_names")

    def __len__(self) -> int:
        return int(self.labels.shape[0])


# ---------------------------------------------------------------------------
# Loaders for the standard on-disk formats
# ---------------------------------------------------------------------------


def _leaf_json_files(root: Path) -> tuple[list[Path], list[Path]]:
    train = sorted((root / "train").glob("*.json")) if (root / "train").is_dir() else []
    test = sorted((root / "test").glob("*.json")) if (root / "test").is_dir() else []
    if not train and not test and root.is_dir():
        train = sorted(root.glob("*.json"))  # a bare directory of shards: all LEAF train
    return train, test


def load_femnist_leaf(root: str | Path) -> Pool:
    """Read a LEAF FEMNIST directory (LEAF, Caldas et al. 2018) into a uint8 :class:`Pool`.

    Layout: ``root/train/*.json`` and ``root/test/*.json`` as written by LEAF's ``preprocess.sh``
    (either may be absent, not both); a directory holding the JSON shards itself is read as
    LEAF train only. Each file is ``{"users": [...], "num_samples": [...], "user_data":
    {user: {"x": [[784 floats in [0,1]], ...], "y": [int, ...]}}}``, x row-major 28x28 with
    value = pixel/255 (1.0 = white); pixels come back as ``round(x*255)``.

    Samples are ordered train files then test files (each sorted by file name), users in each
    file's ``users`` order. ``writer_names`` is the sorted set of users.

    Raises FileNotFoundError when the directory or its JSON files are missing, ValueError for
    malformed records or no samples.
    """
    root = Path(root).expanduser()
    train_files, test_files = _leaf_json_files(root)
    if not train_files and not test_files:
        raise FileNotFoundError(
            f"FEMNIST LEAF directory not found: {root} (expected train/*.json and test/*.json "
            "as written by LEAF's preprocess.sh, or a directory of LEAF JSON shards)"
        )

    images: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    users: list[str] = []  # one entry per block, aligned with images/labels
    splits: list[int] = []
    for split_id, files in ((0, train_files), (1, test_files)):
        for path in files:
            with open(path, encoding="utf-8") as f:
                shard = json.load(f)
            try:
                user_data = shard["user_data"]
                order = shard.get("users") or list(user_data)
            except (TypeError, KeyError) as e:
                raise ValueError(f"{path}: not a LEAF JSON file (missing 'user_data')") from e
            for user in order:
                rec = user_data[user]
                x = np.asarray(rec["x"], dtype=np.float64)
                y = np.asarray(rec["y"], dtype=np.int64)
                if x.size == 0:
                    continue
                if x.ndim != 2 or x.shape[1] != 28 * 28 or y.shape != (x.shape[0],):
                    raise ValueError(
                        f"{path}: user {user!r} has x of shape {x.shape} and y of shape {y.shape}, "
                        "expected (n, 784) and (n,)"
                    )
                px = np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)
                images.append(px.reshape(-1, 28, 28))
                labels.append(y)
                users.append(str(user))
                splits.append(split_id)
            del shard

    if not images:
        raise ValueError(f"FEMNIST LEAF directory {root} holds no samples")
    writer_names = np.array(sorted(set(users)))
    index = {name: i for i, name in enumerate(writer_names.tolist())}
    sizes = [len(b) for b in labels]
    return Pool(
        dataset="femnist",
        images=np.concatenate(images),
        labels=np.concatenate(labels),
        writers=np.repeat(np.array([index[u] for u in users], dtype=np.int64), sizes),
        writer_names=writer_names,
        split=np.repeat(np.array(splits, dtype=np.int8), sizes),
    )


def _cifar_dir(root: Path) -> Path:
    if (root / "cifar-100-python").is_dir():
        return root / "cifar-100-python"
    return root


def load_cifar100_pickles(root: str | Path, train: bool = True) -> Pool:
    """Read CIFAR-100 (Krizhevsky 2009) from torchvision's on-disk layout into a uint8 :class:`Pool`.

    ``root/cifar-100-python/{train,test,meta}`` (or ``root`` being ``cifar-100-python`` itself),
    as written by ``torchvision.datasets.CIFAR100(root, download=True)``. The pickle holds
    ``b"data"`` (N,3072) uint8, channel-major (1024 R, 1024 G, 1024 B, each row-major 32x32) and
    ``b"fine_labels"``; images come back as (N,32,32,3) RGB, labels int64 0..99.
    ``train`` selects the ``train`` (50,000) or ``test`` (10,000) file. Only open trusted files:
    this unpickles.

    Raises FileNotFoundError when the file is missing, ValueError for malformed contents.
    """
    root = Path(root).expanduser()
    path = _cifar_dir(root) / ("train" if train else "test")
    if not path.is_file():
        raise FileNotFoundError(
            f"CIFAR-100 pickles not found: {path} (expected torchvision's layout "
            f"<root>/cifar-100-python/{{train,test,meta}} under {root})"
        )
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="bytes")

    def get(key: str):
        for k in (key.encode(), key):
            if k in entry:
                return entry[k]
        raise ValueError(f"{path}: missing key {key!r}; not a CIFAR-100 python pickle")

    data = np.asarray(get("data"), dtype=np.uint8)
    labels = np.asarray(get("fine_labels"), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: data {data.shape} / fine_labels {labels.shape}, expected (N,3072) / (N,)")
    images = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return Pool(dataset="cifar100", images=images, labels=labels)


def _load_npz(dataset: str, path: Path) -> Pool:
    """A pool from an .npz in the bundled format (see fl_attack/assets/README.md)."""
    if not path.is_file():
        raise FileNotFoundError(f"{dataset} .npz file not found: {path}")
    with np.load(path, allow_pickle=False) as z:
        need = ["images", "labels"] + (["writer_ids", "writer_names", "split"] if dataset == "femnist" else [])
        missing = [k for k in need if k not in z.files]
        if missing:
            raise ValueError(f"{path}: missing arrays {missing} for a {dataset} pool")
        if dataset == "femnist":
            return Pool(
                dataset=dataset,
                images=z["images"],
                labels=z["labels"].astype(np.int64, copy=False),
                writers=z["writer_ids"].astype(np.int64, copy=False),
                writer_names=z["writer_names"].astype(str),
                split=z["split"].astype(np.int8, copy=False),
            )
        return Pool(dataset=dataset, images=z["images"], labels=z["labels"].astype(np.int64, copy=False))


@functools.lru_cache(maxsize=8)
def _cached_pool(dataset: str, source: str | None) -> Pool:
    if source is None:
        pool = _load_npz(dataset, asset(f"{dataset}_sample.npz"))
    else:
        path = Path(source)
        if path.suffix == ".npz":
            pool = _load_npz(dataset, path)
        elif dataset == "femnist":
            pool = load_femnist_leaf(path)
        else:
            pool = load_cifar100_pickles(path, train=True)
    # Shared across callers: make the arrays immutable.
    for arr in (pool.images, pool.labels, pool.writers, pool.writer_names, pool.split):
        if arr is not None:
            arr.flags.writeable = False
    return pool


def load_bundled(dataset: str) -> Pool:
    """The real sample shipped in ``fl_attack/assets`` (provenance in its README.md).

    femnist: 184 LEAF writers, 18,796 samples (LEAF train and test splits);
    cifar100: 3,000 CIFAR-100 training images, 30 per class. Cached; arrays are read-only.
    Raises ValueError for an unknown dataset."""
    return _cached_pool(get_spec(dataset).name, None)


def load_pool(dataset: str, data_dir: str | Path | None = None) -> Pool:
    """Load a dataset pool, cached in-process by (dataset, resolved path).

    * ``data_dir`` None or "": the bundled sample (:func:`load_bundled`).
    * a ``.npz`` file in the bundled format.
    * femnist: a LEAF directory (:func:`load_femnist_leaf`).
    * cifar100: torchvision's pickles, training file (:func:`load_cifar100_pickles`).

    Returned arrays are read-only (the pool is shared by every caller). Raises ValueError for an
    unknown dataset, FileNotFoundError when the data is missing.
    """
    name = get_spec(dataset).name
    if data_dir is None or str(data_dir) == "":
        return _cached_pool(name, None)
    return _cached_pool(name, str(Path(data_dir).expanduser().resolve()))


# ---------------------------------------------------------------------------
# Partitions
# ---------------------------------------------------------------------------


def _as_index(name: str, value) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def _check_args(pool: Pool, num_samples, classes, test_samples=None) -> tuple[DatasetSpec, int, int | None, int | None]:
    spec = get_spec(pool.dataset)
    k = _as_index("num_samples", num_samples)
    if k < 1:
        raise ValueError(f"num_samples must be >= 1, got {k}")
    if classes is not None:
        if spec.name == "femnist":
            raise ValueError(
                "classes is only supported for cifar100; a femnist client is one LEAF writer "
                "with that writer's own classes"
            )
        classes = _as_index("classes", classes)
        if not 1 <= classes <= spec.num_classes:
            raise ValueError(f"classes must be in 1..{spec.num_classes} for {spec.name}, got {classes}")
    if test_samples is not None:
        test_samples = _as_index("test_samples", test_samples)
        if test_samples < 0:
            raise ValueError(f"test_samples must be >= 0, got {test_samples}")
    return spec, k, classes, test_samples


def _femnist_eligible(pool: Pool, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Writer indices with >= k LEAF-train samples, ordered by writer name; and all train counts."""
    counts = np.bincount(pool.writers[pool.split == 0], minlength=len(pool.writer_names))
    eligible = np.flatnonzero(counts >= k)
    order = np.argsort(pool.writer_names[eligible], kind="stable")
    return eligible[order], counts


def partition_writers(pool: Pool, num_samples: int) -> np.ndarray:
    """FEMNIST: the writer index (into ``pool.writer_names``) of each client partition of k =
    ``num_samples``: partition p is writer ``partition_writers(pool, k)[p]``. For keeping a public
    pool disjoint from a federation's writers. ValueError for a non-FEMNIST pool or k < 1."""
    spec, k, _, _ = _check_args(pool, num_samples, None)
    if spec.name != "femnist":
        raise ValueError(f"partition_writers is for femnist pools (one client per writer), not {spec.name}")
    return _femnist_eligible(pool, k)[0]


def _cifar_test_size(k: int, test_samples: int | None) -> int:
    return max(1, k // 5) if test_samples is None else test_samples


def num_partitions(pool: Pool, num_samples: int, classes: int | None = None, held_out: int = 0) -> int:
    """Number of clients ``client_partition`` accepts for this pool and k = ``num_samples``.

    * femnist: writers with >= k LEAF-train samples (a writer with fewer is not a client).
    * cifar100: ``(N - held_out) // (k + t)`` with t = max(1, k // 5) held-out samples, i.e. how many
      disjoint clients fit beside the server's ``held_out`` test samples (``server_test_set``). The
      same count bounds partition ids in class-restricted mode.

    Raises ValueError for num_samples < 1, classes outside 1..num_classes or classes for femnist.
    """
    spec, k, _, _ = _check_args(pool, num_samples, classes)
    if spec.name == "femnist":
        return int(len(_femnist_eligible(pool, k)[0]))
    return max(0, len(pool) - int(held_out)) // (k + _cifar_test_size(k, None))


def _cifar_server_indices(pool: Pool, held_out: int, seed: int) -> np.ndarray:
    """The last ``held_out`` entries of the seed's permutation: reserved for the server."""
    return (
        np.random.default_rng(seed).permutation(len(pool))[len(pool) - held_out :]
        if held_out
        else np.empty(0, dtype=np.int64)
    )


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
    if get_spec(pool.dataset).name == "femnist":
        candidates = np.flatnonzero(pool.split == 1)
        if candidates.size == 0:
            raise ValueError("the femnist data has no LEAF-test samples to hold out for the server")
        idx = np.sort(np.random.default_rng(seed).choice(candidates, size=min(n, candidates.size), replace=False))
    else:
        if n >= len(pool):
            raise ValueError(f"cannot hold out {n} of the {len(pool)} cifar100 images for the server")
        idx = _cifar_server_indices(pool, n, seed)
    return _to_client(pool, idx, "server-test", -1)


def _to_client(pool: Pool, idx: np.ndarray, client_id: str, partition_id: int) -> ClientData:
    imgs = pool.images[idx]  # fancy indexing: a fresh, writable copy
    if imgs.ndim == 3:
        imgs = imgs[:, None, :, :]  # (k,28,28) -> (k,1,28,28)
    else:
        imgs = imgs.transpose(0, 3, 1, 2)  # NHWC -> NCHW
    images = torch.from_numpy(np.ascontiguousarray(imgs)).to(torch.float32).div_(255.0)
    labels = torch.from_numpy(pool.labels[idx].astype(np.int64))
    return ClientData(images=images, labels=labels, client_id=client_id, partition_id=partition_id)


def _spread(total: int, caps: np.ndarray) -> np.ndarray:
    """Split ``total`` over bins as evenly as possible, bin i holding at most caps[i] (sum(caps) >= total).
    Leftover units go to the first bins."""
    counts = np.zeros_like(caps)
    remaining = total
    while remaining > 0:
        free = np.flatnonzero(counts < caps)
        share, extra = divmod(remaining, free.size)
        add = np.full(free.size, share, dtype=caps.dtype)
        add[:extra] += 1
        add = np.minimum(add, caps[free] - counts[free])
        counts[free] += add
        remaining -= int(add.sum())
    return counts


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

    if spec.name == "femnist":
        eligible, counts = _femnist_eligible(pool, k)
        if not 0 <= p < len(eligible):
            raise ValueError(
                f"partition {p} out of range: femnist data has {len(eligible)} writers with "
                f">= {k} training samples (the largest writer has {int(counts.max(initial=0))})"
            )
        writer = int(eligible[p])
        name = str(pool.writer_names[writer])
        rng = np.random.default_rng([seed, p])
        own = pool.writers == writer
        train_pool = np.flatnonzero(own & (pool.split == 0))
        train_idx = rng.choice(train_pool, size=k, replace=False)
        test_idx = np.flatnonzero(own & (pool.split == 1))
        if test_idx.size == 0:
            test_idx = np.setdiff1d(train_pool, train_idx)
        if test_samples is not None and test_samples < test_idx.size:
            test_idx = rng.choice(test_idx, size=test_samples, replace=False)
        return ClientSplit(_to_client(pool, train_idx, name, p), _to_client(pool, test_idx, name, p))

    # cifar100
    n = len(pool)
    t = _cifar_test_size(k, test_samples)
    cid = f"cifar100-client-{p}"
    if n < k:
        raise ValueError(f"client {cid} has only {n} samples (the whole cifar100 pool), asked for {k}")
    count = max(0, n - int(held_out)) // (k + t)
    if not 0 <= p < count:
        raise ValueError(
            f"partition {p} out of range: cifar100 data ({n} images) has {count} clients of "
            f"{k} train + {t} test samples"
        )

    if classes is None:
        perm = np.random.default_rng(seed).permutation(n)
        start = p * (k + t)
        train_idx, test_idx = perm[start : start + k], perm[start + k : start + k + t]
        return ClientSplit(_to_client(pool, train_idx, cid, p), _to_client(pool, test_idx, cid, p))

    present = np.unique(pool.labels)
    if classes > present.size:
        raise ValueError(f"classes={classes} but the cifar100 pool has only {present.size} classes")
    rng = np.random.default_rng([seed, p])
    chosen = rng.choice(present, size=classes, replace=False)
    reserved = _cifar_server_indices(pool, int(held_out), seed)
    members = [np.setdiff1d(np.flatnonzero(pool.labels == c), reserved) for c in chosen]
    caps = np.array([m.size for m in members], dtype=np.int64)
    if caps.sum() < k:
        raise ValueError(f"client {cid} has only {int(caps.sum())} samples in its {classes} classes, asked for {k}")
    n_train = _spread(k, caps)
    n_test = _spread(min(t, int(caps.sum()) - k), caps - n_train)
    train_parts, test_parts = [], []
    for m, a, b in zip(members, n_train, n_test):
        picked = rng.choice(m, size=int(a + b), replace=False)
        train_parts.append(picked[:a])
        test_parts.append(picked[a:])
    # Shuffle so the set is not grouped by class.
    train_idx = rng.permutation(np.concatenate(train_parts))
    test_idx = rng.permutation(np.concatenate(test_parts))
    return ClientSplit(_to_client(pool, train_idx, cid, p), _to_client(pool, test_idx, cid, p))
