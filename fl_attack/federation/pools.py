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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch loads on first use: the registry (imported with any module of the package) stays light
    from torch import Tensor
    from torch.nn import Module

# ---------------------------------------------------------------------------
# Dataset specs: the registry
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset, everything the federation, the attacker and the evaluator ask of it: the registry
    entry (``DATASETS``), made by its own module (femnist.py, cifar.py, femnist_digits.py) and registered
    with :func:`register_dataset` (docs/data.md, "Adding a dataset").

    * ``name``, ``image_shape`` (C,H,W), ``num_classes``; ``mean``/``std``: the per-channel statistics of
      the paper protocol (docs/PISME.md, "Input normalisation"): CIFAR-100 (0.5071, 0.4866, 0.4409) /
      (0.2673, 0.2564, 0.2762); FEMNIST in LEAF format (white background, x/255) 0.9642 / 0.1577.
    * ``psnr_recovered_db``: the matched PSNR (dB) above which Dimitrov et al. (TMLR 2022) count an image
      recovered on this dataset, 20 on FEMNIST and 19 on CIFAR-100 (the authors' scripts;
      fl_attack.evaluation.metrics.psnr_recovered).
    * ``writers``: True when a client is one writer (LEAF FEMNIST): the pool carries ``writers``,
      ``writer_names`` and ``split`` (0 = train, 1 = test), the paper's partition gives one client per
      writer, the server's test set is the test split, the natural partitioner applies and the verdict
      leaves the run's writers out. False: k-sample clients cut from a permutation (CIFAR-100), optionally
      restricted to C classes.
    * ``background``: the value in [0,1] of an empty pixel (1.0 on LEAF's white page, 0.0 otherwise):
      the reader's crop padding and its degradations.
    * ``hflip``: whether a horizontal flip keeps an image's class (objects yes, characters no): the
      reader's and the diffusion prior's augmentation.
    * ``sample``: the bundled real sample in fl_attack/assets (an .npz, fl_attack/assets/README.md);
      ``load``: instead of the files, how the pool is made from a data source (None = the bundled
      sample), e.g. as a subset of another dataset's pool; ``read_dir``: the reader of the dataset's
      own on-disk format (a LEAF directory, CIFAR's pickles), for a data-dir that is neither an .npz
      nor a ``save_to_disk`` directory.
    * ``model``: the paper's victim CNN, a callable ``model(**kwargs)`` -> nn.Module (``width`` among
      kwargs; fl_attack.federation.models.build_model).
    * ``reader_epochs``: the reader's training epochs (fl_attack.evaluation.reader); ``reader_crop_pad``: the
      padding of its random-crop augmentation (2 on FEMNIST, 4 on CIFAR-100); ``reader_source``: the
      file (in the shared offline data) the reader trains on, minus every bundled image, or None: the
      bundled pool's last writers (``writers`` datasets).
    * ``prior_steps``: the diffusion prior's training steps (fl_attack.attacker.diffusion), None = the
      dataset has no prior (an attack that needs one says so, and nothing else does).
    """

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    psnr_recovered_db: float = 20.0
    writers: bool = False
    background: float = 0.0
    hflip: bool = False
    sample: str = ""
    load: Callable[[str | None], Pool] | None = field(default=None, repr=False, compare=False)
    read_dir: Callable[[Path], Pool] | None = field(default=None, repr=False, compare=False)
    model: Callable[..., Module] | None = field(default=None, repr=False, compare=False)
    reader_epochs: int = 40
    reader_crop_pad: int = 4
    reader_source: str | None = None
    prior_steps: int | None = None

    def _stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        import torch

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
        import torch

        mean = torch.tensor(self.mean, dtype=torch.float32)
        std = torch.tensor(self.std, dtype=torch.float32)
        lo = ((0.0 - mean) / std).view(1, -1, 1, 1)
        hi = ((1.0 - mean) / std).view(1, -1, 1, 1)
        return lo, hi

    def new_model(self, **kwargs) -> Module:
        """A fresh victim CNN of this dataset (``model(**kwargs)``). ValueError when it has none."""
        if self.model is None:
            raise ValueError(f"dataset {self.name!r} registers no victim model (DatasetSpec.model)")
        return self.model(**kwargs)


# Filled by the dataset modules (register_dataset), which the package fl_attack.federation imports:
# importing any module of the package registers every dataset, as importing fl_attack.attacker.attacks
# registers every attack.
DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Add ``spec`` to ``DATASETS`` under ``spec.name`` (lower case, no surrounding spaces); returns it.
    ValueError for a name registered already, a bad name or shape, or ``mean``/``std`` of another length
    than the channel count."""
    name = spec.name
    if not name or name != name.strip().lower():
        raise ValueError(f"register_dataset: a dataset name is lower case without spaces, got {name!r}")
    if name in DATASETS:
        raise ValueError(f"register_dataset: '{name}' is registered already")
    if len(spec.image_shape) != 3 or min(spec.image_shape) < 1 or spec.num_classes < 2:
        raise ValueError(f"register_dataset: {name}: image_shape (C,H,W) and num_classes >= 2 needed")
    if len(spec.mean) != spec.image_shape[0] or len(spec.std) != spec.image_shape[0] or min(spec.std) <= 0:
        raise ValueError(f"register_dataset: {name}: mean and std need one value per channel, std > 0")
    DATASETS[name] = spec
    return spec


def get_spec(name: str) -> DatasetSpec:
    """Return the :class:`DatasetSpec` registered as ``name`` (case-insensitive): "femnist", "cifar100",
    "femnist-digits", ...

    Raises ValueError("unknown dataset 'x'; choose one of: cifar100, femnist, femnist-digits")."""
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
        if spec.writers:
            if self.writers is None or self.writer_names is None or self.split is None:
                raise ValueError(f"{spec.name} pool needs writers, writer_names and split")
            if self.writers.shape != (n,) or self.split.shape != (n,):
                raise ValueError(f"{spec.name} pool: writers and split must have shape (N,)")
            if n and (self.writers.min() < 0 or self.writers.max() >= len(self.writer_names)):
                raise ValueError(f"{spec.name} pool: writer index outside writer_names")

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
        if spec.writers:
            raise ValueError(
                f"classes is only supported for cifar100 (and datasets of k-sample clients); a {spec.name} "
                "client is one writer with that writer's own classes"
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
    import torch

    imgs = pool.images[idx]  # fancy indexing: a fresh, writable copy
    if imgs.ndim == 3:
        imgs = imgs[:, None, :, :]  # (k,28,28) -> (k,1,28,28)
    else:
        imgs = imgs.transpose(0, 3, 1, 2)  # NHWC -> NCHW
    images = torch.from_numpy(np.ascontiguousarray(imgs)).to(torch.float32).div_(255.0)
    labels = torch.from_numpy(pool.labels[idx].astype(np.int64))
    return ClientData(images=images, labels=labels, client_id=client_id, partition_id=partition_id)
