"""``reconstruct``: the library's entry point, from an observed update to images and a trace."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .attacks import AttackConfig, get_attack
from .attacks.base import build_optimizers, lr_milestones
from .data import get_spec
from .labels import NEEDS_AUX, AuxiliaryData, recover_labels, refine_labels
from .models import check_model, resolve_model
from .update import ObservedUpdate, flatten, layout


@dataclass
class Reconstruction:
    """The result of one attack on one client update.

    images: (k,C,H,W) float32 in [0,1] on the CPU, in the attack's own order (match before scoring).
    labels: (k,) int64, the labels the attack used; label_source: "recovered" or "oracle".
    lsim_honest / lsim_calibrated: final Lsim(G, delta_w) with d = 1 and with the learned d.
    trace: one dict every ``trace_every`` iterations (iteration, loss, lsim_honest,
    lsim_calibrated, tv, the attack's own variables, and whatever ``callback`` returned).
    """

    method: str
    images: torch.Tensor
    labels: torch.Tensor
    label_source: str
    lsim_honest: float
    lsim_calibrated: float
    seconds: float
    config: dict
    trace: list = field(default_factory=list)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" -> CUDA when available, else CPU. ValueError for an unknown name or missing CUDA."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    if str(device).split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"unknown device '{device}'; use auto, cpu or cuda")
    return torch.device(device)


def reconstruct(
    update: ObservedUpdate,
    method: str = "pisme",
    *,
    labels: str | torch.Tensor = "recovered",
    config: AttackConfig | None = None,
    device: str | torch.device = "auto",
    callback: Callable[[int, torch.Tensor], dict] | None = None,
    progress: bool = False,
    time_limit: float | None = None,
    model: torch.nn.Module | str | None = None,
    label_aux: AuxiliaryData | None = None,
    **overrides,
) -> Reconstruction:
    """Reconstruct a client's k private images from its observed update (w0, wT, metadata).

    method: "pisme" (default), "nlsme", "sme" or "ig" (see ``fl_attack.attacks.ATTACKS``).
    labels: "recovered" (from the output-bias update, fl_attack.labels) or an (k,) int64 tensor of
    oracle labels, recorded as label_source "oracle".
    config / overrides: AttackConfig fields, e.g. ``iterations=300, nodes=7``.
    callback(iteration, images in [0,1] NCHW) may return metrics to add to the trace (the evaluator
    uses it in standalone runs; the attacker itself never sees the ground truth).
    label_aux: public labelled images (fl_attack.labels.AuxiliaryData, disjoint from the clients'
    training data) for ``label_estimator="aux"``; ignored by the other estimators.
    time_limit: seconds; past it the attack stops with TimeoutError (the federation records it as
    failed and goes on).
    model: the victim's architecture: an nn.Module (copied; its weights are not used, they come from
    the update), a spec for ``fl_attack.models.resolve_model`` ("paper" or "package.module:factory"),
    or None for the paper's CNN of the update's dataset. The paper's CNNs take the structured fast
    path of ``fl_attack.attacks.gradients``, any other model the generic one.
    Returns a Reconstruction. Raises ValueError for an unknown method, bad settings, a model that
    breaks the contract (``fl_attack.models.check_model``), an update that is not the model's
    (``ObservedUpdate.check_against``: foreign keys such as 'private_images', missing keys, other
    shapes) or oracle labels of the wrong length, and KeyError for recovered labels without an
    output-layer bias, before any optimisation.
    """
    attack_cls = get_attack(method)
    config = AttackConfig.from_overrides(config, **overrides)
    if not isinstance(update, ObservedUpdate):
        raise TypeError(f"update must be an ObservedUpdate, got {type(update).__name__}")
    meta = update.metadata
    spec = get_spec(meta.dataset)
    if model is None or isinstance(model, str):
        model = resolve_model(model or "", meta.dataset, seed=0)  # seeded: the global RNG is left as it was
    else:
        check_model(model, meta.dataset)
        model = copy.deepcopy(model).eval()
    update.check_against(model)
    k = meta.num_samples
    if isinstance(labels, str):
        if labels != "recovered":
            raise ValueError(f"labels must be 'recovered' or a tensor of oracle labels, got '{labels}'")
        if config.label_estimator in NEEDS_AUX and label_aux is None:
            raise ValueError(
                f"label_estimator '{config.label_estimator}' needs public auxiliary data: "
                "pass label_aux=fl_attack.labels.AuxiliaryData(images, labels)"
            )
        y = recover_labels(update, model, seed=config.seed, estimator=config.label_estimator, aux=label_aux)
        label_source = "recovered"
    else:
        y, label_source = torch.as_tensor(labels).long().reshape(-1), "oracle"
        if y.numel() != k or y.min() < 0 or y.max() >= spec.num_classes:
            raise ValueError(f"oracle labels must be {k} class ids in [0,{spec.num_classes}), got {y.numel()} labels")
    dev = resolve_device(device)
    start = time.perf_counter()

    model = model.to(dev)
    for p in model.parameters():
        p.requires_grad_(False)
    shapes = layout(update.w0)
    w0, wT = flatten(update.w0).to(dev), flatten(update.wT).to(dev)
    attack = attack_cls(model, w0, wT, shapes, config)
    y = y.to(dev)
    gen = torch.Generator().manual_seed(config.seed)
    x = torch.randn(k, *spec.image_shape, generator=gen).to(dev).requires_grad_(True)
    lo, hi = (b.to(dev) for b in spec.pixel_box())
    optimizers = build_optimizers(x, attack, config)
    schedulers = (
        [torch.optim.lr_scheduler.MultiStepLR(o, lr_milestones(config.iterations), 0.1) for o in optimizers]
        if config.lr_decay
        else []
    )

    trace = []
    steps = range(config.iterations)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=method, leave=False)
    refine_at = round(config.label_refine * config.iterations) if label_source == "recovered" else 0
    for it in steps:
        if refine_at and it == refine_at:  # once, on the current reconstruction (AttackConfig.label_refine)
            y = refine_labels(update, x.detach(), y, model)
        if time_limit is not None and time.perf_counter() - start > time_limit:
            raise TimeoutError(f"attack '{method}' exceeded its time limit of {time_limit:g} s at iteration {it}")
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        terms = attack.objective(x, y)
        terms["loss"].backward()
        for o in optimizers:
            o.step()
        for s in schedulers:
            s.step()
        with torch.no_grad():
            if config.box_clamp:
                x.copy_(torch.maximum(torch.minimum(x, hi), lo))
            attack.project()
        last = it == config.iterations - 1
        if it % config.trace_every == 0 or last:
            row = {"iteration": it, **{k_: float(v.detach()) for k_, v in terms.items()}, **attack.summary()}
            if callback is not None:
                row.update(callback(it, spec.denormalize(x.detach()).clamp(0, 1).cpu()) or {})
            trace.append(row)
    # Final Lsim at the returned images, with and without the calibration.
    final = attack.objective(x, y)
    images = spec.denormalize(x.detach()).clamp(0, 1).cpu()
    return Reconstruction(
        method=method,
        images=images,
        labels=y.cpu(),
        label_source=label_source,
        lsim_honest=float(final["lsim_honest"]),
        lsim_calibrated=float(final["lsim_calibrated"]),
        seconds=time.perf_counter() - start,
        config=asdict(config),
        trace=trace,
    )
