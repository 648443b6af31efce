"""Pictures for humans: image grids (each band shows originals over their matched reconstructions) and
the verdict's evidence (a few singled-out reconstructions beside their own original and the nearest
other candidate)."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont

from fl_attack.records import write_bytes_atomic

PAD = 2
PAD_VALUE = 0.5  # grey gaps, and grey cells where the last band has fewer pairs
EVIDENCE_COLUMNS = ("reconstruction", "its own original", "nearest other candidate")
EVIDENCE_CELL = 96  # px: the evidence picture enlarges each image to at least this width, to be read
EVIDENCE_FONT = 13  # px
EVIDENCE_GAP = 10  # px between columns and between rows


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
    from torchvision.utils import make_grid  # here: torchvision cost every scoring process ~3 s

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


def _to_uint8(images: torch.Tensor) -> list:
    """(N,H,W,3) uint8 arrays of images (N,C,H,W) in [0,1], C = 1 or 3; NaN shows black."""
    x = images.detach().float().cpu().nan_to_num(0.0).clamp(0, 1)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    return list((x.permute(0, 2, 3, 1).numpy() * 255).round().astype("uint8"))


def save_evidence(
    recon: torch.Tensor,
    own: torch.Tensor,
    nearest: torch.Tensor,
    captions: Sequence[Sequence[str]],
    path: str | os.PathLike,
    scale: int | None = None,
) -> Path:
    """Save a PNG of the verdict's evidence: one row per image, the reconstruction ``recon[i]`` | its own
    original ``own[i]`` | the nearest other candidate ``nearest[i]`` (each (n,C,H,W) in [0,1], C = 1 or
    3, one shape), under a header naming the columns (``EVIDENCE_COLUMNS``), each image with its line of
    ``captions[i]`` (three strings, e.g. its 1 - SSIM to the reconstruction) beneath it.

    Black text on white, each image in a 1 px grey frame, columns wide enough for their text. Each
    pixel is enlarged ``scale`` times (None: the least that makes an image ``EVIDENCE_CELL`` px wide,
    4 for 28 px, 3 for 32 px); NaN pixels show black. Written atomically. Raises ValueError, before
    writing, when the shapes differ, the tensors are not floating point with 1 or 3 channels, n is 0,
    captions are not n triples of strings, or scale is neither None nor an int >= 1.
    """
    shapes = {tuple(x.shape) for x in (recon, own, nearest)}
    if len(shapes) != 1 or recon.dim() != 4 or recon.shape[1] not in (1, 3) or recon.shape[0] == 0:
        raise ValueError(
            f"evidence: recon, own and nearest must be (n,C,H,W) of one shape with n >= 1 and C = 1 or 3, got "
            f"{', '.join(str(tuple(x.shape)) for x in (recon, own, nearest))}"
        )
    if not all(x.is_floating_point() for x in (recon, own, nearest)):
        raise ValueError(
            f"evidence: images must be floating point in [0,1], got {recon.dtype}, {own.dtype}, {nearest.dtype}"
        )
    n, _, height, width = recon.shape
    if len(captions) != n or not all(len(row) == 3 and all(isinstance(text, str) for text in row) for row in captions):
        raise ValueError(f"evidence: captions must be {n} triples of strings, one per image")
    if scale is None:
        scale = math.ceil(EVIDENCE_CELL / width)
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"evidence: scale must be None or an int >= 1, got {scale!r}")
    try:
        font = ImageFont.load_default(size=EVIDENCE_FONT)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line = EVIDENCE_FONT + 5
    cell_w, cell_h = width * scale, height * scale
    columns = [
        max(
            [cell_w]
            + [math.ceil(measure.textlength(text, font=font)) for text in (title, *(row[c] for row in captions))]
        )
        for c, title in enumerate(EVIDENCE_COLUMNS)
    ]
    lefts = [EVIDENCE_GAP + sum(columns[:c]) + c * EVIDENCE_GAP for c in range(3)]
    band = cell_h + line + EVIDENCE_GAP
    canvas = Image.new("RGB", (lefts[-1] + columns[-1] + EVIDENCE_GAP, EVIDENCE_GAP + line + n * band), "white")
    draw = ImageDraw.Draw(canvas)

    def centred(text: str, c: int, y: int) -> None:  # without anchors: Pillow's bitmap font has none
        draw.text((lefts[c] + (columns[c] - draw.textlength(text, font=font)) / 2, y), text, fill="black", font=font)

    for c, title in enumerate(EVIDENCE_COLUMNS):
        centred(title, c, EVIDENCE_GAP)
    pictures = [_to_uint8(x) for x in (recon, own, nearest)]
    for i in range(n):
        top = EVIDENCE_GAP + line + i * band
        for c in range(3):
            cell = Image.fromarray(pictures[c][i]).resize((cell_w, cell_h), Image.NEAREST)
            x = lefts[c] + (columns[c] - cell_w) // 2
            draw.rectangle((x - 1, top - 1, x + cell_w, top + cell_h), outline=(160, 160, 160))  # white on white
            canvas.paste(cell, (x, top))
            centred(captions[i][c], c, top + cell_h + 3)
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG")
    return write_bytes_atomic(path, buffer.getvalue())
