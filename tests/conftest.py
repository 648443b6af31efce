"""Shared fixtures."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from fl_attack.federation.data import load_bundled

# --- two workers on two cores (make test: pytest -n 2 --dist loadgroup, pytest-xdist) ------------------


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the tests that start flwr, Ray or other processes (marked ``runtime``) run one
    after another on one worker: two Ray heads or two SuperLinks on one machine contend for the same
    ports (Ray's dashboard agent, 52365). Every other test goes with its module, so a module-scoped fixture
    is built once."""
    if not hasattr(config, "workerinput"):  # not an xdist worker
        return
    for item in items:
        group = "runtime" if item.get_closest_marker("runtime") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_worker():
    """Two workers on two cores: each worker's torch takes one thread (a test that asks for more sets
    them itself), so the workers do not oversubscribe the cores."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    yield


# --- standard on-disk formats, written from the real bundled sample ------------------------------


def write_femnist_leaf(root: Path, groups: dict[str, list[list[int]]]) -> np.ndarray:
    """Write the bundled FEMNIST writers as a LEAF directory (root/train/*.json, root/test/*.json).

    ``groups[split]`` is one list of writer indices per JSON file. Returns the bundled-pool sample
    indices in the order the loader reads them back (train files, then test files)."""
    pool = load_bundled("femnist")
    order: list[np.ndarray] = []
    for split_id, split in enumerate(("train", "test")):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i, writers in enumerate(groups.get(split, [])):
            shard = {"users": [], "num_samples": [], "user_data": {}}
            for w in writers:
                idx = np.flatnonzero((pool.writers == w) & (pool.split == split_id))
                name = str(pool.writer_names[w])
                shard["users"].append(name)
                shard["num_samples"].append(int(idx.size))
                # LEAF stores pixel/255 as floats, row-major 28x28 (1.0 = white)
                x = (pool.images[idx].reshape(-1, 784).astype(np.float64) / 255.0).tolist()
                shard["user_data"][name] = {"x": x, "y": pool.labels[idx].tolist()}
                order.append(idx)
            path = root / split / f"all_data_{i}_niid_05_keep_0_{split}_9.json"
            path.write_text(json.dumps(shard))
    return np.concatenate(order)


def write_cifar100_pickles(root: Path, train_idx: np.ndarray, test_idx: np.ndarray) -> Path:
    """Write bundled CIFAR-100 images as torchvision's root/cifar-100-python/{train,test,meta}."""
    pool = load_bundled("cifar100")
    names = np.load(
        Path(__file__).resolve().parents[1] / "fl_attack" / "assets" / "cifar100_sample.npz",
        allow_pickle=False,
    )["class_names"]
    base = root / "cifar-100-python"
    base.mkdir(parents=True, exist_ok=True)
    for split, idx in (("train", train_idx), ("test", test_idx)):
        entry = {
            b"filenames": [f"img_{i}.png".encode() for i in idx],
            b"batch_label": f"{split}ing batch 1 of 1".encode(),
            b"fine_labels": pool.labels[idx].tolist(),
            # channel-major rows: 1024 R, 1024 G, 1024 B
            b"data": np.ascontiguousarray(pool.images[idx].transpose(0, 3, 1, 2)).reshape(len(idx), 3072),
        }
        with open(base / split, "wb") as f:
            pickle.dump(entry, f, protocol=2)
    with open(base / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [str(n).encode() for n in names]}, f, protocol=2)
    return base


@pytest.fixture(scope="session")
def femnist_leaf_dir(tmp_path_factory):
    """A LEAF FEMNIST directory with 4 real writers (2 eligible at k=50 in two train shards, one
    test-only writer). Returns (root, bundled-pool indices in loader order)."""
    pool = load_bundled("femnist")
    train_counts = np.bincount(pool.writers[pool.split == 0], minlength=len(pool.writer_names))
    big = np.flatnonzero(train_counts >= 50)[:3]
    test_only = np.flatnonzero(train_counts == 0)[0]
    root = tmp_path_factory.mktemp("femnist_leaf")
    groups = {
        "train": [[int(big[1]), int(big[0])], [int(big[2])]],
        "test": [[int(big[0]), int(test_only)], [int(big[2]), int(big[1])]],
    }
    return root, write_femnist_leaf(root, groups)


@pytest.fixture(scope="session")
def cifar100_pickle_dir(tmp_path_factory):
    """torchvision's cifar-100-python/ with 300 train and 100 test real images.
    Returns (root, train indices, test indices) into the bundled pool."""
    perm = np.random.default_rng(123).permutation(3000)
    root = tmp_path_factory.mktemp("cifar")
    write_cifar100_pickles(root, perm[:300], perm[300:400])
    return root, perm[:300], perm[300:400]
