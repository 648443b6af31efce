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
from .models import OUTPUT_BIAS, build_model
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
                          num_dummy: int = 128, seed: int = 0) -> np.ndarray:
    """Raw (unrounded) per-class count estimates n_j, shape (num_classes,), summing to about k.

    p_bar is the softmax averaged over ``num_dummy`` N(0, I) inputs (clamped to the pixel box) at
    w0 and at wT. Raises KeyError if the state has no output bias named ``fl_attack.models.OUTPUT_BIAS``.
    """
    meta = update.metadata
    spec = get_spec(meta.dataset)
    if OUTPUT_BIAS not in update.w0:
        raise KeyError(f"label recovery needs the output-layer bias '{OUTPUT_BIAS}' in the update")
    model = model or build_model(meta.dataset)
    gen = torch.Generator().manual_seed(seed)
    lo, hi = spec.pixel_box()
    dummy = torch.randn(num_dummy, *spec.image_shape, generator=gen)
    dummy = torch.maximum(torch.minimum(dummy, hi), lo)
    probs = [torch.softmax(functional_call(model, dict(w), (dummy,)), dim=1).mean(0)
             for w in (update.w0, update.wT)]
    p_bar = (probs[0] + probs[1]) / 2
    delta_b = update.wT[OUTPUT_BIAS] - update.w0[OUTPUT_BIAS]
    return (meta.num_samples * (p_bar + delta_b / (meta.lr * meta.local_steps))).numpy()


def recover_labels(update: ObservedUpdate, model: torch.nn.Module | None = None, seed: int = 0) -> torch.Tensor:
    """Recovered labels, int64 shape (k,), sorted by class (their order is arbitrary to the attack)."""
    counts = round_counts(estimate_class_counts(update, model, seed=seed), update.metadata.num_samples)
    return torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).long()
