"""Image grids for humans: originals in the top row, matched reconstructions below."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from PIL import Image
from torchvision.utils import make_grid


def save_comparison_grid(truth: torch.Tensor, recon: torch.Tensor, path: str | os.PathLike,
                         max_images: int = 16, scale: int = 2) -> Path:
    """Save a PNG: ``truth`` (N,C,H,W) in [0,1] in the top row, ``recon`` (matched order) below.

    At most ``max_images`` columns; each pixel enlarged ``scale`` times. Written atomically.
    Raises ValueError when the shapes differ.
    """
    if truth.shape != recon.shape:
        raise ValueError(f"truth and recon must have the same shape, got {tuple(truth.shape)} and {tuple(recon.shape)}")
    n = min(max_images, truth.shape[0])
    both = torch.cat([truth[:n], recon[:n]]).detach().float().cpu().clamp(0, 1)
    if both.shape[1] == 1:
        both = both.repeat(1, 3, 1, 1)
    grid = make_grid(both, nrow=n, padding=2, pad_value=0.5)
    array = (grid.permute(1, 2, 0).numpy() * 255).round().astype("uint8")
    image = Image.fromarray(array)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    image.save(tmp)
    os.replace(tmp, path)
    return path
