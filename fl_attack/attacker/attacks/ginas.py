"""GI-NAS (Yu et al., "GI-NAS: Boosting gradient inversion attacks through adaptive neural architecture
search", IEEE TIFS 20 (2025) 7648-7662, arXiv 2405.20725; code github.com/cswbyu/GI-NAS).

The images are the output of an untrained, over-parameterised generator, X_hat = g_theta(z), whose
weights theta are optimised so that the gradient of X_hat matches the update (implicit architectural
priors, after GION, Zhang et al. ICCV 2023, and deep image prior, Ulyanov et al. CVPR 2018). A
training-free search first draws candidate architectures from a U-Net family that varies its
upsampling operation and its skip connections, initialises each at random, and keeps the one with the
lowest matching loss at its initial weights (GI-NAS' search metric: the cosine gradient loss of the
untrained generator's output). No pretrained weights.

Designed for a single-step gradient; as in the PI-SME paper's Table 1 it runs on the multi-step update
as is: the matched gradient is IG's, grad_w CE(f_w0(X_hat), Y), under Lsim + lambda_tv TV (the loss of
GI-NAS' code, ``loss_inverting_gt``), with the recovered labels, Adam at ``lr_generator`` and SME's
x0.1 schedule at 3/8, 5/8 and 7/8 (the code's too). The code's learning rate is 1e-3 over 30,000
iterations; at Table 1's budgets (100 to 1000 iterations) that leaves the generator near its grey
start, so the default is 1e-2 (measured in docs/attack-core.md, "GI-NAS and DGGI").

Our choices where the paper's generator does not fit this machine (docs/attack-core.md, "GI-NAS"):
- depth 3 instead of 5 (28x28 and 32x32 images go down to 4x4), and a width from GION's
  over-parameterisation rule (``AttackConfig.generator_width`` 0: the smallest power of two >= 16 whose
  generator has more than 4 k C H W weights, at most 128; GI-NAS fixes 128);
- the search space: for each decoder level l (0 = full resolution), three on/off connections summed
  into its input, a same-scale skip from encoder level l, a cross-scale upsampling skip from encoder
  level l+1 and a cross-scale downsampling skip from encoder level l-1 (GI-NAS' 5x5 skip matrix at
  depth 3: 8 bits, level 0 has no shallower level), times four upsampling operations (nearest,
  bilinear, bicubic, transposed convolution): 1024 architectures, of which ``generator_candidates``
  (default 16) are drawn without replacement with the attack's seed and scored;
- the input z ~ N(0, I) of shape (k, C, H, W) with C the image's channels, drawn with the seed.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fl_attack.attacker.attacks.base import lsim, register
from fl_attack.attacker.attacks.ig import InvertingGradients
from fl_attack.federation.pools import get_spec

UPSAMPLING = ("nearest", "bilinear", "bicubic", "transposed")
DEPTH = 3
SKIP_BITS = 3 * DEPTH - 1  # same-scale and up-skip at every level, down-skip at levels 1..DEPTH-1


def architectures() -> list[tuple[str, tuple[int, ...]]]:
    """The search space: (upsampling, skip bits) for every combination, 4 x 2^8 = 1024 entries.
    Skip bits, level by level from 0: (same-scale, up-skip) at level 0, then (same, up, down)."""
    return [(up, bits) for up in UPSAMPLING for bits in itertools.product((0, 1), repeat=SKIP_BITS)]


def _skips(bits: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Skip bits -> per decoder level (same-scale, up-skip, down-skip)."""
    levels, rest = [(bits[0], bits[1], 0)], list(bits[2:])
    for _ in range(1, DEPTH):
        levels.append((rest.pop(0), rest.pop(0), rest.pop(0)))
    return levels


def _block(cin: int, cout: int, stride: int = 1, kernel: int = 3) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2), nn.BatchNorm2d(cout), nn.LeakyReLU(0.2)
    )


class _Up(nn.Module):
    """Upsampling of (N,w,h,w') to a given size: interpolation, or a transposed convolution cropped."""

    def __init__(self, mode: str, width: int):
        super().__init__()
        self.mode = mode
        self.conv = nn.ConvTranspose2d(width, width, 4, stride=2, padding=1) if mode == "transposed" else None

    def forward(self, h: torch.Tensor, size) -> torch.Tensor:
        if self.conv is not None:
            out = self.conv(h)
            if out.shape[-2] < size[0] or out.shape[-1] < size[1]:
                out = F.interpolate(out, size=size, mode="nearest")
            return out[..., : size[0], : size[1]]
        return F.interpolate(
            h, size=size, mode=self.mode, **({} if self.mode == "nearest" else {"align_corners": False})
        )


class Generator(nn.Module):
    """g_theta(z): a U-Net of GI-NAS' family at depth 3 (module docstring).

    Encoder levels 1..3 halve the resolution (a stride-2 conv then a conv, each with batch norm and
    LeakyReLU 0.2); decoder level l (3 down to 0) takes the sum of the upsampled deeper decoder output
    and the chosen skips, then two 3x3 conv blocks and a 1x1 one (GI-NAS' decoder block); the output is
    sigmoid(1x1 conv), images in [0,1]. ``forward(z)``: z (k,C,H,W) -> (k,C,H,W) in [0,1]. Batch norm
    uses the k images' statistics (train mode, as deep image prior's generators).
    """

    def __init__(self, channels: int, width: int, upsampling: str, bits: tuple[int, ...]):
        super().__init__()
        if upsampling not in UPSAMPLING or len(bits) != SKIP_BITS:
            raise ValueError(f"unknown architecture ({upsampling!r}, {bits!r}); see ginas.architectures()")
        self.upsampling, self.bits, self.levels = upsampling, tuple(bits), _skips(tuple(bits))
        w = width
        self.encoders = nn.ModuleList(
            [nn.Sequential(_block(channels if i == 0 else w, w, stride=2), _block(w, w)) for i in range(DEPTH)]
        )
        self.inc = _block(channels, w)  # level 0's features for the skips (encoder level 0 = z)
        self.same = nn.ModuleList([_block(w, w, kernel=1) if s else nn.Identity() for s, _, _ in self.levels])
        self.up_skip = nn.ModuleList([_Up(upsampling, w) if u else nn.Identity() for _, u, _ in self.levels])
        self.down_skip = nn.ModuleList([_block(w, w, stride=2) if d else nn.Identity() for _, _, d in self.levels])
        self.ups = nn.ModuleList([_Up(upsampling, w) for _ in range(DEPTH)])
        self.decoders = nn.ModuleList(
            [nn.Sequential(_block(w, w), _block(w, w), _block(w, w, kernel=1)) for _ in range(DEPTH + 1)]
        )
        self.out = nn.Conv2d(w, channels, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        feats = [self.inc(z)]  # level 0 at full resolution
        h = z
        for enc in self.encoders:
            h = enc(h)
            feats.append(h)  # levels 1..DEPTH
        d = self.decoders[DEPTH](feats[DEPTH])
        for level in range(DEPTH - 1, -1, -1):
            size = feats[level].shape[-2:]
            total = self.ups[level](d, size)
            same, up, down = self.levels[level]
            if same:
                total = total + self.same[level](feats[level])
            if up:
                total = total + self.up_skip[level](feats[level + 1], size)
            if down:
                total = total + self.down_skip[level](feats[level - 1])[..., : size[0], : size[1]]
            d = self.decoders[level](total)
        return torch.sigmoid(self.out(d))


def rule_width(k: int, image_shape) -> int:
    """GION's over-parameterisation rule at our depth: the smallest width in 16, 32, 64, 128 whose
    generator (the architecture with every skip) has more than 4 k C H W weights; 128 at most."""
    c, h, w = image_shape
    width = 16
    while width < 128:
        full = Generator(c, width, "transposed", (1,) * SKIP_BITS)
        if sum(p.numel() for p in full.parameters()) > 4 * k * c * h * w:
            break
        width *= 2
    return width


@register
class GINAS(InvertingGradients):
    """X_hat = g_theta(z) with the searched architecture; theta fitted under IG's objective."""

    name = "ginas"
    batchable = False  # one generator per client
    generates_images = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.training is None:
            raise ValueError("ginas needs the update's metadata (its dataset and k) to build its generator")
        self.spec = get_spec(self.training.dataset)
        k, shape = int(self.training.num_samples), self.spec.image_shape
        self.width = self.config.generator_width or rule_width(k, shape)
        gen = torch.Generator().manual_seed(int(self.config.seed))
        self.noise = torch.randn(k, *shape, generator=gen).to(device=self.w0.device, dtype=self.w0.dtype)
        self.generator = None
        self.candidate, self.search_lsim, self.searched = -1, float("nan"), []

    def _build(self, index: int, upsampling: str, bits) -> Generator:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.config.seed) * 100003 + index)
            net = Generator(self.spec.image_shape[0], self.width, upsampling, bits)
        return net.to(device=self.w0.device, dtype=self.w0.dtype).train()

    def prepare(self, x, y):
        """The training-free search: ``generator_candidates`` architectures drawn with the seed, each
        scored by the honest Lsim of its untrained output; the lowest is kept (ties: the first)."""
        space = architectures()
        rng = np.random.default_rng(int(self.config.seed))
        picks = rng.choice(len(space), size=min(self.config.generator_candidates, len(space)), replace=False)
        best = None
        for index in picks.tolist():
            net = self._build(index, *space[index])
            with torch.enable_grad():
                g = self.surrogate_gradient(self.spec.normalize(net(self.noise)), y).detach()
            score = float(lsim(g, self.delta_w))
            self.searched.append((index, score))
            if best is None or score < best[1]:
                best = (index, score, net)
        self.candidate, self.search_lsim, self.generator = best

    def param_groups(self):
        if self.generator is None:
            raise RuntimeError("ginas: prepare(x, y) (the architecture search) must run before the optimiser is built")
        return [{"params": list(self.generator.parameters()), "lr": self.config.lr_generator}]

    def images(self, x):
        return self.spec.normalize(self.generator(self.noise))

    def summary(self):
        return {"generator_candidate": self.candidate, "search_lsim": self.search_lsim, "generator_width": self.width}
