"""Image grids for humans: each band shows originals over their matched reconstructions."""
from __future__ import annotations

import io
import os
from pathlib import Path

import torch
from PIL import Image
from torchvision.utils import make_grid

from .records import write_bytes_atomic

PAD = 2
PAD_VALUE = 0.5  # grey gaps, and grey cells where the last band has fewer pairs


def save_comparison_grid(truth: torch.Tensor, recon: torch.Tensor, path: str | os.PathLike,
                         columns: int = 16, scale: int = 2) -> Path:
    """Save a PNG of every pair: ``truth`` (N,C,H,W) in [0,1] above ``recon`` (matched order, same shape).

    Pairs fill bands of ``columns``; each band is a row of originals over the row of their
    reconstructions, 2 px grey gaps. Each pixel is enlarged ``scale`` times. Written atomically.
    Raises ValueError when the shapes differ, N is 0, or columns or scale is below 1.
    """
    if truth.shape != recon.shape or truth.dim() != 4:
        raise ValueError(f"truth and recon must be (N,C,H,W) of one shape, got {tuple(truth.shape)} and "
                         f"{tuple(recon.shape)}")
    if truth.shape[0] == 0 or columns < 1 or scale < 1:
        raise ValueError(f"need at least one image, columns >= 1 and scale >= 1; got N={truth.shape[0]}, "
                         f"columns={columns}, scale={scale}")
    n = truth.shape[0]
    per_band = min(n, columns)
    both = torch.cat([truth, recon]).detach().float().cpu().clamp(0, 1)
    if both.shape[1] == 1:
        both = both.repeat(1, 3, 1, 1)
    truth, recon = both[:n], both[n:]
    bands = []
    for start in range(0, n, per_band):
        rows = [truth[start:start + per_band], recon[start:start + per_band]]
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
