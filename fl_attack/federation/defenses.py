"""Client-side update transforms of the compression defenses: pure functions on state dicts.

Each takes the weights sent (w0) and returned (wT), as state dicts (name -> tensor), and returns a
new wT whose update u = wT - w0 has the defense's property, leaving its inputs untouched:

- ``topk_update``: only the top fraction of update coordinates by magnitude (all tensors together);
- ``low_rank_update``: a rank-r SVD approximation of each weight matrix's update;
- ``quantize_update``: b-bit unbiased stochastic quantisation of each tensor's update.

Which of them a run applies, and in which order, is its defenses' business (their ``transform``,
fl_attack/federation/defense_registry.py, applied by ``DefenseSettings.transform``); Flower's own DP
and SecAgg+ are the app's (clients/defenses.py). This module needs no Flower import.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch


def weight_matrices(shapes) -> list[tuple[str, tuple[int, int]]]:
    """(name, (rows, cols)) of every weight matrix of a model: tensors with 2+ dimensions, conv
    kernels (out, in, kh, kw) read as (out, in*kh*kw). ``shapes``: a state dict or (name, shape) pairs."""
    items = shapes.items() if isinstance(shapes, dict) else shapes
    out = []
    for name, value in items:
        shape = tuple(value.shape) if hasattr(value, "shape") else tuple(value)
        if len(shape) >= 2:
            out.append((name, (shape[0], math.prod(shape[1:]))))
    return out


# Client-side update transforms: pure functions on state dicts ------------------------------------


def _update(w0: dict, wT: dict) -> OrderedDict[str, torch.Tensor]:
    if list(w0) != list(wT):
        raise ValueError("w0 and wT must have the same keys in the same order")
    return OrderedDict((k, wT[k].detach().to(torch.float32) - w0[k].detach().to(torch.float32)) for k in w0)


def _apply(w0: dict, update: dict) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((k, (w0[k].detach().to(torch.float32) + update[k]).to(w0[k].dtype)) for k in w0)


def topk_update(w0: dict, wT: dict, fraction: float) -> OrderedDict[str, torch.Tensor]:
    """wT with only the ceil(fraction * P) update coordinates largest in |wT - w0| kept.

    The selection is global, over all P coordinates of all tensors together; every other coordinate
    of the returned wT equals w0 exactly, so the server sees those update entries as 0.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    update = _update(w0, wT)
    flat = torch.cat([u.reshape(-1) for u in update.values()])
    keep = math.ceil(fraction * flat.numel())
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[torch.topk(flat.abs(), keep, sorted=False).indices] = True
    sparse, start = OrderedDict(), 0
    for k, u in update.items():
        sparse[k] = torch.where(mask[start : start + u.numel()].view_as(u), u, torch.zeros_like(u))
        start += u.numel()
    return _apply(w0, sparse)


def low_rank_update(w0: dict, wT: dict, rank: int) -> OrderedDict[str, torch.Tensor]:
    """wT with each weight matrix's update replaced by its best rank-``rank`` approximation (SVD).

    Tensors of 2+ dimensions are read as (out, in*kh*kw) matrices (conv kernels reshaped); 1-D
    tensors (biases) are sent unchanged. Raises ValueError when a matrix has rank below ``rank``'s
    bound min(rows, cols).
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    update = _update(w0, wT)
    out = OrderedDict()
    for k, u in update.items():
        if u.dim() < 2:
            out[k] = u
            continue
        m = u.reshape(u.shape[0], -1)
        if rank > min(m.shape):
            raise ValueError(f"rank {rank} is larger than the {m.shape[0]}x{m.shape[1]} update of '{k}' allows")
        U, S, Vh = torch.linalg.svd(m.double(), full_matrices=False)
        out[k] = ((U[:, :rank] * S[:rank]) @ Vh[:rank]).to(u.dtype).reshape(u.shape)
    return _apply(w0, out)


def quantize_update(w0: dict, wT: dict, bits: int, seed: int = 0) -> OrderedDict[str, torch.Tensor]:
    """wT with each tensor's update stochastically quantised to 2**bits levels.

    Per tensor, the levels are evenly spaced over [min u, max u]; each entry is rounded up or down
    to a neighbouring level with the probabilities that make the result unbiased (E[q(u)] = u).
    ``seed`` seeds the rounding.
    """
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in 1..16, got {bits}")
    gen = torch.Generator().manual_seed(int(seed))
    levels = 2**bits - 1
    out = OrderedDict()
    for k, u in _update(w0, wT).items():
        lo, hi = u.min(), u.max()
        if not hi > lo:
            out[k] = u
            continue
        step = (hi - lo) / levels
        scaled = (u - lo) / step
        floor = scaled.floor()
        up = torch.rand(u.shape, generator=gen) < (scaled - floor)
        out[k] = lo + (floor + up.to(u.dtype)).clamp(0, levels) * step
    return _apply(w0, out)
