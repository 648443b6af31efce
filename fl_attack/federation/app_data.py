"""An app's own data for the audit: a dataset the registry does not know, given as arrays in memory.

``strategies.audit.audit(..., dataset=AppData(...))`` audits an app whose images have a shape and a class
count of their own (docs/audit-your-app.md, "Your own data"). ``AppData`` holds what the server may
know: the image shape, the class count, a public set (the server's own labelled images, never a
client's) and optionally distractors (more images no client holds); ``register_app_data`` checks them
and registers a ``DatasetSpec`` under the app's name whose pool is the distractors (or the public set),
so that every part of the audit that asks the registry (the attacker's shapes and normalisation, the
verdict's pool and distractors) finds it. The spec has no reader (``reader_epochs`` 0: the verdict leads
with "singled out" and leaves "recovered" NaN) and no diffusion prior (an attack that needs one is
refused before round 1). ``app_spec`` is the spec an attack job carries to a worker in another process,
which registers it there (``ensure_registered``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from fl_attack.federation.pools import DATASETS, ClientData, DatasetSpec, Pool, register_dataset

__all__ = ["AppData", "MIN_PUBLIC", "MIN_DISTRACTORS", "register_app_data", "app_spec", "ensure_registered"]

# The verdict's guesses (pool mean, class means, medoids) are drawn from the public set: fewer than this
# many images give a floor that says little.
MIN_PUBLIC = 100
# D, the candidates beside a client's k images: the chance of singling out by matching alone is k/(k+D),
# 24% at k = 32 and D = 100; fewer leave little room above chance (docs/verdict.md).
MIN_DISTRACTORS = 100
_APP_NAMES: set[str] = set()  # the names registered from an AppData (replaceable; the built-in ones are not)


@dataclass(frozen=True, eq=False)
class AppData:
    """An app's own data, as the audit's server may know it.

    * ``name``: the dataset's name in the records (lower case, no spaces; not a registered built-in).
    * ``image_shape``: (C,H,W) of the clients' images; ``num_classes``: the classifier's classes (>= 2).
    * ``public``: (images, labels), the server's own labelled images (no client's): images float
      (P,C,H,W) in [0,1] (ToTensor's scale, before any Normalize), labels integer (P,) in
      0..num_classes-1, P >= ``MIN_PUBLIC``. The verdict's update-free guesses come from it, and the
      attacker's public pool where an attack option reads one (label_estimator aux, start public).
    * ``distractors``: (images, labels) as ``public``, images no client holds (at least
      ``MIN_DISTRACTORS``), ranked beside a client's own in the verdict's "singled out"; None: drawn
      from the public set.
    * ``mean``, ``std``: per-channel input statistics (the attack's normalised space); None: the public
      set's. ``background``: an empty pixel's value in [0,1]; ``hflip``: a horizontal flip keeps the
      class; ``psnr_recovered_db``: Dimitrov et al.'s PSNR threshold (dB) for the psnr_recovered column.
    """

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    public: tuple
    distractors: tuple | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    background: float = 0.0
    hflip: bool = False
    psnr_recovered_db: float = 20.0

    def public_set(self) -> ClientData:
        """The public set as a ClientData (images float32 (P,C,H,W) in [0,1], labels int64 (P,),
        client_id "app-public"): the server's held-out set of the audit. Raises as ``register_app_data``."""
        images, labels = _checked(self, self.public, "public", MIN_PUBLIC)
        return ClientData(images, labels, "app-public", -1)


def _checked(app: AppData, pair, what: str, least: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``pair`` = (images, labels) as float32 (N,C,H,W) in [0,1] and int64 (N,) tensors; ValueError
    naming ``what`` for anything else, or for fewer than ``least`` images."""
    where = f"AppData {app.name!r}: {what}"
    try:
        images, labels = pair
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be (images, labels), got {type(pair).__name__}") from None
    images, labels = torch.as_tensor(images), torch.as_tensor(labels)
    shape = tuple(app.image_shape)
    if images.dim() != 4 or tuple(images.shape[1:]) != shape or not images.is_floating_point():
        raise ValueError(
            f"{where} images must be float (N,{','.join(map(str, shape))}), channels first as ToTensor gives "
            f"them, got {images.dtype} {tuple(images.shape)}"
        )
    if not torch.isfinite(images).all() or (len(images) and (images.min() < 0 or images.max() > 1)):
        raise ValueError(
            f"{where} images must be finite and in [0,1], got [{float(images.min()):.3g}, {float(images.max()):.3g}]"
            " (divide 0-255 pixels by 255; before any Normalize)"
        )
    if labels.dim() != 1 or len(labels) != len(images) or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"{where} labels must be integers ({len(images)},), got {labels.dtype} {tuple(labels.shape)}")
    if len(labels) and (labels.min() < 0 or labels.max() >= app.num_classes):
        raise ValueError(
            f"{where} labels must be in 0..{app.num_classes - 1} (num_classes={app.num_classes}), "
            f"got {int(labels.min())}..{int(labels.max())}"
        )
    if len(images) < least:
        why = "its guesses come from it" if what == "public" else "D distractors: the chance k/(k+D) grows as D shrinks"
        raise ValueError(f"{where} has {len(images)} images; the verdict needs at least {least} ({why})")
    return images.float().contiguous(), labels.long()


def _as_pool(name: str, images: torch.Tensor, labels: torch.Tensor) -> Pool:
    """Images float (N,C,H,W) in [0,1] as a Pool: uint8 round(255 x), (N,H,W) for one channel, else NHWC."""
    q = (images * 255).round().to(torch.uint8)
    q = q[:, 0] if q.shape[1] == 1 else q.permute(0, 2, 3, 1)
    return Pool(dataset=name, images=np.ascontiguousarray(q.numpy()), labels=labels.numpy().astype(np.int64))


def register_app_data(app: AppData) -> DatasetSpec:
    """Check ``app`` and register its DatasetSpec (``DATASETS[app.name]``); returns it. An app name
    registered before (a second audit in one process) is replaced; a built-in dataset's name is refused.

    The spec: ``image_shape``, ``num_classes``, ``mean``/``std`` (given, or the public set's per-channel
    statistics, std at least 1e-3), ``background``, ``hflip``, ``psnr_recovered_db``; its pool (``load``)
    is the distractors, or the public set without them, at 8 bits; ``reader_epochs`` 0 (no reader) and
    ``prior_steps`` None (no diffusion prior). Raises ValueError, before anything is registered, for a
    bad name, shape or class count, images not float (N,C,H,W) of the shape in [0,1], labels outside
    0..num_classes-1, fewer than ``MIN_PUBLIC`` public images or ``MIN_DISTRACTORS`` distractors, or
    mean/std not one value per channel with std > 0."""
    name = str(app.name)
    if not name or name != name.strip().lower() or " " in name:
        raise ValueError(f"AppData: name must be lower case without spaces, got {name!r}")
    if name in DATASETS and name not in _APP_NAMES:
        raise ValueError(f"AppData {name!r}: a built-in dataset has that name; give the app's data its own")
    shape = tuple(app.image_shape)
    if len(shape) != 3 or not all(isinstance(v, int) and v >= 1 for v in shape):
        raise ValueError(f"AppData {name!r}: image_shape must be (C,H,W) positive integers, got {app.image_shape!r}")
    if isinstance(app.num_classes, bool) or not isinstance(app.num_classes, int) or app.num_classes < 2:
        raise ValueError(f"AppData {name!r}: num_classes must be an integer >= 2, got {app.num_classes!r}")
    public = app.public_set()
    pool_images, pool_labels = public.images, public.labels
    if app.distractors is not None:
        pool_images, pool_labels = _checked(app, app.distractors, "distractors", MIN_DISTRACTORS)
    c = shape[0]
    mean = tuple(float(v) for v in public.images.mean((0, 2, 3))) if app.mean is None else tuple(app.mean)
    std = tuple(max(float(v), 1e-3) for v in public.images.std((0, 2, 3))) if app.std is None else tuple(app.std)
    if len(mean) != c or len(std) != c or min(std) <= 0 or not all(map(math.isfinite, mean + std)):
        raise ValueError(f"AppData {name!r}: mean and std need one finite value per channel ({c}), std > 0")
    spec = DatasetSpec(
        name=name,
        image_shape=shape,
        num_classes=app.num_classes,
        mean=mean,
        std=std,
        psnr_recovered_db=float(app.psnr_recovered_db),
        background=float(app.background),
        hflip=bool(app.hflip),
        # the app's arrays, made a Pool on first use (it checks itself against the registered spec); no data-dir
        load=lambda source, images=pool_images, labels=pool_labels: _as_pool(name, images, labels),
        reader_epochs=0,
        prior_steps=None,
    )
    return _register(spec)


def _register(spec: DatasetSpec) -> DatasetSpec:
    """Register ``spec`` as an app's dataset, replacing an app's of that name (and its cached pool)."""
    from fl_attack.federation import loading

    if spec.name in _APP_NAMES:
        del DATASETS[spec.name]
        loading._cached_pool.cache_clear()  # keyed by name: the replaced pool must not be served
    register_dataset(spec)
    _APP_NAMES.add(spec.name)
    return spec


def app_spec(name: str) -> DatasetSpec | None:
    """The spec of ``name`` as an attack worker needs it (no pool: ``load`` None) when ``name`` is an
    app's dataset registered in this process; None for a built-in or unknown name."""
    spec = DATASETS.get(name) if name in _APP_NAMES else None
    return None if spec is None else replace(spec, load=None)


def ensure_registered(spec: DatasetSpec) -> None:
    """On an attack worker: register an app's ``spec`` (from ``app_spec``) unless this process has it
    already (the same process as the server's, or an earlier job's)."""
    known = DATASETS.get(spec.name)
    if known is None or (spec.name in _APP_NAMES and known != spec):  # ``load`` is not compared
        _register(spec)
