"""FEMNIST (LEAF, Caldas et al. 2018): reading LEAF's JSON shards, and cutting one client per writer.

1x28x28 handwriting, 62 classes. LEAF's convention is kept throughout: 255 (1.0) = white background,
ink dark. A client is one LEAF writer with >= k LEAF-train samples (writers ordered by name); the
server's own test set is drawn from the LEAF-test samples, which no client trains on. The public
entry points are re-exported by fl_attack.federation.data; ``client_partition`` (partition.py) calls
``_femnist_client`` for femnist pools.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fl_attack.federation.pools import ClientSplit, DatasetSpec, Pool, _check_args, _to_client, register_dataset


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


def _femnist_eligible(pool: Pool, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Writer indices with >= k LEAF-train samples, ordered by writer name; and all train counts."""
    counts = np.bincount(pool.writers[pool.split == 0], minlength=len(pool.writer_names))
    eligible = np.flatnonzero(counts >= k)
    order = np.argsort(pool.writer_names[eligible], kind="stable")
    return eligible[order], counts


def partition_writers(pool: Pool, num_samples: int) -> np.ndarray:
    """FEMNIST (any ``writers`` dataset): the writer index (into ``pool.writer_names``) of each client partition of k =
    ``num_samples``: partition p is writer ``partition_writers(pool, k)[p]``. For keeping a public
    pool disjoint from a federation's writers. ValueError for a non-FEMNIST pool or k < 1."""
    spec, k, _, _ = _check_args(pool, num_samples, None)
    if not spec.writers:
        raise ValueError(f"partition_writers is for femnist pools (one client per writer), not {spec.name}")
    return _femnist_eligible(pool, k)[0]


def _femnist_server_indices(pool: Pool, n: int, seed: int) -> np.ndarray:
    """The server's test set (``server_test_set``): ``n`` of the LEAF-test samples of all writers, drawn
    with ``default_rng(seed)`` (all of them when there are fewer), ascending. ValueError when the pool
    has no LEAF-test samples."""
    candidates = np.flatnonzero(pool.split == 1)
    if candidates.size == 0:
        raise ValueError("the femnist data has no LEAF-test samples to hold out for the server")
    return np.sort(np.random.default_rng(seed).choice(candidates, size=min(n, candidates.size), replace=False))


def _femnist_client(pool: Pool, p: int, k: int, seed: int, test_samples: int | None) -> ClientSplit:
    """Writer-client ``p`` of ``client_partition`` (arguments already checked): k of the writer's
    LEAF-train samples drawn with ``default_rng([seed, p])``; test = its LEAF-test samples (if none, its
    remaining train samples), at most ``test_samples`` (same generator). ValueError: p out of range."""
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


def _model(**kwargs):
    """The paper's FemnistCNN (fl_attack.federation.models; imported here, on first use: torch stays unloaded
    until a model is built)."""
    from fl_attack.federation.models import FemnistCNN

    return FemnistCNN(**kwargs)


FEMNIST = register_dataset(
    DatasetSpec(
        name="femnist",
        image_shape=(1, 28, 28),
        num_classes=62,
        mean=(0.9642,),
        std=(0.1577,),
        psnr_recovered_db=20.0,
        writers=True,
        background=1.0,
        hflip=False,
        sample="femnist_sample.npz",
        read_dir=load_femnist_leaf,
        model=_model,
        reader_epochs=40,
        reader_crop_pad=2,
        prior_steps=1800,
    )
)
