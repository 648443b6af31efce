"""Image grids for humans: each band shows originals over their matched reconstructions."""

from __future__ import annotations

import io
import os
from pathlib import Path

import torch
from PIL import Image
from torchvision.utils import make_grid

from fl_attack.records import write_bytes_atomic

PAD = 2
PAD_VALUE = 0.5  # grey gaps, and grey cells where the last band has fewer pairs


def save_comparison_grid(
    truth: torch.Tensor | None, recon: torch.Tensor, path: str | os.PathLike, columns: int = 16, scale: int = 2
) -> Path:
    """Save a PNG of every pair: ``truth`` (N,C,H,W) in [0,1] above ``recon`` (matched order, same shape).
    truth None (an audit without the ground truth): the reconstructions alone, in bands of ``columns``.

    Pairs fill bands of ``columns``; each band is a row of originals over the row of their
    reconstructions, 2 px grey gaps. Each pixel is enlarged ``scale`` times; NaN pixels show black.
    Written atomically. Raises ValueError, before writing, when the shapes differ, the tensors are
    not floating point with 1 or 3 channels, N is 0, or columns or scale is not an int >= 1.
    """
    alone = truth is None
    truth = recon if alone else truth
    if truth.shape != recon.shape or truth.dim() != 4 or truth.shape[1] not in (1, 3):
        raise ValueError(
            f"truth and recon must be (N,C,H,W) of one shape with C = 1 or 3, got "
            f"{tuple(truth.shape)} and {tuple(recon.shape)}"
        )
    if not (truth.is_floating_point() and recon.is_floating_point()):
        raise ValueError(f"images must be floating point in [0,1], got {truth.dtype} and {recon.dtype}")
    if truth.shape[0] == 0 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (columns, scale)
    ):
        raise ValueError(
            f"need at least one image, and columns and scale as ints >= 1; got "
            f"N={truth.shape[0]}, columns={columns!r}, scale={scale!r}"
        )
    n = truth.shape[0]
    per_band = min(n, columns)
    both = torch.cat([truth, recon]).detach().float().cpu().nan_to_num(0.0).clamp(0, 1)
    if both.shape[1] == 1:
        both = both.repeat(1, 3, 1, 1)
    truth, recon = both[:n], both[n:]
    bands = []
    for start in range(0, n, per_band):
        rows = [truth[start : start + per_band], recon[start : start + per_band]][alone:]
        missing = per_band - rows[0].shape[0]
        if missing:
            blank = torch.full((missing, *truth.shape[1:]), PAD_VALUE)
            rows = [torch.cat([r, blank]) for r in rows]
        bands.append(make_grid(torch.cat(rows), nrow=per_band, padding=PAD, pad_value=PAD_VALUE))
    grid = torch.cat([bands[0]] + [band[:, PAD:] for band in bands[1:]], dim=1)  # one gap between bands
    image = Image.fromarray((grid.permute(1, 2, 0).numpy() * 255).round().astype("uint8"))
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return write_bytes_atomic(path, buffer.getvalue())
