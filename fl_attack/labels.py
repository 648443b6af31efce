"""Label recovery from a multi-step update via the output-layer bias (PISME.md; the core of RLU,
Chen & Vikalo, ICML 2024).

For SGD on mean cross-entropy, bT - b0 = -(eta/B) sum_steps sum_batch (p_ij - y_ij), hence the count
of class j among the k samples is n_j ~= k * (p_bar_j + delta_b_j / (eta * T)), with delta_b = bT - b0
(an UPDATE, of the opposite sign of a gradient) and p_bar_j the mean softmax probability of class j
over the trajectory, estimated from the models at w0 and wT on dummy inputs.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call

from .data import get_spec
from .models import build_model, output_bias_key
from .update import ObservedUpdate


def round_counts(raw: np.ndarray, total: int) -> np.ndarray:
    """Clip negative estimates to 0 and round to integers summing to ``total`` (largest remainder)."""
    raw = np.clip(np.nan_to_num(np.asarray(raw, dtype=np.float64)), 0, None)
    if raw.sum() <= 0:
        raw = np.ones_like(raw)
    scaled = raw * total / raw.sum()
    counts = np.floor(scaled).astype(np.int64)
    remainder = total - counts.sum()
    order = np.argsort(-(scaled - counts), kind="stable")
    counts[order[:remainder]] += 1
    return counts


@torch.no_grad()
def estimate_class_counts(update: ObservedUpdate, model: torch.nn.Module | None = None,
                          num_dummy: int = 128, seed: int = 0, inputs: torch.Tensor | None = None) -> np.ndarray:
    """Raw (unrounded) per-class count estimates n_j, shape (num_classes,), summing to about k.

    p_bar is the softmax averaged, at w0 and at wT, over ``inputs`` when given (normalised model
    inputs (N,C,H,W), e.g. a reconstruction), else over ``num_dummy`` N(0, I) inputs clamped to the
    pixel box. Raises KeyError if the state has no output bias (``fl_attack.models.output_bias_key``:
    ``OUTPUT_BIAS``, or for another model the last 1-D entry of size num_classes).
    """
    _require_output_bias(update)
    spec = get_spec(update.metadata.dataset)
    model = model or build_model(update.metadata.dataset)
    if inputs is None:
        gen = torch.Generator().manual_seed(seed)
        lo, hi = spec.pixel_box()
        inputs = torch.randn(num_dummy, *spec.image_shape, generator=gen)
        inputs = torch.maximum(torch.minimum(inputs, hi), lo)
    return _raw_counts(update, _mean_softmax(model, update, inputs))


def _require_output_bias(update: ObservedUpdate) -> str:
    """The output-layer bias's key (OUTPUT_BIAS for the paper's CNNs); KeyError when there is none."""
    return output_bias_key(update.w0, get_spec(update.metadata.dataset).num_classes)


def _raw_counts(update: ObservedUpdate, probs: torch.Tensor) -> np.ndarray:
    """n_j = k * (p_bar_j + delta_b_j / (eta * T)), with p_bar the mean of the (N, classes) ``probs``."""
    meta = update.metadata
    bias = _require_output_bias(update)
    delta_b = update.wT[bias] - update.w0[bias]
    return (meta.num_samples * (probs.mean(0).cpu() + delta_b / (meta.lr * meta.local_steps))).numpy()


def _mean_softmax(model, update, inputs):
    """(N, classes): the softmax of ``inputs`` averaged over the models at w0 and at wT."""
    device = inputs.device
    probs = [torch.softmax(functional_call(model, {k: v.to(device) for k, v in w.items()}, (inputs,)), dim=1)
             for w in (update.w0, update.wT)]
    return (probs[0] + probs[1]) / 2


@torch.no_grad()
def refine_labels(update: ObservedUpdate, inputs: torch.Tensor, labels: torch.Tensor,
                  model: torch.nn.Module | None = None) -> torch.Tensor:
    """Labels re-estimated from a reconstruction (not in the paper; docs/attack-core.md).

    The counts are estimated as by ``estimate_class_counts``, with p_bar taken on ``inputs`` (the attack's
    current X_hat, normalised, (k,C,H,W)) instead of dummy inputs; after long local training the
    victim's softmax on its data departs from that on noise, and a reconstruction is closer to the
    data. When the counts are unchanged, ``labels`` is returned as is; otherwise the new multiset is
    assigned to the k images by an optimal matching (scipy.optimize.linear_sum_assignment) on
    -log p(label | image), averaged over w0 and wT. Returns (k,) int64 on ``labels``' device.
    Raises ValueError when inputs and labels disagree on k.
    """
    from scipy.optimize import linear_sum_assignment

    k = labels.shape[0]
    if inputs.shape[0] != k:
        raise ValueError(f"need one label per image, got {inputs.shape[0]} images and {k} labels")
    _require_output_bias(update)
    model = model or build_model(update.metadata.dataset).to(inputs.device)
    probs = _mean_softmax(model, update, inputs)  # one forward pass at w0 and wT serves both uses
    counts = round_counts(_raw_counts(update, probs), k)
    if np.array_equal(counts, np.bincount(labels.cpu().numpy(), minlength=len(counts))):
        return labels  # the same multiset: no image changes its label
    slots = np.repeat(np.arange(len(counts)), counts)  # the new multiset, one slot per image
    log_p = torch.log(probs.clamp_min(1e-12)).cpu().double().numpy()
    cost = -log_p[:, slots]  # (k images, k slots)
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(k, dtype=np.int64)
    out[rows] = slots[cols]
    return torch.from_numpy(out).to(labels.device)


def recover_labels(update: ObservedUpdate, model: torch.nn.Module | None = None, seed: int = 0) -> torch.Tensor:
    """Recovered labels, int64 shape (k,), sorted by class (their order is arbitrary to the attack)."""
    counts = round_counts(estimate_class_counts(update, model, seed=seed), update.metadata.num_samples)
    return torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).long()
