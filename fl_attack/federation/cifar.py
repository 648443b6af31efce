"""CIFAR-100 (Krizhevsky 2009): reading torchvision's pickles, and cutting k-sample clients from a pool.

3x32x32 RGB, 100 fine classes. A client is k samples (plus t held-out ones) cut from a seeded
permutation of the pool, or, restricted to C classes, drawn from C classes the client picks; the
server's own test set is the permutation's last samples, never given to a client. The public entry
points are re-exported by fl_attack.federation.data; ``client_partition`` (partition.py) calls
``_cifar_client`` for cifar100 pools.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from fl_attack.federation.pools import ClientSplit, DatasetSpec, Pool, _to_client, register_dataset


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


def _cifar_test_size(k: int, test_samples: int | None) -> int:
    """t, a client's held-out samples: ``test_samples``, or max(1, k // 5) when None."""
    return max(1, k // 5) if test_samples is None else test_samples


def _cifar_server_indices(pool: Pool, held_out: int, seed: int) -> np.ndarray:
    """The last ``held_out`` entries of the seed's permutation: reserved for the server."""
    return (
        np.random.default_rng(seed).permutation(len(pool))[len(pool) - held_out :]
        if held_out
        else np.empty(0, dtype=np.int64)
    )


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


def _cifar_client(
    pool: Pool, p: int, k: int, classes: int | None, seed: int, test_samples: int | None, held_out: int
) -> ClientSplit:
    """Client ``p`` of ``client_partition`` for a cifar100 pool (arguments already checked): block p of
    the ``default_rng(seed)`` permutation (``classes`` None), or k + t samples of C = ``classes`` classes
    drawn with ``default_rng([seed, p])``; never the server's ``held_out`` images. ValueError: p out of
    range, or too few samples in the pool or the chosen classes."""
    n = len(pool)
    t = _cifar_test_size(k, test_samples)
    cid = f"{pool.dataset}-client-{p}"
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


def _model(**kwargs):
    """The paper's CifarCNN (fl_attack.federation.models; imported here, on first use: torch stays unloaded
    until a model is built)."""
    from fl_attack.federation.models import CifarCNN

    return CifarCNN(**kwargs)


CIFAR100 = register_dataset(
    DatasetSpec(
        name="cifar100",
        image_shape=(3, 32, 32),
        num_classes=100,
        mean=(0.5071, 0.4866, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
        psnr_recovered_db=19.0,
        writers=False,
        background=0.0,
        hflip=True,
        sample="cifar100_sample.npz",
        read_dir=lambda root: load_cifar100_pickles(root, train=True),
        model=_model,
        reader_epochs=17,
        reader_source="cifar100_train29513.npz",
        prior_steps=1500,
    )
)
