"""Dataset specs and the containers every data module shares (fl_attack.federation.data re-exports them).

* ``DatasetSpec`` / ``DATASETS`` / ``get_spec``: shape, classes and input normalisation of FEMNIST (LEAF,
  Caldas et al. 2018: 1x28x28, 62 classes) and CIFAR-100 (Krizhevsky 2009: 3x32x32, 100 classes).
* ``Pool``: a whole dataset as uint8 arrays; ``ClientData`` / ``ClientSplit``: one client's float32
  NCHW samples in [0,1]. Normalisation (``DatasetSpec.normalize``) is applied by the model side.
* The argument checks of the partition functions (``_as_index``, ``_check_args``) and ``_to_client``
  (pool indices -> ClientData), shared by femnist.py, cifar.py and partition.py.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# ---------------------------------------------------------------------------
# Dataset specs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """Static description of a dataset: shape, classes and input normalisation.

    ``mean``/``std`` are the per-channel statistics of the paper protocol (docs/PISME.md,
    "Input normalisation"): CIFAR-100 (0.5071, 0.4866, 0.4409) / (0.2673, 0.2564, 0.2762);
    FEMNIST in LEAF format (white background, x/255) 0.9642 / 0.1577. ``psnr_recovered_db``: the matched
    PSNR (dB) above which Dimitrov et al. (TMLR 2022) count an image recovered on this dataset, 20 on
    FEMNIST and 19 on CIFAR-100 (the authors' scripts; fl_attack.audit.metrics.psnr_recovered).
    """

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    psnr_recovered_db: float = 20.0

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
        psnr_recovered_db=20.0,
    ),
    "cifar100": DatasetSpec(
        name="cifar100",
        image_shape=(3, 32, 32),
        num_classes=100,
        mean=(0.5071, 0.4866, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
        psnr_recovered_db=19.0,
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
# Shared by the partition functions
# ---------------------------------------------------------------------------


def _as_index(name: str, value) -> int:
    """``value`` as an int (anything with ``__index__``); TypeError "<name> must be an integer" otherwise."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def _check_args(pool: Pool, num_samples, classes, test_samples=None) -> tuple[DatasetSpec, int, int | None, int | None]:
    """The checked arguments of the paper's partitions: (spec, k >= 1, classes in 1..num_classes for
    cifar100 or None, test_samples >= 0 or None). ValueError / TypeError as ``client_partition`` says."""
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


def _to_client(pool: Pool, idx: np.ndarray, client_id: str, partition_id: int) -> ClientData:
    """The pool's samples ``idx`` as a ClientData: images float32 (n,C,H,W) in [0,1], labels int64 (n,)."""
    imgs = pool.images[idx]  # fancy indexing: a fresh, writable copy
    if imgs.ndim == 3:
        imgs = imgs[:, None, :, :]  # (k,28,28) -> (k,1,28,28)
    else:
        imgs = imgs.transpose(0, 3, 1, 2)  # NHWC -> NCHW
    images = torch.from_numpy(np.ascontiguousarray(imgs)).to(torch.float32).div_(255.0)
    labels = torch.from_numpy(pool.labels[idx].astype(np.int64))
    return ClientData(images=images, labels=labels, client_id=client_id, partition_id=partition_id)
