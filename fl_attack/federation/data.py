"""Datasets, loaders and client partitions for the federated simulation.

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
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import operator
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fl_attack.paths import asset

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
]

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"


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


def _is_saved_dataset(path: Path) -> bool:
    """A directory written by ``datasets`` ``save_to_disk``: a Dataset (state.json, dataset_info.json)
    or a DatasetDict (dataset_dict.json)."""
    return path.is_dir() and (
        (path / "dataset_dict.json").is_file()
        or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file())
    )


def _saved_images(spec: DatasetSpec, path: Path, column) -> np.ndarray:
    """The ``image`` column of a saved dataset as uint8 (N,28,28) (femnist) or (N,32,32,3) (cifar100)."""
    c, h, w = spec.image_shape
    want = (h, w) if c == 1 else (h, w, c)
    if len(column) == 0:
        return np.empty((0, *want), dtype=np.uint8)
    if isinstance(column, np.ndarray) and column.dtype != object:
        images, shapes = column, {column.shape[1:]}
    else:
        shapes = {np.shape(x) for x in column}
        images = np.stack([np.asarray(x) for x in column]) if len(shapes) == 1 else None
    if images is not None and c == 1 and images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]  # (N,28,28,1) -> (N,28,28)
    if images is None or images.shape[1:] != want:
        found = ", ".join(sorted(str(s) for s in shapes)[:3])
        raise ValueError(
            f"{path}: images of shape {found}, but dataset={spec.name!r} needs {want} per image "
            f"({'grayscale' if c == 1 else 'RGB'}); set dataset to the one the saved data holds"
        )
    if np.issubdtype(images.dtype, np.floating):
        if not np.isfinite(images).all() or images.min() < 0 or images.max() > 1:
            raise ValueError(f"{path}: float images must lie in [0,1] (value = pixel/255)")
        return np.rint(images * 255.0).astype(np.uint8)
    if not np.issubdtype(images.dtype, np.integer) or images.min() < 0 or images.max() > 255:
        raise ValueError(f"{path}: images must be uint8 pixels in 0..255 (or floats in [0,1]), got {images.dtype}")
    return images.astype(np.uint8)


def _nested_list_images(part) -> np.ndarray | None:
    """The ``image`` column of a saved Dataset when it holds nested lists of numbers of one shape
    (what ``Dataset.from_dict`` makes of arrays), read straight from Arrow: (N, ...) in the stored
    dtype. None for anything else (PIL images, ragged or missing values): the caller decodes those."""
    import pyarrow as pa

    if part._indices is not None:  # a selection or shuffle: materialise the rows in order
        part = part.flatten_indices()
    arr = part.data.column("image").combine_chunks()
    shape = [len(arr)]
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            return None
        lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
        if lengths.size and (lengths != lengths[0]).any():
            return None
        shape.append(int(lengths[0]) if lengths.size else 0)
        arr = arr.flatten()
    if len(shape) == 1 or arr.null_count or not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return None
    return arr.to_numpy(zero_copy_only=False).reshape(shape)


def load_saved_dataset(dataset: str, root: str | Path) -> Pool:
    """Read a Hugging Face ``datasets`` directory written by ``Dataset.save_to_disk`` (or
    ``DatasetDict.save_to_disk``) into a uint8 :class:`Pool`, with ``datasets.load_from_disk``.

    Columns: ``image`` (PIL images or arrays: (28,28) or (28,28,1) grayscale for femnist, (32,32,3)
    RGB for cifar100; uint8 pixels 0..255, or floats in [0,1] read as pixel/255) and ``label`` (int
    class ids, 0..61 femnist, 0..99 cifar100). femnist also reads ``writer_id`` (str or int, the LEAF
    writer); without it every sample belongs to one writer "unknown", so the paper's and the natural
    partitioner see a single client. FEMNIST images keep the LEAF convention (255 = white background).

    Splits: a plain Dataset is all training data (femnist: LEAF train, so the server's test set
    needs a test split or server-test-samples = 0). A DatasetDict needs a ``train`` split;
    femnist reads ``test`` as its LEAF-test samples (the server's test pool), cifar100 ignores
    the other splits, as with torchvision's pickles (:func:`load_cifar100_pickles`, train file).

    The saved dataset's name is not checked against ``dataset`` (``save_to_disk`` of a
    ``Dataset.from_dict`` records none, and hub names vary): its image shape and label range are.
    Raises ValueError naming the directory for a missing column or split, images of another
    shape than ``dataset`` needs, or labels outside the dataset's classes; FileNotFoundError when
    it is not a saved dataset directory.
    """
    import datasets

    spec = get_spec(dataset)
    root = Path(root).expanduser()
    if not _is_saved_dataset(root):
        raise FileNotFoundError(
            f"{root} is not a directory written by datasets' save_to_disk "
            "(no dataset_dict.json, or state.json and dataset_info.json)"
        )
    loaded = datasets.load_from_disk(str(root))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ValueError(f"{root}: a saved DatasetDict needs a 'train' split, found {sorted(loaded)}")
        parts = [(0, loaded["train"])] + ([(1, loaded["test"])] if spec.name == "femnist" and "test" in loaded else [])
    else:
        parts = [(0, loaded)]
    images, labels, writers, splits = [], [], [], []
    for split_id, part in parts:
        missing = [c for c in ("image", "label") if c not in part.column_names]
        if missing:
            raise ValueError(
                f"{root}: the saved dataset has columns {part.column_names}; it needs 'image' and 'label' "
                f"(missing {missing})"
            )
        listed = _nested_list_images(part)  # fast; the numpy formatter is slow on nested lists
        rows = part.with_format("numpy", columns=[c for c in part.column_names if c != "image" or listed is None])[:]
        images.append(_saved_images(spec, root, rows["image"] if listed is None else listed))
        label = np.asarray(rows["label"])
        if label.size and not np.issubdtype(label.dtype, np.integer):
            raise ValueError(f"{root}: labels must be integer class ids, got {label.dtype}")
        labels.append(label.astype(np.int64))
        if "writer_id" in part.column_names:
            writers.append(np.asarray(rows["writer_id"]).astype(str))
        else:
            writers.append(np.full(len(label), "unknown"))
        splits.append(np.full(len(label), split_id, dtype=np.int8))
    labels_all = np.concatenate(labels)
    if labels_all.size and (labels_all.min() < 0 or labels_all.max() >= spec.num_classes):
        raise ValueError(
            f"{root}: labels in {labels_all.min()}..{labels_all.max()}, but dataset={spec.name!r} has "
            f"classes 0..{spec.num_classes - 1}; set dataset to the one the saved data holds"
        )
    if spec.name != "femnist":
        return Pool(dataset=spec.name, images=np.concatenate(images), labels=labels_all)
    names = np.concatenate(writers)
    writer_names, writer_ids = np.unique(names, return_inverse=True)
    return Pool(
        dataset=spec.name,
        images=np.concatenate(images),
        labels=labels_all,
        writers=writer_ids.astype(np.int64),
        writer_names=writer_names,
        split=np.concatenate(splits),
    )


@functools.lru_cache(maxsize=8)
def _cached_pool(dataset: str, source: str | None) -> Pool:
    if source is None:
        pool = _load_npz(dataset, asset(f"{dataset}_sample.npz"))
    else:
        path = Path(source)
        if path.suffix == ".npz":
            pool = _load_npz(dataset, path)
        elif _is_saved_dataset(path):
            pool = load_saved_dataset(dataset, path)
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
    * a directory written by ``datasets.Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``):
      :func:`load_saved_dataset`.
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
    if get_spec(pool.dataset).name == "femnist":
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
    if get_spec(pool.dataset).name == "femnist":
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
    if partitioner == "natural" and spec.name != "femnist":
        raise ValueError(f"the natural partitioner needs writer ids: femnist only, not {spec.name}")
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
    way the ClientApp (clients/client_app.py) and the evaluator (fl_attack.audit.victims.private_samples,
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
    writers (fl_attack.audit.verdict).

    * partitioner "paper": the writers of partitions 0..N-1 (:func:`partition_writers`).
    * "natural": the first N writers by name with LEAF-train samples (one partition each).
    * iid, dirichlet, pathological: every writer with a sample in one of the N partitions (these
      mix writers, so with all of the LEAF-train samples cut up, every writer that has one).

    cifar100: () (a CIFAR-100 client has no writer). ``pool``: an already loaded pool (default
    ``load_pool(data.dataset, data.data_dir)``). Raises ValueError when femnist's N is None ("the
    federation's number of partitions is not known") and as :func:`partition_writers` /
    :func:`flower_partitions`."""
    spec = get_spec(data.dataset)
    if spec.name != "femnist":
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
