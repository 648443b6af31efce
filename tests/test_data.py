"""fl_attack.federation.data: loaders of the standard formats, specs and client partitions, on real data."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_attack.federation import data as D
from fl_attack.federation.data import (
    DATASETS,
    Pool,
    client_partition,
    get_spec,
    load_bundled,
    load_cifar100_pickles,
    load_femnist_leaf,
    load_pool,
    num_partitions,
)

ASSETS = Path(D.__file__).resolve().parents[1] / "assets"


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


def rows(images: np.ndarray) -> Counter:
    return Counter(bytes(r) for r in images.reshape(len(images), -1))


# --- bundled sample --------------------------------------------------------------------------------


def test_bundled_sizes(femnist, cifar):
    assert femnist.dataset == "femnist"
    assert femnist.images.shape == (18796, 28, 28) and femnist.images.dtype == np.uint8
    assert femnist.labels.dtype == np.int64 and femnist.labels.min() == 0 and femnist.labels.max() == 61
    assert len(femnist.writer_names) == 184 and len(np.unique(femnist.writers)) == 184
    assert femnist.writers.dtype == np.int64 and set(np.unique(femnist.split)) == {0, 1}
    assert str(femnist.writer_names[0]) == "f0014_19"
    # LEAF convention: white background, so the mean pixel is close to the normalisation mean
    assert abs(femnist.images.mean() / 255 - get_spec("femnist").mean[0]) < 0.01

    assert cifar.images.shape == (3000, 32, 32, 3) and cifar.images.dtype == np.uint8
    assert np.array_equal(np.bincount(cifar.labels), np.full(100, 30))
    assert cifar.writers is None and cifar.writer_names is None and cifar.split is None
    np.testing.assert_allclose((cifar.images / 255).mean((0, 1, 2)), get_spec("cifar100").mean, atol=0.01)


def test_load_pool_caches_and_is_read_only(femnist):
    assert load_pool("femnist") is femnist
    assert load_pool("FEMNIST", "") is femnist
    with pytest.raises(ValueError, match="read-only"):
        femnist.images[0, 0, 0] = 0
    # an .npz in the bundled format, cached by resolved path
    a = load_pool("cifar100", ASSETS / "cifar100_sample.npz")
    assert load_pool("cifar100", str(ASSETS / "." / "cifar100_sample.npz")) is a
    assert np.array_equal(a.images, load_bundled("cifar100").images)


# --- standard on-disk formats ----------------------------------------------------------------------


def test_femnist_leaf_round_trip(femnist, femnist_leaf_dir):
    root, idx = femnist_leaf_dir
    pool = load_femnist_leaf(root)
    assert np.array_equal(pool.images, femnist.images[idx])  # exact uint8 round trip via x/255
    assert np.array_equal(pool.labels, femnist.labels[idx])
    assert np.array_equal(pool.split, femnist.split[idx])
    assert np.array_equal(pool.writer_names[pool.writers], femnist.writer_names[femnist.writers[idx]])
    assert list(pool.writer_names) == sorted(pool.writer_names) and len(pool.writer_names) == 4
    # partitions of the loaded directory match those of the bundled pool for the same writer
    assert num_partitions(pool, 50) == 3
    a, b = client_partition(pool, 1, 50, seed=3), client_partition(femnist, 1, 50, seed=3)
    assert a.train.client_id == b.train.client_id == "f1521_17"
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.train.labels, b.train.labels)
    assert rows(to_uint8(a.test.images)) == rows(to_uint8(b.test.images))
    # load_pool reads a directory too
    assert np.array_equal(load_pool("femnist", root).images, pool.images)


def test_femnist_leaf_flat_directory_is_train_only(femnist, femnist_leaf_dir):
    root, idx = femnist_leaf_dir
    pool = load_femnist_leaf(root / "train")
    n_train = int((femnist.split[idx] == 0).sum())
    assert len(pool) == n_train and not pool.split.any()
    assert np.array_equal(pool.images, femnist.images[idx[:n_train]])


def test_cifar100_pickle_round_trip(cifar, cifar100_pickle_dir):
    root, train_idx, test_idx = cifar100_pickle_dir
    train = load_cifar100_pickles(root)
    assert np.array_equal(train.images, cifar.images[train_idx])
    assert np.array_equal(train.labels, cifar.labels[train_idx]) and train.labels.dtype == np.int64
    test = load_cifar100_pickles(root / "cifar-100-python", train=False)  # the inner dir works too
    assert np.array_equal(test.images, cifar.images[test_idx])
    assert np.array_equal(test.labels, cifar.labels[test_idx])
    assert np.array_equal(load_pool("cifar100", root).images, train.images)


def test_missing_data_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"FEMNIST LEAF directory not found: .*train/\*\.json"):
        load_femnist_leaf(tmp_path / "nope")
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match="FEMNIST LEAF directory not found"):
        load_femnist_leaf(tmp_path)  # exists, but no json
    with pytest.raises(FileNotFoundError, match="CIFAR-100 pickles not found"):
        load_cifar100_pickles(tmp_path)
    with pytest.raises(FileNotFoundError, match="CIFAR-100 pickles not found"):
        load_pool("cifar100", tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="npz file not found"):
        load_pool("femnist", tmp_path / "x.npz")


# --- specs -----------------------------------------------------------------------------------------


def test_specs():
    assert sorted(DATASETS) == ["cifar100", "femnist", "femnist-digits"]
    f, c = get_spec("femnist"), get_spec("cifar100")
    assert (f.image_shape, f.num_classes, f.mean, f.std) == ((1, 28, 28), 62, (0.9642,), (0.1577,))
    assert (c.image_shape, c.num_classes) == ((3, 32, 32), 100)
    assert c.mean == (0.5071, 0.4866, 0.4409) and c.std == (0.2673, 0.2564, 0.2762)
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; choose one of: cifar100, femnist"):
        get_spec("mnist")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_pool("mnist")


@pytest.mark.parametrize("name", ["femnist", "cifar100"])
def test_normalize_round_trip_and_pixel_box(name):
    spec = get_spec(name)
    x = torch.rand((4, *spec.image_shape), generator=torch.Generator().manual_seed(0))
    z = spec.normalize(x)
    mean = torch.tensor(spec.mean).view(1, -1, 1, 1)
    std = torch.tensor(spec.std).view(1, -1, 1, 1)
    torch.testing.assert_close(z, (x - mean) / std)
    torch.testing.assert_close(spec.denormalize(z), x, atol=1e-6, rtol=0)
    torch.testing.assert_close(spec.normalize(x[0]), z[0])  # unbatched (C,H,W)
    lo, hi = spec.pixel_box()
    assert lo.shape == hi.shape == (1, spec.image_shape[0], 1, 1) and lo.dtype == torch.float32
    torch.testing.assert_close(lo, -mean / std)
    torch.testing.assert_close(hi, (1 - mean) / std)
    torch.testing.assert_close(spec.normalize(torch.zeros(1, *spec.image_shape)), lo.expand(1, *spec.image_shape))
    # denormalize does not clamp
    assert spec.denormalize(hi + 1.0).min() > 1.0
    with pytest.raises(ValueError, match="expected images"):
        spec.normalize(torch.rand(2, 2, 8, 8))


def test_pixel_box_femnist_values():
    lo, hi = get_spec("femnist").pixel_box()
    assert lo.item() == pytest.approx(-0.9642 / 0.1577) and hi.item() == pytest.approx(0.0358 / 0.1577)


# --- FEMNIST partitions ----------------------------------------------------------------------------


def test_femnist_partition_is_one_writer(femnist):
    train_counts = np.bincount(femnist.writers[femnist.split == 0], minlength=184)
    eligible = sorted(str(n) for n in femnist.writer_names[train_counts >= 50])
    assert num_partitions(femnist, 50) == len(eligible) == 100
    assert num_partitions(femnist, 100) == 97
    for p in (0, 57, 99):
        s = client_partition(femnist, p, 50, seed=7)
        tr, te = s.train, s.test
        assert tr.client_id == te.client_id == eligible[p] and tr.partition_id == p
        assert tr.images.shape == (50, 1, 28, 28) and tr.images.dtype == torch.float32
        assert tr.labels.shape == (50,) and tr.labels.dtype == torch.int64
        assert 0 <= tr.images.min() and tr.images.max() <= 1 and tr.images.mean() > 0.8  # white background
        w = int(np.flatnonzero(femnist.writer_names == eligible[p])[0])
        own_train = femnist.images[(femnist.writers == w) & (femnist.split == 0)]
        own_test = femnist.images[(femnist.writers == w) & (femnist.split == 1)]
        # train: 50 of the writer's LEAF-train samples; test: exactly its LEAF-test samples
        assert not rows(to_uint8(tr.images)) - rows(own_train)
        assert rows(to_uint8(te.images)) == rows(own_test)
        # labels travel with their images
        mine = femnist.writers == w
        pairs = Counter((bytes(i.reshape(-1)), int(y)) for i, y in zip(femnist.images[mine], femnist.labels[mine]))
        got = Counter((bytes(i.reshape(-1)), int(y)) for i, y in zip(to_uint8(tr.images), tr.labels))
        assert not got - pairs


def test_femnist_partition_deterministic(femnist):
    a, b = client_partition(femnist, 3, 50, seed=1), client_partition(femnist, 3, 50, seed=1)
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.train.labels, b.train.labels)
    c = client_partition(femnist, 3, 50, seed=2)
    assert not torch.equal(a.train.images, c.train.images)
    assert torch.equal(a.test.images, c.test.images)  # LEAF test set does not depend on the seed
    assert len(client_partition(femnist, 3, 50, test_samples=5).test) == 5


def test_femnist_writer_without_leaf_test_uses_remaining_train(femnist):
    keep = femnist.split == 0  # drop every LEAF-test sample
    pool = Pool(
        "femnist",
        femnist.images[keep],
        femnist.labels[keep],
        femnist.writers[keep],
        femnist.writer_names,
        femnist.split[keep],
    )
    s = client_partition(pool, 0, 50, seed=0)
    w = int(np.flatnonzero(pool.writer_names == s.train.client_id)[0])
    own = pool.images[pool.writers == w]
    assert len(s.train) + len(s.test) == len(own)
    # together train and test are exactly the writer's samples, hence disjoint
    assert rows(to_uint8(s.train.images)) + rows(to_uint8(s.test.images)) == rows(own)


# --- CIFAR-100 partitions --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _where(cifar: Pool) -> dict[bytes, int]:
    where = {bytes(r): i for i, r in enumerate(cifar.images.reshape(len(cifar), -1))}
    assert len(where) == len(cifar)  # the sample's images are unique
    return where


def pool_index(cifar, images: torch.Tensor) -> np.ndarray:
    where = _where(cifar)
    return np.array([where[bytes(r)] for r in to_uint8(images).reshape(len(images), -1)])


def test_cifar_partitions_disjoint(cifar):
    assert num_partitions(cifar, 50) == 3000 // 60
    seen: list[np.ndarray] = []
    for p in range(num_partitions(cifar, 50)):
        s = client_partition(cifar, p, 50, seed=4)
        assert s.train.images.shape == (50, 3, 32, 32) and s.test.images.shape == (10, 3, 32, 32)
        assert s.train.images.dtype == torch.float32 and s.train.labels.dtype == torch.int64
        assert 0 <= s.train.images.min() and s.train.images.max() <= 1
        assert s.train.client_id == f"cifar100-client-{p}" and s.test.partition_id == p
        ti, vi = pool_index(cifar, s.train.images), pool_index(cifar, s.test.images)
        assert np.array_equal(cifar.labels[ti], s.train.labels.numpy())
        assert np.array_equal(cifar.labels[vi], s.test.labels.numpy())
        seen += [ti, vi]
    allidx = np.concatenate(seen)
    assert len(np.unique(allidx)) == len(allidx) == 3000  # disjoint, and 50 x 60 covers the sample
    # custom held-out size
    assert len(client_partition(cifar, 0, 50, test_samples=25).test) == 25


def test_cifar_partition_deterministic(cifar):
    a, b = client_partition(cifar, 5, 50, seed=9), client_partition(cifar, 5, 50, seed=9)
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.test.labels, b.test.labels)
    assert not torch.equal(a.train.images, client_partition(cifar, 5, 50, seed=10).train.images)


@pytest.mark.parametrize("classes", [1, 3, 5, 50])
def test_cifar_class_restriction(cifar, classes):
    k = 25 if classes == 1 else 50
    s = client_partition(cifar, 2, k, classes=classes, seed=0)
    assert len(s.train) == k and len(s.test) == max(1, k // 5)
    labels, counts = np.unique(s.train.labels.numpy(), return_counts=True)
    assert len(labels) == classes
    assert counts.max() - counts.min() <= 1  # spread evenly
    assert set(s.test.labels.tolist()) <= set(labels.tolist())
    ti, vi = pool_index(cifar, s.train.images), pool_index(cifar, s.test.images)
    assert len(np.unique(np.concatenate([ti, vi]))) == len(ti) + len(vi)  # train/test disjoint
    again = client_partition(cifar, 2, k, classes=classes, seed=0)
    assert torch.equal(again.train.images, s.train.images)
    other = client_partition(cifar, 3, k, classes=classes, seed=0)
    assert set(other.train.labels.tolist()) != set(labels.tolist())


# --- errors ----------------------------------------------------------------------------------------


def test_partition_errors(femnist, cifar):
    with pytest.raises(
        ValueError, match="partition 100 out of range: femnist data has 100 writers with >= 50 training samples"
    ):
        client_partition(femnist, 100, 50)
    with pytest.raises(ValueError, match="partition -1 out of range"):
        client_partition(femnist, -1, 50)
    with pytest.raises(ValueError, match="partition 0 out of range: femnist data has 0 writers with >= 1000"):
        client_partition(femnist, 0, 1000)
    with pytest.raises(ValueError, match="partition 50 out of range: cifar100 data .* has 50 clients of 50 train"):
        client_partition(cifar, 50, 50)
    for pool in (femnist, cifar):
        with pytest.raises(ValueError, match="num_samples must be >= 1, got 0"):
            client_partition(pool, 0, 0)
        with pytest.raises(ValueError, match="num_samples must be >= 1"):
            num_partitions(pool, -3)
    with pytest.raises(ValueError, match="classes is only supported for cifar100"):
        client_partition(femnist, 0, 50, classes=5)
    with pytest.raises(ValueError, match="classes is only supported for cifar100"):
        num_partitions(femnist, 50, classes=5)
    for bad in (0, 101):
        with pytest.raises(ValueError, match=rf"classes must be in 1\.\.100 for cifar100, got {bad}"):
            client_partition(cifar, 0, 50, classes=bad)
    with pytest.raises(ValueError, match="client cifar100-client-0 has only 30 samples in its 1 classes, asked for 50"):
        client_partition(cifar, 0, 50, classes=1)
    with pytest.raises(ValueError, match="client cifar100-client-0 has only 3000 samples .*, asked for 5000"):
        client_partition(cifar, 0, 5000)
    with pytest.raises(ValueError, match="test_samples must be >= 0"):
        client_partition(cifar, 0, 50, test_samples=-1)
    with pytest.raises(TypeError, match="num_samples must be an integer"):
        client_partition(cifar, 0, 2.5)


def test_partition_writers_names_each_partitions_writer():
    from fl_attack.federation.data import partition_writers

    pool = load_pool("femnist")
    writers = partition_writers(pool, 10)
    for p in (0, 3, 7):
        split = client_partition(pool, p, 10, seed=0)
        assert split.train.client_id == pool.writer_names[writers[p]]
    with pytest.raises(ValueError, match="for femnist pools"):
        partition_writers(load_pool("cifar100"), 10)
