"""Loading a dataset pool from wherever it lives: the bundled sample, an ``.npz``, a directory written by
``datasets``' ``save_to_disk``, or the dataset's own format (``DatasetSpec.read_dir``: a LEAF FEMNIST
directory, femnist.py; CIFAR-100's pickles, cifar.py); a dataset with its own ``DatasetSpec.load``
(a subset of another's pool, femnist_digits.py) is made by it.

``load_pool`` (cached in-process, arrays read-only) is the one entry point the partitions use; the
public names are re-exported by fl_attack.federation.data.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fl_attack.federation.pools import DatasetSpec, Pool, get_spec
from fl_attack.paths import asset


def _load_npz(dataset: str, path: Path) -> Pool:
    """A pool from an .npz in the bundled format (see fl_attack/assets/README.md)."""
    if not path.is_file():
        raise FileNotFoundError(f"{dataset} .npz file not found: {path}")
    writers = get_spec(dataset).writers
    with np.load(path, allow_pickle=False) as z:
        need = ["images", "labels"] + (["writer_ids", "writer_names", "split"] if writers else [])
        missing = [k for k in need if k not in z.files]
        if missing:
            raise ValueError(f"{path}: missing arrays {missing} for a {dataset} pool")
        if writers:
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
        parts = [(0, loaded["train"])] + ([(1, loaded["test"])] if spec.writers and "test" in loaded else [])
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
    if not spec.writers:
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
    spec = get_spec(dataset)
    if spec.load is not None:
        pool = spec.load(source)
    elif source is None:
        pool = _load_npz(dataset, asset(spec.sample))
    else:
        path = Path(source)
        if path.suffix == ".npz":
            pool = _load_npz(dataset, path)
        elif _is_saved_dataset(path):
            pool = load_saved_dataset(dataset, path)
        elif spec.read_dir is not None:
            pool = spec.read_dir(path)
        else:
            raise FileNotFoundError(f"{path}: {dataset} reads an .npz or a save_to_disk directory only")
    # Shared across callers: make the arrays immutable.
    for arr in (pool.images, pool.labels, pool.writers, pool.writer_names, pool.split):
        if arr is not None:
            arr.flags.writeable = False
    return pool


def load_bundled(dataset: str) -> Pool:
    """The real sample shipped in ``fl_attack/assets`` (provenance in its README.md).

    femnist: 184 LEAF writers, 18,796 samples (LEAF train and test splits);
    cifar100: 3,000 CIFAR-100 training images, 30 per class; femnist-digits: the 12,555 digit samples
    of the femnist sample. Cached; arrays are read-only.
    Raises ValueError for an unknown dataset."""
    return _cached_pool(get_spec(dataset).name, None)


def load_pool(dataset: str, data_dir: str | Path | None = None) -> Pool:
    """Load a dataset pool, cached in-process by (dataset, resolved path).

    * ``data_dir`` None or "": the bundled sample (:func:`load_bundled`).
    * a ``.npz`` file in the bundled format.
    * a directory written by ``datasets.Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``):
      :func:`load_saved_dataset`.
    * the dataset's own format (``DatasetSpec.read_dir``): femnist a LEAF directory
      (:func:`load_femnist_leaf`), cifar100 torchvision's pickles, training file
      (:func:`load_cifar100_pickles`).
    * a dataset with its own ``DatasetSpec.load`` (femnist-digits: what femnist reads, its digits).

    Returned arrays are read-only (the pool is shared by every caller). Raises ValueError for an
    unknown dataset, FileNotFoundError when the data is missing.
    """
    name = get_spec(dataset).name
    if data_dir is None or str(data_dir) == "":
        return _cached_pool(name, None)
    return _cached_pool(name, str(Path(data_dir).expanduser().resolve()))
