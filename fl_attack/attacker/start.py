"""Where an attack's X_hat starts (``AttackConfig.start``): N(0, I) noise, or a public image of each label.

The "public" start is a lever for short budgets (docs/time-to-quality.md): it costs no iteration and
starts each slot from a real image of the class the attack assigns it, drawn from the server's own
public pool (never the client's data). The verdict scores the same images as an update-free guess
(``fl_attack.evaluation.verdict``, "public sample"), so what the start alone would recover is the floor.
"""

from __future__ import annotations

import torch

from fl_attack.federation.pools import get_spec


def noise_start(seed: int, k: int, image_shape, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """X_hat's start (k,C,H,W) ~ N(0, I) in normalised space (docs/PISME.md), drawn in float32 from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(k, *image_shape, generator=gen).to(device=device, dtype=dtype)


def public_sample(labels: torch.Tensor, pool_images: torch.Tensor, pool_labels: torch.Tensor, seed: int = 0):
    """For each label, a random image of that class from the public pool, drawn from ``seed``.

    labels: (k,) class ids; pool_images: (N,C,H,W) in [0,1]; pool_labels: (N,). Slots of one class get
    distinct images while the pool has them (a random permutation of the class's images, then again).
    Returns (images (k,C,H,W) in [0,1], found (k,) bool: False where the pool has no image of the class,
    whose slot is left at 0). ValueError for mismatched pool shapes."""
    labels = torch.as_tensor(labels).long().cpu()
    pool_labels = torch.as_tensor(pool_labels).long().cpu()
    if pool_images.dim() != 4 or len(pool_images) != len(pool_labels):
        raise ValueError(
            f"the public pool needs images (N,C,H,W) and labels (N,), got {tuple(pool_images.shape)} and "
            f"{tuple(pool_labels.shape)}"
        )
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(len(labels), *pool_images.shape[1:], dtype=torch.float32)
    found = torch.zeros(len(labels), dtype=torch.bool)
    for c in labels.unique(sorted=True).tolist():
        slots = (labels == c).nonzero().flatten()
        members = (pool_labels == c).nonzero().flatten()
        if not len(members):
            continue
        rounds = -(-len(slots) // len(members))  # enough permutations of the class's images for its slots
        order = torch.cat([members[torch.randperm(len(members), generator=gen)] for _ in range(rounds)])
        out[slots] = pool_images[order[: len(slots)]].float().cpu()
        found[slots] = True
    return out.clamp(0, 1), found


def initial_images(start: str, seed: int, labels, dataset: str, public=None, device="cpu", dtype=torch.float32):
    """X_hat's start in normalised space, (k,C,H,W): ``start`` "noise" (``noise_start``) or "public"
    (``public_sample`` of ``labels`` from ``public`` = (images, labels) in [0,1], normalised; slots whose
    class the pool lacks keep their noise). ValueError for another start or "public" without a pool."""
    spec = get_spec(dataset)
    k = len(labels)
    x = noise_start(seed, k, spec.image_shape, device, dtype)
    if start == "noise":
        return x
    if start != "public":
        raise ValueError(f"start must be 'noise' or 'public', got {start!r}")
    if public is None:
        raise ValueError("start='public' needs the server's public pool (label_aux)")
    images, found = public_sample(labels, *public, seed=seed)
    x[found] = spec.normalize(images[found]).to(device=device, dtype=dtype)
    return x
