"""The shipped reader classifiers (fl_attack.evaluation.reader): they load, their weights are the ones their sidecar
describes (SHA-256), they classify the bundled clients' images at the sidecar's recorded accuracy, and their
training sets are disjoint from the clients and the server's pool."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_attack.evaluation import reader
from fl_attack.federation.data import client_partition, get_spec, load_bundled, partition_writers

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _shared_source() -> Path:
    path = SHARED_DATA / reader.CIFAR100_SOURCE
    if not path.is_file():
        pytest.skip(f"shared offline data absent: {path}")
    return path


SUBSET = 4  # the accuracy test reads every 4th image of the sidecar's client set (660 femnist, 750 cifar100)
TOLERANCE = 0.03  # and finds the sidecar's accuracy within 3 points (measured: +0.3 femnist, +1.1 cifar100)


@pytest.mark.parametrize("dataset", ["femnist", "cifar100", "femnist-digits"])
def test_the_reader_classifies_the_bundled_clients_at_its_sidecars_accuracy(dataset):
    """The images the sidecar's ``client_accuracy`` was measured on (``bundled_client_set``: the first 20
    femnist writers' LEAF-train samples, none a reader writer; all 3,000 bundled cifar100 images), every
    4th: the shipped reader scores the recorded figure (0.898 femnist, 0.527 cifar100) within 3 points."""
    torch.manual_seed(0)
    spec = get_spec(dataset)
    model = reader.load_reader(dataset)
    assert reader.load_reader(dataset.upper()) is model  # cached per process
    assert not model.training
    images, labels, _ = reader.bundled_client_set(dataset)
    images = torch.from_numpy(np.array(images[::SUBSET])).float().div(255.0)
    images = images[:, None] if images.dim() == 3 else images.permute(0, 3, 1, 2)
    labels = torch.from_numpy(np.array(labels[::SUBSET]))
    with torch.no_grad():
        logits = model(images)
    assert logits.shape == (len(labels), spec.num_classes) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    accuracy = (logits.argmax(1) == labels).double().mean().item()
    recorded = reader.reader_info(dataset)["client_accuracy"]
    assert abs(accuracy - recorded) <= TOLERANCE, (accuracy, recorded)


@pytest.mark.parametrize("dataset", ["femnist", "cifar100", "femnist-digits"])
def test_the_shipped_weights_are_the_ones_the_sidecar_describes(dataset):
    """The weights file's SHA-256 and size are what training recorded in the sidecar beside its accuracies
    (``train_reader`` writes both), and the sidecar's command is the training module's."""
    info = reader.reader_info(dataset)
    weights = Path(reader.__file__).parents[1] / "assets" / f"reader_{dataset}.pt"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == info["weights_sha256"]
    assert weights.stat().st_size == info["weights_bytes"]
    assert info["command"].startswith(f"python -m fl_attack.evaluation.reader --dataset {dataset} ")


@pytest.mark.parametrize("dataset", ["femnist", "cifar100", "femnist-digits"])
def test_the_shipped_files_are_small_and_described(dataset):
    info = reader.reader_info(dataset)
    assert info["dataset"] == dataset
    for key in ("epochs", "seed", "wall_seconds", "torch_version", "val_accuracy", "client_accuracy", "training_set"):
        assert key in info, key
    assert info["training_set"]["train"] + info["training_set"]["validation"] == info["training_set"]["size"]
    assert 0.0 < info["val_accuracy"] <= 1.0 and 0.0 < info["client_accuracy"] <= 1.0
    weights = Path(reader.__file__).parents[1] / "assets" / f"reader_{dataset}.pt"
    assert weights.stat().st_size < 3_000_000
    params = sum(p.numel() for p in reader.load_reader(dataset).parameters())
    assert 200_000 <= params <= 1_500_000 and params == info["params"]


def test_the_reader_rejects_images_of_another_shape():
    model = reader.load_reader("femnist")
    with pytest.raises(ValueError, match=r"\(N,1,28,28\)"):
        model(torch.zeros(2, 3, 32, 32))
    with pytest.raises(TypeError):
        model(torch.zeros(2, 1, 28, 28, dtype=torch.uint8))


def test_a_missing_weights_file_is_one_clear_line(monkeypatch):
    def missing(name):
        raise FileNotFoundError(name)

    monkeypatch.setattr(reader, "asset", missing)
    reader._cached_reader.cache_clear()
    try:
        with pytest.raises(
            ValueError, match=r"reader_femnist\.pt.*python -m fl_attack\.evaluation\.reader --dataset femnist"
        ) as e:
            reader.load_reader("femnist")
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match=r"reader_cifar100\.json"):
            reader.reader_info("cifar100")
    finally:
        reader._cached_reader.cache_clear()
    with pytest.raises(ValueError, match="unknown dataset"):
        reader.load_reader("mnist")


def test_reader_writers_are_40_writers_with_leaf_train_samples_only():
    pool = load_bundled("femnist")
    names = reader.reader_writers()
    assert len(names) == 40 == len(set(names)) and list(names) == sorted(names)
    assert reader.reader_info("femnist")["reader_writers"] == list(names)
    index = {n: i for i, n in enumerate(pool.writer_names.tolist())}
    ids = np.array([index[n] for n in names])
    train_counts = np.bincount(pool.writers[pool.split == 0], minlength=len(pool.writer_names))
    assert (train_counts[ids] > 0).all()
    # the last 40 by name among the writers with LEAF-train samples
    with_train = sorted(pool.writer_names[train_counts > 0].tolist())
    assert list(names) == with_train[-40:]
    idx = reader.training_indices("femnist")
    assert idx.size == train_counts[ids].sum()
    assert set(np.unique(pool.writers[idx]).tolist()) == set(ids.tolist())
    assert (pool.split[idx] == 0).all()  # never a LEAF-test sample (the server's pool draws those)


def test_the_femnist_training_set_has_no_sample_of_the_first_clients():
    pool = load_bundled("femnist")
    idx = reader.training_indices("femnist")
    first = partition_writers(pool, 32)[:20]
    assert not np.isin(pool.writers[idx], first).any()
    assert not set(reader.reader_writers()) & {client_partition(pool, p, 32).train.client_id for p in range(20)}
    images, labels = reader.training_set("femnist")
    assert images.dtype == np.uint8 and images.shape == (idx.size, 28, 28) and labels.dtype == np.int64
    np.testing.assert_array_equal(images, pool.images[idx])
    np.testing.assert_array_equal(labels, pool.labels[idx])


def test_the_cifar100_training_set_has_no_bundled_image():
    source = _shared_source()
    images, labels = reader.training_set("cifar100", source.parent)
    assert images.dtype == np.uint8 and images.shape[1:] == (32, 32, 3) and labels.shape == (len(images),)
    bundled = {hashlib.sha256(x.tobytes()).digest() for x in load_bundled("cifar100").images}
    ours = {hashlib.sha256(x.tobytes()).digest() for x in images}
    assert not ours & bundled
    assert len(images) == reader.reader_info("cifar100")["training_set"]["size"]
    with np.load(source, allow_pickle=False) as z:
        assert len(images) + len(bundled) == len(z["labels"])  # the source holds every bundled image once


def test_the_cifar100_source_is_required():
    with pytest.raises(ValueError, match="cifar100_train29513.npz"):
        reader.training_indices("cifar100")


def test_augmentation_crops_within_the_padding_and_flips_cifar100_only():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 28, 28, generator=gen)
    out = reader._augment(x, 2, 1.0, False, gen)
    assert out.shape == x.shape
    # each image is its original shifted by at most 2 pixels, the border filled white (femnist background)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), value=1.0)
    for i in range(8):
        assert any(torch.equal(out[i], padded[i, :, a : a + 28, b : b + 28]) for a in range(5) for b in range(5))
    y = torch.rand(64, 3, 32, 32, generator=gen)
    flipped = reader._augment(y, 0, 0.0, True, gen)
    mirrored = [torch.equal(flipped[i], y[i].flip(2)) for i in range(64)]
    assert all(m or torch.equal(flipped[i], y[i]) for i, m in enumerate(mirrored)) and 0 < sum(mirrored) < 64
