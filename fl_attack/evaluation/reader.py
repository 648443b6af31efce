"""The "reader": an independent classifier per dataset, trained once and shipped small.

Over 600 lines on purpose: the training selection, the training and the fingerprint of what it
saw must stay one definition, or the shipped weights and fingerprints drift apart.

The evaluator scores a reconstructed image by whether the reader classifies it as the original's
class. The reader is trained on data disjoint from every client of the default (bundled) federation
and from the server's public pool, and its weights ship in ``fl_attack/assets``:
``reader_{dataset}.pt`` (the state dict of :class:`ReaderNet`) and ``reader_{dataset}.json`` (how it
was trained and what it scores; :func:`reader_info`).

Training sets (:func:`training_set`, deterministic):

* femnist: the LEAF-train samples (split 0 only, never a LEAF-test sample) of the last
  ``READER_WRITER_COUNT`` = 40 writers by name among the bundled pool's writers that have LEAF-train
  samples (:func:`reader_writers`). Clients are the eligible writers in name order and the server's
  public pool (``server_test_set``) draws LEAF-test samples only, so the reader shares no sample
  with the server and no writer with partitions 0..60 at k = 32 (0..57 at k = 100, 0..64 at k = 1):
  only a federation of more than ~60 FEMNIST clients reaches a writer the reader saw. The evaluator
  can tell by the client id (the writer name): ``client_id in reader_writers()``.
* cifar100: the 29,513 CIFAR-100 training images of the shared offline data
  (``cifar100_train29513.npz``) minus every image byte-equal to one of the bundled pool's 3,000
  (``load_bundled("cifar100")``, from which every client and the server's pool are cut): 26,513.

Train it with ``python -m fl_attack.evaluation.reader --dataset femnist|cifar100 --shared-data DIR`` (see
``--help``): 10% of the training set (seeded) is held out for validation; the sidecar records that
accuracy and the accuracy on the bundled pool's client images. The same command writes
``reader_{dataset}_train.npy``, a fingerprint of every training-set image (:func:`image_digests`,
sorted), so that the evaluator can tell when a client's image is one the reader trained on
(:func:`in_training_set`); ``--digests-only`` writes it alone, without training.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from fl_attack.federation.femnist import partition_writers
from fl_attack.federation.loading import load_bundled
from fl_attack.federation.pools import DATASETS, DatasetSpec, Pool, get_spec
from fl_attack.federation.update import save_torch_atomic
from fl_attack.paths import asset
from fl_attack.records import write_json_atomic

__all__ = [
    "READER_WRITER_COUNT",
    "CIFAR100_SOURCE",
    "ReaderNet",
    "load_reader",
    "reader_info",
    "reader_writers",
    "training_indices",
    "training_set",
    "bundled_client_set",
    "image_digests",
    "training_digests",
    "in_training_set",
    "write_training_digests",
    "refresh_training_digests",
    "accuracy",
    "train_reader",
    "main",
]

READER_WRITER_COUNT = 40  # femnist: the last writers by name (among those with LEAF-train samples)
CIFAR100_SOURCE = get_spec("cifar100").reader_source  # in the shared offline data folder (--shared-data)
WIDTHS = (48, 96, 192)  # channels of the three stages of ReaderNet
# The bundled-client images the sidecar's accuracy is measured on (femnist): the LEAF-train samples
# of the first 20 eligible writers at k = 32, none of them a reader writer.
FEMNIST_CLIENT_WRITERS, FEMNIST_CLIENT_K = 20, 32
VAL_FRACTION = 0.1
DEGRADED = 0.5  # the fraction of each training batch seen through ``_degrade``
ASSETS = Path(__file__).resolve().parents[1] / "assets"
DIGEST_BYTES = 8  # blake2b digest of one image's 8-bit pixels: 2^-64 per pair to collide


def _command(dataset: str) -> str:
    return f"python -m fl_attack.evaluation.reader --dataset {dataset} --shared-data DIR"


def _crop(spec: DatasetSpec) -> tuple[int, float, bool]:
    """(pad, fill, flip) of the reader's augmentation: a random crop from a ``reader_crop_pad``-padded
    copy filled with the dataset's ``background``, and a horizontal flip where it keeps the class."""
    return spec.reader_crop_pad, spec.background, spec.hflip


# ---------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------


def _conv(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class ReaderNet(nn.Module):
    """A small VGG-style CNN: three stages of two 3x3 conv + BatchNorm + ReLU (``WIDTHS`` = 48, 96,
    192 channels), 2x2 max pooling between stages, global average pooling and a linear layer
    (about 0.66 M parameters, a 2.6 MB float32 state dict).

    ``forward(images)``: images float32 (N,C,H,W) with values in [0,1] as ``fl_attack.federation.data`` gives
    them (femnist 1x28x28 in the LEAF convention, 255 = white background; cifar100 3x32x32 RGB),
    normalised inside with the dataset's mean/std (``get_spec(dataset).normalize``; values outside
    [0,1] are not clamped: clamp a reconstruction first). Returns logits float32 (N, num_classes),
    62 for femnist, 100 for cifar100.

    Raises ValueError for an unknown dataset, and in ``forward`` for images of another shape
    (TypeError for a non-floating-point tensor).
    """

    def __init__(self, dataset: str, widths: tuple[int, int, int] = WIDTHS):
        super().__init__()
        spec = get_spec(dataset)
        self.dataset = spec.name
        self.image_shape = spec.image_shape
        c = spec.image_shape[0]
        a, b, d = widths
        self.features = nn.Sequential(
            *_conv(c, a),
            *_conv(a, a),
            nn.MaxPool2d(2),
            *_conv(a, b),
            *_conv(b, b),
            nn.MaxPool2d(2),
            *_conv(b, d),
            *_conv(d, d),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(d, spec.num_classes)
        # Not in the state dict: they follow from the dataset.
        self.register_buffer("mean", torch.tensor(spec.mean).view(1, c, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(spec.std).view(1, c, 1, 1), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        if not torch.is_floating_point(images):
            raise TypeError(f"reader ({self.dataset}): expected float images in [0,1], got {images.dtype}")
        if images.dim() != 4 or tuple(images.shape[1:]) != self.image_shape:
            c, h, w = self.image_shape
            raise ValueError(f"reader ({self.dataset}): expected images (N,{c},{h},{w}), got {tuple(images.shape)}")
        x = (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)
        return self.classifier(self.features(x))


def _weights_from(path: Path, dataset: str) -> ReaderNet:
    model = ReaderNet(dataset)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@functools.lru_cache(maxsize=4)
def _cached_reader(name: str) -> ReaderNet:
    try:
        path = asset(f"reader_{name}.pt")
    except FileNotFoundError:
        raise ValueError(
            f"reader weights fl_attack/assets/reader_{name}.pt not found; train them with: {_command(name)}"
        ) from None
    return _weights_from(path, name)


def load_reader(dataset: str) -> torch.nn.Module:
    """The shipped reader of ``dataset`` ("femnist" or "cifar100"): a :class:`ReaderNet` in eval mode
    on the CPU, parameters frozen, loaded from ``fl_attack/assets/reader_{dataset}.pt`` with
    ``torch.load(weights_only=True)``. Cached per process: every caller shares one module, so do not
    train or move it (``copy.deepcopy`` it first). Call it under ``torch.no_grad()``:
    ``load_reader("femnist")(images).argmax(1)``, images float32 (N,C,H,W) in [0,1].

    Raises ValueError for an unknown dataset, and (one line, naming the file and the training
    command) when the weights file is missing."""
    return _cached_reader(get_spec(dataset).name)


def reader_info(dataset: str) -> dict:
    """The JSON sidecar ``fl_attack/assets/reader_{dataset}.json`` of the shipped reader: the training
    set (``training_set``: description, ``source``, sizes), ``epochs``, ``seed``, ``wall_seconds``,
    ``torch_version``, ``params``, the accuracies measured (``val_accuracy`` on the held-out 10% of the
    training set, ``client_accuracy`` on the bundled pool's client training images, ``client_set``
    saying which), ``training_digests`` (the training set's fingerprint file: :func:`write_training_digests`)
    and, for femnist, ``reader_writers``.

    Raises ValueError for an unknown dataset or a missing sidecar (naming the file and the command)."""
    name = get_spec(dataset).name
    try:
        path = asset(f"reader_{name}.json")
    except FileNotFoundError:
        raise ValueError(
            f"reader sidecar fl_attack/assets/reader_{name}.json not found; train the reader with: {_command(name)}"
        ) from None
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------
# Training sets
# ---------------------------------------------------------------------------


def _reader_writer_indices(pool: Pool) -> np.ndarray:
    """Writer indices (into ``pool.writer_names``) of the reader's writers, in name order."""
    counts = np.bincount(pool.writers[pool.split == 0], minlength=len(pool.writer_names))
    have = np.flatnonzero(counts > 0)
    have = have[np.argsort(pool.writer_names[have], kind="stable")]
    if have.size < 2 * READER_WRITER_COUNT:
        raise ValueError(
            f"{pool.dataset} pool has only {have.size} writers with LEAF-train samples; the reader takes the last "
            f"{READER_WRITER_COUNT} and needs at least as many others for the clients"
        )
    return have[-READER_WRITER_COUNT:]


@functools.cache
def reader_writers(dataset: str = "femnist") -> tuple[str, ...]:
    """The LEAF writer names (sorted) whose LEAF-train samples the reader of ``dataset`` trained on: the
    last 40 by name among the bundled pool's writers with any LEAF-train sample (femnist: ``f3209_08``
    ..; femnist-digits: the same 40). A femnist client's ``client_id`` is its writer name, so
    ``client_id in reader_writers()`` says the reader saw that client's training samples: with the
    bundled pool, partition ids 61+ at k = 32 (58+ at k = 100, 65+ at k = 1), i.e. only federations of
    more than ~60 clients. () for a dataset whose clients are not writers (cifar100). ValueError for an
    unknown dataset."""
    spec = get_spec(dataset)
    if not spec.writers:
        return ()
    pool = load_bundled(spec.name)
    return tuple(str(n) for n in pool.writer_names[_reader_writer_indices(pool)])


def _hashes(images: np.ndarray) -> list[bytes]:
    return [hashlib.sha256(np.ascontiguousarray(x).tobytes()).digest() for x in images]


def _file_source(spec: DatasetSpec, source) -> Path:
    """The reader's training file (``spec.reader_source``) given its path or folder."""
    if source is None:
        raise ValueError(f"{spec.name}: the reader's training source is {spec.reader_source}; pass its path or folder")
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / str(spec.reader_source)
    if not path.is_file():
        raise FileNotFoundError(f"{spec.name} reader source not found: {path}")
    return path


def _load_source_arrays(spec: DatasetSpec, path: Path) -> tuple[np.ndarray, np.ndarray]:
    c, h, w = spec.image_shape
    want = (h, w) if c == 1 else (h, w, c)
    with np.load(path, allow_pickle=False) as z:
        images, labels = z["images"], z["labels"].astype(np.int64)
    if images.dtype != np.uint8 or images.shape[1:] != want or labels.shape != (len(images),):
        raise ValueError(
            f"{path}: expected uint8 images (N,{','.join(map(str, want))}) and labels (N,), got {images.shape}"
        )
    return images, labels


def _source(dataset: str, source) -> tuple[np.ndarray, np.ndarray, Pool | None]:
    """(images, labels, writers' pool or None) of the reader's training source."""
    spec = get_spec(dataset)
    if spec.reader_source is None:
        if source is not None and not isinstance(source, Pool):
            raise ValueError(
                f"{spec.name}: the reader's source is the bundled pool (source=None) or a {spec.name} Pool"
            )
        pool = load_bundled(spec.name) if source is None else source
        return pool.images, pool.labels, pool
    return (*_load_source_arrays(spec, _file_source(spec, source)), None)


def training_indices(dataset: str, source=None) -> np.ndarray:
    """int64 indices (ascending) of the reader's training set in its source's arrays.

    * femnist: ``source`` None (the bundled pool, the default) or a femnist :class:`Pool`: the samples
      with ``split == 0`` of the writers of :func:`reader_writers` (computed on that pool).
    * cifar100: ``source`` the path of ``cifar100_train29513.npz`` or the folder holding it: the images
      not byte-equal (SHA-256 of the uint8 bytes) to any image of ``load_bundled("cifar100")``.

    Raises ValueError for an unknown dataset, a missing cifar100 source argument or a malformed
    source; FileNotFoundError when the cifar100 file is absent."""
    images, _, pool = _source(dataset, source)
    if pool is not None:
        chosen = np.isin(pool.writers, _reader_writer_indices(pool)) & (pool.split == 0)
        return np.flatnonzero(chosen).astype(np.int64)
    bundled = set(_hashes(load_bundled(dataset).images))
    return np.array([i for i, h in enumerate(_hashes(images)) if h not in bundled], dtype=np.int64)


def training_set(dataset: str, source=None) -> tuple[np.ndarray, np.ndarray]:
    """The reader's exact training set (before the 10% validation hold-out), deterministic:
    ``(images, labels)`` of :func:`training_indices` in that order, images uint8 in the pool layout
    ((N,28,28) femnist, LEAF convention; (N,32,32,3) RGB NHWC cifar100), labels int64 (N,).
    ``source`` and errors as :func:`training_indices`."""
    images, labels, _ = _source(dataset, source)
    idx = training_indices(dataset, source)
    return images[idx], labels[idx]


def bundled_client_set(dataset: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The bundled pool's client images the sidecar's ``client_accuracy`` is measured on:
    ``(images uint8, labels int64, description)``. femnist: every LEAF-train sample of the first 20
    eligible writers at k = 32 (partitions 0..19, none a reader writer); cifar100: all 3,000 bundled
    images. Raises ValueError for an unknown dataset or (femnist) when those writers meet the reader's."""
    spec = get_spec(dataset)
    name = spec.name
    pool = load_bundled(name)
    if not spec.writers:
        return pool.images, pool.labels, f"all {len(pool):,} images of the bundled {name} pool"
    writers = partition_writers(pool, FEMNIST_CLIENT_K)[:FEMNIST_CLIENT_WRITERS]
    if np.isin(writers, _reader_writer_indices(pool)).any():
        raise ValueError(f"{name}: the first 20 eligible writers overlap the reader's writers")
    idx = np.flatnonzero(np.isin(pool.writers, writers) & (pool.split == 0))
    text = (
        f"the LEAF-train samples of the first {FEMNIST_CLIENT_WRITERS} eligible writers at "
        f"k={FEMNIST_CLIENT_K} (partitions 0..{FEMNIST_CLIENT_WRITERS - 1}) of the bundled {name} pool"
    )
    return pool.images[idx], pool.labels[idx], text


# ---------------------------------------------------------------------------
# The training set's fingerprint
# ---------------------------------------------------------------------------


def _digests_file(name: str) -> str:
    return f"reader_{name}_train.npy"


def image_digests(images: Tensor) -> np.ndarray:
    """One fingerprint per image: uint64 (N,), the 8-byte blake2b digest (little-endian) of the
    image's 8-bit pixels round(255 x) in (C,H,W) order. images: float (N,C,H,W) in [0,1] (values
    outside are clamped), as the evaluator and ``fl_attack.federation.data`` hold them; equal 8-bit
    images give equal digests. Raises ValueError for images not (N,C,H,W) or not floating point."""
    if not isinstance(images, Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise ValueError(
            f"image_digests: expected float images (N,C,H,W) in [0,1], got {getattr(images, 'shape', images)}"
        )
    q = (images.detach().cpu().float().clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    raw = b"".join(hashlib.blake2b(x.tobytes(), digest_size=DIGEST_BYTES).digest() for x in q)
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def _training_set_digests(name: str, source) -> np.ndarray:
    """The sorted distinct digests of the reader's training set (``training_set``), in chunks."""
    images, _ = training_set(name, source)
    parts = [image_digests(_as_float(images[i : i + 4096])) for i in range(0, len(images), 4096)]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.uint64)


def write_training_digests(dataset: str, shared_data=None, out=ASSETS) -> dict:
    """Write ``out/reader_{dataset}_train.npy``: the sorted distinct :func:`image_digests` (uint64)
    of every image of the reader's training set (:func:`training_set`, its 10% validation hold-out
    included; cifar100 from ``shared_data``, the folder of ``cifar100_train29513.npz``). Returns the
    sidecar's ``training_digests`` record: file, count, sha256, rule. Raises as :func:`training_set`."""
    spec = get_spec(dataset)
    name = spec.name
    digests = _training_set_digests(name, None if spec.reader_source is None else shared_data)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / _digests_file(name)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, digests, allow_pickle=False)
    tmp.replace(path)
    return {
        "file": path.name,
        "count": int(digests.size),
        "sha256": _sha256(path),
        "rule": f"the sorted distinct {DIGEST_BYTES}-byte blake2b digests (uint64 little-endian) of the 8-bit "
        "pixels (C,H,W order) of every training-set image, validation included (image_digests)",
    }


@functools.lru_cache(maxsize=4)
def _shipped_digests(name: str) -> np.ndarray:
    try:
        path = asset(_digests_file(name))
    except FileNotFoundError:
        raise ValueError(
            f"reader fingerprint fl_attack/assets/{_digests_file(name)} not found; write it with: "
            f"{_command(name)} --digests-only"
        ) from None
    digests = np.load(path, allow_pickle=False)
    if digests.dtype != np.uint64 or digests.ndim != 1:
        raise ValueError(f"{path}: expected uint64 digests (N,), got {digests.dtype} {digests.shape}")
    digests.flags.writeable = False
    return digests


def training_digests(dataset: str) -> np.ndarray:
    """The shipped fingerprint of the reader's training set: sorted distinct uint64 (N,), read-only
    (``fl_attack/assets/reader_{dataset}_train.npy``, :func:`write_training_digests`). Cached.
    Raises ValueError for an unknown dataset or a missing file (naming the command)."""
    return _shipped_digests(get_spec(dataset).name)


def in_training_set(images: Tensor, dataset: str) -> np.ndarray:
    """bool (N,): which of ``images`` (float (N,C,H,W) in [0,1]) are, at 8 bits, an image the reader of
    ``dataset`` trained on (:func:`training_digests`). Raises as :func:`image_digests` and
    :func:`training_digests`."""
    return np.isin(image_digests(images), training_digests(dataset))


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def _as_float(images: np.ndarray) -> Tensor:
    """uint8 pool-layout images -> float32 (N,C,H,W) in [0,1]."""
    x = torch.from_numpy(np.array(images, copy=True))  # a writable copy of a read-only pool
    x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x.contiguous().to(torch.float32).div_(255.0)


@torch.no_grad()
def accuracy(model: nn.Module, images: Tensor, labels: Tensor, batch_size: int = 500) -> float:
    """Top-1 accuracy of ``model`` (eval mode, float32) on images float32 (N,C,H,W) in [0,1] and labels
    int64 (N,); a float in [0,1] (nan for N = 0)."""
    if len(labels) == 0:
        return float("nan")
    model.eval()
    right = 0
    for i in range(0, len(labels), batch_size):
        right += int((model(images[i : i + batch_size]).argmax(1) == labels[i : i + batch_size]).sum())
    return right / len(labels)


def _augment(x: Tensor, pad: int, fill: float, flip: bool, gen: torch.Generator) -> Tensor:
    """Random crop of each image from its ``pad``-padded copy (padding value ``fill``), and a random
    horizontal flip when ``flip``."""
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad), value=fill)
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    rows = (oy[:, None] + torch.arange(h))[:, None, :, None]
    cols = (ox[:, None] + torch.arange(w))[:, None, None, :]
    out = padded[torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]
    if flip:
        mirror = torch.rand(n, generator=gen) < 0.5
        out = torch.where(mirror[:, None, None, None], out.flip(3), out)
    return out


def _degrade(x: Tensor, fill: float, gen: torch.Generator) -> Tensor:
    """A generic degradation of images (N,C,H,W) in [0,1], so that the reader reads a character or an
    object through the noise a reconstruction carries, as a person does; no reconstruction is used.
    Per image, each with probability 1/2: lower contrast (x -> a x + (1 - a) m, a in [0.6, 1], m a grey
    level, in [0.6, 1] for a white background ``fill``), smooth blotches (4x4 noise upsampled, amplitude up to 0.25),
    Gaussian noise (std up to 0.15), speckle (up to 6% of the pixels set at random), and with
    probability 1/4 a 3x3 min filter (dark strokes thicker; or a max filter, on a dark background
    only); then clamped to [0,1]."""
    n, c, h, w = x.shape

    def pick(p: float = 0.5) -> Tensor:
        return (torch.rand(n, 1, 1, 1, generator=gen) < p).float()

    def uniform(lo: float, hi: float) -> Tensor:
        return lo + (hi - lo) * torch.rand(n, 1, 1, 1, generator=gen)

    a, m = uniform(0.6, 1.0), uniform(0.6, 1.0) if fill > 0.5 else uniform(0.0, 1.0)
    x = torch.lerp(x, a * x + (1 - a) * m, pick())
    low = torch.nn.functional.interpolate(torch.randn(n, c, 4, 4, generator=gen), size=(h, w), mode="bilinear")
    x = x + pick() * uniform(0.0, 0.25) * low
    x = x + pick() * uniform(0.0, 0.15) * torch.randn(x.shape, generator=gen)
    speckle = (torch.rand(n, 1, h, w, generator=gen) < uniform(0.0, 0.06)).float() * pick()
    x = speckle * torch.rand(x.shape, generator=gen) + (1 - speckle) * x
    darker = -torch.nn.functional.max_pool2d(-x, 3, 1, 1)  # dark strokes thicker (min filter)
    lighter = torch.nn.functional.max_pool2d(x, 3, 1, 1)
    # on a white page the max filter erases thin ink: there only strokes made thicker
    filtered = darker if fill > 0.5 else torch.where(pick() > 0, darker, lighter)
    x = torch.lerp(x, filtered, pick(0.25))
    return x.clamp(0.0, 1.0)


def _bf16_supported() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_reader(
    dataset: str,
    shared_data=None,
    epochs: int | None = None,
    seed: int = 0,
    out=ASSETS,
    batch_size: int = 128,
    lr: float = 0.1,
    weight_decay: float = 5e-4,
    threads: int = 2,
    precision: str = "auto",
    log=print,
) -> dict:
    """Train the reader of ``dataset`` and write ``out/reader_{dataset}.pt`` (the float32 state dict,
    atomically) and ``out/reader_{dataset}.json`` (the sidecar, see :func:`reader_info`); returns the
    sidecar's dict.

    Training set :func:`training_set` (cifar100 from ``shared_data``: the folder of
    ``cifar100_train29513.npz``; femnist: the bundled pool, ``shared_data`` unused), 10% held out with
    ``default_rng(seed)``; SGD with Nesterov momentum 0.9, one-cycle learning rate up to ``lr``,
    ``weight_decay``, label smoothing 0.1, batches of ``batch_size``; augmentation: random crop from a
    2-pixel (femnist, white padding) or 4-pixel (cifar100, black) padding, horizontal flip for cifar100
    only. ``precision`` "auto" trains under bfloat16 autocast when the CPU supports it (oneDNN), else
    float32 ("fp32" / "bf16" force one); evaluation is always float32, on the saved weights.
    torch, numpy and the shuffles are seeded with ``seed``. Prints one line per epoch through ``log``.

    Raises ValueError for an unknown dataset, epochs < 1, an unknown precision, and as
    :func:`training_set`."""
    start = time.perf_counter()
    spec = get_spec(dataset)
    name = spec.name
    epochs = spec.reader_epochs if epochs is None else int(epochs)
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, got {precision!r}")
    bf16 = precision == "bf16" or (precision == "auto" and _bf16_supported())
    torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    np.random.seed(seed)

    images_u8, labels_np = training_set(name, None if spec.reader_source is None else shared_data)
    n = len(labels_np)
    perm = np.random.default_rng(seed).permutation(n)
    n_val = int(round(VAL_FRACTION * n))
    val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    x_all, y_all = _as_float(images_u8), torch.from_numpy(labels_np)
    x_train, y_train = x_all[train_idx], y_all[train_idx]
    x_val, y_val = x_all[val_idx], y_all[val_idx]
    del x_all
    log(f"reader {name}: {n} training-set images, {len(train_idx)} train / {n_val} validation; bf16={bf16}")

    model = ReaderNet(name).to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)
    steps = (len(train_idx) + batch_size - 1) // batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, epochs=epochs, steps_per_epoch=steps)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    gen = torch.Generator().manual_seed(seed)
    pad, fill, flip = _crop(spec)
    history = []
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(len(train_idx), generator=gen)
        total, seen = 0.0, 0
        for i in range(0, len(order), batch_size):
            b = order[i : i + batch_size]
            x = _augment(x_train[b], pad, fill, flip, gen)
            x = torch.where(torch.rand(len(b), 1, 1, 1, generator=gen) < DEGRADED, _degrade(x, fill, gen), x)
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(model(x), y_train[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(b)
            seen += len(b)
        val = accuracy(model, x_val, y_val)
        secs = time.perf_counter() - t0
        history.append({"epoch": epoch, "loss": round(total / seen, 4), "val_accuracy": round(val, 4)})
        log(f"epoch {epoch}/{epochs}: loss {total / seen:.4f}  val acc {val:.4f}  {secs:.1f} s")

    out = Path(out)
    weights = out / f"reader_{name}.pt"
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    sha = save_torch_atomic(weights, state)
    shipped = _weights_from(weights, name)  # score exactly what ships
    val_acc = accuracy(shipped, x_val, y_val)
    c_images, c_labels, c_text = bundled_client_set(name)
    client_acc = accuracy(shipped, _as_float(c_images), torch.from_numpy(np.array(c_labels)))
    degraded = _degrade(_as_float(c_images), fill, torch.Generator().manual_seed(seed + 1))
    degraded_acc = accuracy(shipped, degraded, torch.from_numpy(np.array(c_labels)))
    wall = time.perf_counter() - start
    log(f"reader {name}: val acc {val_acc:.4f}, bundled-client acc {client_acc:.4f}, {wall:.0f} s")

    if spec.reader_source is None:
        pool = load_bundled(name)
        described = (
            f"the LEAF-train samples (split 0 only) of the last {READER_WRITER_COUNT} writers by name among "
            f"the {int((np.bincount(pool.writers[pool.split == 0]) > 0).sum())} bundled-pool writers with "
            "LEAF-train samples (reader_writers()); no LEAF-test sample, so none of the server's pool"
        )
        source = {"file": f"fl_attack/assets/{spec.sample}", "sha256": _sha256(asset(spec.sample))}
    else:
        src = _file_source(spec, shared_data)
        described = (
            f"{spec.reader_source} ({_load_source_arrays(spec, src)[1].size} CIFAR-100 training images) minus "
            f"every image byte-equal (SHA-256 of the uint8 bytes) to one of the {len(load_bundled(name)):,} of "
            "the bundled pool"
        )
        source = {"file": spec.reader_source, "sha256": _sha256(src)}
    info = {
        "dataset": name,
        "architecture": f"ReaderNet widths={list(WIDTHS)} (6 conv3x3+BN+ReLU, 2 max pools, avg pool, linear)",
        "params": params,
        "weights_bytes": weights.stat().st_size,
        "weights_sha256": sha,
        "training_set": {
            "description": described,
            "source": source,
            "size": n,
            "train": len(train_idx),
            "validation": n_val,
            "validation_rule": f"{VAL_FRACTION:.0%} held out with numpy default_rng(seed).permutation",
        },
        "reader_writers": list(reader_writers(name)) if spec.writers else None,
        "epochs": epochs,
        "seed": seed,
        "batch_size": batch_size,
        "optimizer": f"SGD nesterov momentum 0.9, weight decay {weight_decay}, one-cycle lr max {lr}, "
        "label smoothing 0.1",
        "augmentation": f"random crop, padding {pad}"
        + (" (white)" if fill == 1.0 else "")
        + ("; h-flip" if flip else "")
        + f"; {DEGRADED:.0%} of each batch degraded (_degrade: contrast, blotches, noise, speckle, min/max filter)",
        "precision": "bf16 autocast (training), fp32 (evaluation)" if bf16 else "fp32",
        "threads": int(threads),
        "wall_seconds": round(wall, 1),
        "torch_version": torch.__version__,
        "val_accuracy": round(val_acc, 4),
        "client_accuracy": round(client_acc, 4),
        "client_accuracy_degraded": round(degraded_acc, 4),
        "client_set": {"description": c_text, "size": int(len(c_labels))},
        "history": history,
        "command": f"python -m fl_attack.evaluation.reader --dataset {name} --shared-data DIR "
        f"--epochs {epochs} --seed {seed}",
    }
    info["training_digests"] = write_training_digests(name, shared_data, out)
    write_json_atomic(out / f"reader_{name}.json", info)
    return info


def refresh_training_digests(dataset: str, shared_data=None, out=ASSETS) -> dict:
    """``--digests-only``: write ``out/reader_{dataset}_train.npy`` (:func:`write_training_digests`)
    and its record into the sidecar ``out/reader_{dataset}.json`` (which must exist), without training.
    Returns the record. Raises ValueError for a missing sidecar and as :func:`training_set`."""
    name = get_spec(dataset).name
    sidecar = Path(out) / f"reader_{name}.json"
    if not sidecar.is_file():
        raise ValueError(f"reader sidecar {sidecar} not found; train the reader with: {_command(name)}")
    info = json.loads(sidecar.read_text(encoding="utf-8"))
    info["training_digests"] = write_training_digests(name, shared_data, out)
    write_json_atomic(sidecar, info)
    return info["training_digests"]


def main(argv: list[str] | None = None) -> int:
    """``python -m fl_attack.evaluation.reader --dataset femnist|cifar100 --shared-data DIR [--epochs N] [--seed 0]
    [--out fl_attack/assets] [--digests-only]``: train and write the reader (:func:`train_reader`), or
    with ``--digests-only`` its training set's fingerprint alone (:func:`refresh_training_digests`).
    Returns 0."""
    ap = argparse.ArgumentParser(
        prog="python -m fl_attack.evaluation.reader", description=train_reader.__doc__.split("\n")[0]
    )
    ap.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    ap.add_argument(
        "--shared-data",
        default=None,
        help=f"the shared offline data folder (cifar100: holds {CIFAR100_SOURCE}); femnist and femnist-digits "
        "read the bundled pool",
    )
    ap.add_argument(
        "--epochs", type=int, default=None, help=f"default { ({n: s.reader_epochs for n, s in DATASETS.items()}) }"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ASSETS), help="folder for reader_<dataset>.pt/.json")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument(
        "--digests-only",
        action="store_true",
        help="write only reader_<dataset>_train.npy (the training set's fingerprint) and its sidecar entry",
    )
    args = ap.parse_args(argv)
    source = get_spec(args.dataset).reader_source
    if source is not None and args.shared_data is None:
        ap.error(f"{args.dataset} needs --shared-data DIR (the folder of {source})")
    if args.digests_only:
        record = refresh_training_digests(args.dataset, args.shared_data, args.out)
        print(f"reader {args.dataset}: {record['count']} digests in {Path(args.out) / record['file']}", flush=True)
        return 0
    train_reader(
        args.dataset,
        args.shared_data,
        epochs=args.epochs,
        seed=args.seed,
        out=args.out,
        batch_size=args.batch_size,
        lr=args.lr,
        threads=args.threads,
        precision=args.precision,
        log=lambda s: print(s, flush=True),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
