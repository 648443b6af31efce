"""The comparison grid every run writes (fl_attack/evaluation/images.py): layout, pixels, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fl_attack.evaluation.images import save_comparison_grid
from fl_attack.federation.data import client_partition, load_pool


@pytest.fixture(scope="module")
def cifar_images():
    """20 real CIFAR-100 images in [0,1] (NCHW) and a fixed 'reconstruction' of them."""
    images = client_partition(load_pool("cifar100"), 0, 20).train.images[:20]
    recon = (1 - images).clamp(0, 1)
    return images, recon


def test_every_pair_in_bands_with_exact_pixels(tmp_path, cifar_images):
    truth, recon = cifar_images
    path = save_comparison_grid(truth, recon, tmp_path / "sub" / "grid.png", columns=8, scale=1)
    grid = np.asarray(Image.open(path).convert("RGB"))
    cell = 32 + 2
    assert grid.shape == (3 * 2 * cell + 2, 8 * cell + 2, 3)  # 20 pairs in 3 bands of 8
    for j in (0, 7, 8, 19):
        band, col = divmod(j, 8)
        y, x = 2 + band * 2 * cell, 2 + col * cell
        for row, source in enumerate((truth, recon)):
            expected = (source[j].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            assert np.array_equal(grid[y + row * cell : y + row * cell + 32, x : x + 32], expected)
    # the last band's 4 empty cells are grey, like the gaps
    empty = grid[2 + 2 * 2 * cell : 2 + 2 * 2 * cell + 32, 2 + 4 * cell : 2 + 4 * cell + 32]
    assert (empty == 128).all()
    assert [p.name for p in path.parent.iterdir()] == ["grid.png"]  # no temporary left


def test_grayscale_scale_and_nan(tmp_path):
    images = client_partition(load_pool("femnist"), 0, 5).train.images[:5]
    recon = images.clone()
    recon[0, 0, 0, 0] = float("nan")  # a diverged reconstruction still gets its grid
    path = save_comparison_grid(images, recon, tmp_path / "g.png", scale=2)
    with Image.open(path) as image:
        assert image.size == (2 * (5 * 30 + 2), 2 * (2 * 30 + 2))  # one band of 5 pairs, scaled x2
        assert image.getpixel((2 * 2, 2 * (2 + 30))) == (0, 0, 0)


def test_bad_input_is_rejected_before_writing(tmp_path, cifar_images):
    truth, recon = cifar_images
    with pytest.raises(ValueError, match="one shape"):
        save_comparison_grid(truth, recon[:3], tmp_path / "a.png")
    with pytest.raises(ValueError, match="columns"):
        save_comparison_grid(truth, recon, tmp_path / "a.png", columns=0)
    with pytest.raises(ValueError, match="at least one image"):
        save_comparison_grid(truth[:0], recon[:0], tmp_path / "a.png")
    with pytest.raises(ValueError, match="floating point"):
        save_comparison_grid((truth * 255).byte(), (recon * 255).byte(), tmp_path / "a.png")
    with pytest.raises(ValueError, match="C = 1 or 3"):
        save_comparison_grid(truth[:, :2], recon[:, :2], tmp_path / "a.png")
    with pytest.raises(ValueError, match="ints"):
        save_comparison_grid(truth, recon, tmp_path / "a.png", scale=1.5)
    assert not list(tmp_path.iterdir())
