"""The diffusion prior: a small denoising diffusion model (DDPM) per dataset, trained by the server on
its public pool only and shipped small in ``fl_attack/assets``.

DGGI (Wu et al., "DGGI: Deep generative gradient inversion with diffusion model", Information Fusion
113 (2025) 102620) guides a gradient inversion with a diffusion model as its image prior
(``fl_attack.attacker.attacks.dggi``). The server here has no pretrained model and no download: it trains one on
the data it already holds, its **public pool**, the held-out set of its centralised evaluation and of
the ``aux`` label estimator (``fl_attack.federation.data.server_test_set`` of ``PUBLIC_SAMPLES`` = 1000 samples with
seed 0, the run config's default ``server-test-samples`` and the verdict's ``DEFAULT_PUBLIC_SAMPLES``):

* femnist: 1000 LEAF-test samples of the bundled pool; no client ever trains on a LEAF-test sample.
* cifar100: the last 1000 images of the bundled pool's seed-0 permutation, the ones the federation
  holds out of every client (``client_partition(..., held_out=1000)``) and that the experiments'
  clients (the first blocks of the same permutation) never reach.

The model (Ho, Jain and Abbeel, NeurIPS 2020): the forward process q(x_t | x_0) = N(sqrt(abar_t) x_0,
(1 - abar_t) I) with the linear schedule beta_t from 1e-4 to 0.02 over ``DIFFUSION_STEPS`` = 1000 steps
(their eq. 4), and a U-Net ``Denoiser`` eps_theta(x_t, t) trained on the simple loss
||eps - eps_theta(sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps, t)||^2 (their eq. 14). Images enter the
model in [-1, 1] (2 x - 1 of images in [0, 1]). Sampling and denoising use the deterministic DDIM
update (Song, Meng and Ermon, ICLR 2021, eq. 12 with eta = 0) on a strided subset of the steps.

Files: ``diffusion_{dataset}.pt`` (the denoiser's float16 state dict, its exponential moving average)
and ``diffusion_{dataset}.json`` (how it was trained: the training set, steps, wall time, the loss
history; :func:`prior_info`). Train with ``python -m fl_attack.attacker.diffusion --dataset femnist|cifar100``
(``--help``); it also writes a grid of samples (``--grid PATH``). This module is on the attacker's side
(the layers contract, pyproject.toml): it reads the public pool, never a client's samples.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fl_attack.federation.loading import load_bundled
from fl_attack.federation.partition import server_test_set
from fl_attack.federation.pools import DATASETS, ClientData, DatasetSpec, get_spec
from fl_attack.federation.update import save_torch_atomic
from fl_attack.paths import asset
from fl_attack.records import write_json_atomic

__all__ = [
    "DIFFUSION_STEPS",
    "PUBLIC_SAMPLES",
    "Denoiser",
    "DiffusionPrior",
    "public_pool",
    "load_prior",
    "prior_info",
    "train_prior",
    "check_prior",
    "main",
]

DIFFUSION_STEPS = 1000  # T of the forward process (Ho et al. 2020)
BETA_START, BETA_END = 1e-4, 0.02  # their linear schedule
PUBLIC_SAMPLES = 1000  # the server's public pool: run config server-test-samples, verdict DEFAULT_PUBLIC_SAMPLES
PUBLIC_SEED = 0
WIDTHS = (32, 64, 64)  # channels of the U-Net's three resolutions
ASSETS = Path(__file__).resolve().parents[1] / "assets"


def public_pool(dataset: str, samples: int = PUBLIC_SAMPLES, seed: int = PUBLIC_SEED) -> ClientData:
    """The server's public pool of ``dataset``: ``server_test_set(load_bundled(dataset), samples, seed)``,
    images float32 (n,C,H,W) in [0,1]. The diffusion prior's only training data (module docstring)."""
    return server_test_set(load_bundled(dataset), samples, seed=seed)


# ---------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------


def _timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal embedding (N, dim) of integer steps t (N,) (the Transformer's, as in Ho et al.)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.to(torch.float32)[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class _ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2, self.conv2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.temb(temb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class Denoiser(nn.Module):
    """eps_theta(x_t, t): a small U-Net (``WIDTHS`` = 32, 64, 64 channels at full, 1/2 and 1/4
    resolution, one residual block with GroupNorm, SiLU and the step's embedding per level and side,
    about 0.62 M parameters, a 1.2 MB float16 state dict).

    ``forward(x, t)``: x float (N,C,H,W), the noisy images in the model's [-1, 1] scale (C, H, W of the
    dataset: femnist 1x28x28, cifar100 3x32x32); t int64 (N,) steps in [0, DIFFUSION_STEPS). Returns the
    predicted noise (N,C,H,W). Raises ValueError for an unknown dataset or images of another shape.
    """

    def __init__(self, dataset: str, widths: tuple[int, int, int] = WIDTHS):
        super().__init__()
        spec = get_spec(dataset)
        self.dataset, self.image_shape = spec.name, spec.image_shape
        c = spec.image_shape[0]
        a, b, d = widths
        tdim = 4 * a
        self.time = nn.Sequential(nn.Linear(a, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inc = nn.Conv2d(c, a, 3, padding=1)
        self.down1 = _ResBlock(a, a, tdim)
        self.pool1 = nn.Conv2d(a, a, 3, stride=2, padding=1)
        self.down2 = _ResBlock(a, b, tdim)
        self.pool2 = nn.Conv2d(b, b, 3, stride=2, padding=1)
        self.down3 = _ResBlock(b, d, tdim)
        self.mid = _ResBlock(d, d, tdim)
        self.up3 = _ResBlock(d + d, d, tdim)
        self.up2 = _ResBlock(d + b, b, tdim)
        self.up1 = _ResBlock(b + a, a, tdim)
        self.out = nn.Sequential(nn.GroupNorm(8, a), nn.SiLU(), nn.Conv2d(a, c, 3, padding=1))
        self.width = a

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.image_shape:
            c, h, w = self.image_shape
            raise ValueError(f"denoiser ({self.dataset}): expected images (N,{c},{h},{w}), got {tuple(x.shape)}")
        temb = self.time(_timestep_embedding(t, self.width))
        h1 = self.down1(self.inc(x), temb)
        h2 = self.down2(self.pool1(h1), temb)
        h3 = self.down3(self.pool2(h2), temb)
        h = self.mid(h3, temb)
        h = self.up3(torch.cat([h, h3], 1), temb)
        h = F.interpolate(h, size=h2.shape[-2:], mode="nearest")
        h = self.up2(torch.cat([h, h2], 1), temb)
        h = F.interpolate(h, size=h1.shape[-2:], mode="nearest")
        h = self.up1(torch.cat([h, h1], 1), temb)
        return self.out(h)


# ---------------------------------------------------------------------------
# The diffusion process
# ---------------------------------------------------------------------------


class DiffusionPrior:
    """A trained ``Denoiser`` with its noise schedule: forward noising, DDIM denoising and sampling.

    Every method takes and returns images in [0,1], (N,C,H,W), on the denoiser's device; ``generator``
    (a torch.Generator on the CPU) makes the noise reproducible. The denoiser is frozen (eval mode, no
    gradients); float32 arithmetic.
    """

    def __init__(self, denoiser: Denoiser):
        self.denoiser = denoiser.eval()
        for p in self.denoiser.parameters():
            p.requires_grad_(False)
        betas = torch.linspace(BETA_START, BETA_END, DIFFUSION_STEPS, dtype=torch.float64)
        self.alpha_bar = torch.cumprod(1 - betas, 0).to(torch.float32)  # abar_t, (DIFFUSION_STEPS,)
        self.dataset = denoiser.dataset

    @property
    def device(self) -> torch.device:
        return next(self.denoiser.parameters()).device

    def to(self, device) -> DiffusionPrior:
        self.denoiser.to(device)
        return self

    def _noise(self, shape, generator: torch.Generator | None) -> Tensor:
        return torch.randn(shape, generator=generator).to(self.device)

    @torch.no_grad()
    def denoise(self, images: Tensor, start: int, steps: int, generator: torch.Generator | None = None) -> Tensor:
        """Diffuse ``images`` to step ``start`` (q(x_start | x_0), one draw of noise) and run ``steps``
        deterministic DDIM steps back to x_0 (SDEdit's projection onto the prior; Meng et al., ICLR 2022).

        images: (N,C,H,W) in [0,1]; start in [1, DIFFUSION_STEPS); steps >= 1 (at most start).
        Returns (N,C,H,W) float32 in [0,1]. ValueError for a start or steps out of range.
        """
        if not 1 <= int(start) < DIFFUSION_STEPS:
            raise ValueError(f"the diffusion start step must be in [1, {DIFFUSION_STEPS}), got {start}")
        if int(steps) < 1:
            raise ValueError(f"the DDIM steps must be >= 1, got {steps}")
        x0 = images.to(device=self.device, dtype=torch.float32).clamp(0, 1) * 2 - 1
        a = self.alpha_bar[int(start)].to(self.device)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * self._noise(x0.shape, generator)
        return self._ddim(xt, int(start), int(steps))

    @torch.no_grad()
    def sample(self, n: int, steps: int = 100, generator: torch.Generator | None = None) -> Tensor:
        """``n`` images (n,C,H,W) in [0,1] drawn with ``steps`` DDIM steps from pure noise."""
        x = self._noise((int(n), *self.denoiser.image_shape), generator)
        return self._ddim(x, DIFFUSION_STEPS - 1, int(steps))

    def _ddim(self, x: Tensor, start: int, steps: int) -> Tensor:
        """Deterministic DDIM (eta = 0) from step ``start`` to 0 over ``steps`` evenly strided steps."""
        ts = torch.linspace(start, 0, min(steps, start) + 1).round().long().tolist()
        ab = self.alpha_bar.to(self.device)
        for t, t_next in zip(ts[:-1], ts[1:]):
            eps = self.denoiser(x, torch.full((x.shape[0],), t, dtype=torch.long, device=x.device))
            x0 = ((x - (1 - ab[t]).sqrt() * eps) / ab[t].sqrt()).clamp(-1, 1)
            x = ab[t_next].sqrt() * x0 + (1 - ab[t_next]).sqrt() * eps if t_next > 0 else x0
        return ((x + 1) / 2).clamp(0, 1)


def _weights_file(dataset: str) -> str:
    return f"diffusion_{get_spec(dataset).name}.pt"


@functools.cache
def check_prior(dataset: str) -> DatasetSpec:
    """The spec of ``dataset``, which must have a diffusion prior (``DatasetSpec.prior_steps``): ValueError
    naming the dataset otherwise, before anything is loaded or trained (and in a run's preflight, when an
    attack needs the prior: fl_attack.audit.settings.RunSettings.check_together)."""
    spec = get_spec(dataset)
    if spec.prior_steps is None:
        with_prior = ", ".join(sorted(n for n, s in DATASETS.items() if s.prior_steps))
        raise ValueError(
            f"{spec.name} has no diffusion prior (DatasetSpec.prior_steps is None): DGGI and image_prior "
            f"'diffusion' need one; datasets with a prior: {with_prior}"
        )
    return spec


def _loaded(dataset: str) -> Denoiser:
    model = Denoiser(dataset)
    state = torch.load(asset(_weights_file(dataset)), map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()


def load_prior(dataset: str, device: str | torch.device = "cpu") -> DiffusionPrior:
    """The shipped diffusion prior of ``dataset`` (``diffusion_{dataset}.pt``) on ``device``; the weights
    are read once per process, each call gets its own copy. ValueError for a dataset without a prior
    (``DatasetSpec.prior_steps`` None: femnist-digits); FileNotFoundError when it is not shipped
    (train it with ``python -m fl_attack.attacker.diffusion --dataset DATASET``)."""
    spec = check_prior(dataset)
    model = Denoiser(spec.name)
    model.load_state_dict(_loaded(spec.name).state_dict())
    return DiffusionPrior(model).to(device)


def prior_info(dataset: str) -> dict:
    """The sidecar ``diffusion_{dataset}.json``: how the shipped prior was trained."""
    return json.loads(asset(f"diffusion_{check_prior(dataset).name}.json").read_text())


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def train_prior(
    dataset: str,
    *,
    steps: int | None = None,
    batch_size: int = 64,
    lr: float = 2e-3,
    ema: float = 0.995,
    seed: int = 0,
    threads: int = 1,
    out: str | Path = ASSETS,
    grid: str | Path | None = None,
    log=print,
) -> dict:
    """Train the diffusion prior of ``dataset`` on the server's public pool (:func:`public_pool`) and
    write ``diffusion_{dataset}.pt`` (the EMA weights in float16) and its JSON sidecar under ``out``;
    ``grid``: a PNG of 64 DDIM samples (100 steps) beside 32 training images. Returns the sidecar.

    DDPM's simple loss (module docstring) with a uniformly drawn step per image; AdamW (weight decay
    0) at ``lr`` with a 200-step warm-up and cosine decay over ``steps`` optimiser steps of
    ``batch_size`` images; random horizontal flips for cifar100 (none for handwriting); an exponential
    moving average ``ema`` of the weights is what ships. Deterministic in ``seed`` up to the CPU's
    arithmetic. ValueError for steps or batch_size < 1.
    """
    spec = check_prior(dataset)
    steps = spec.prior_steps if steps is None else int(steps)
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    torch.set_num_threads(max(1, int(threads)))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    pool = public_pool(spec.name)
    x_all = pool.images * 2 - 1  # (n,C,H,W) in [-1,1]
    n = len(x_all)
    model = Denoiser(spec.name)
    params = sum(p.numel() for p in model.parameters())
    averaged = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = min(200, steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))
        ),
    )
    alpha_bar = DiffusionPrior(Denoiser(spec.name)).alpha_bar
    start = time.perf_counter()
    history, running = [], 0.0
    log(f"diffusion prior {spec.name}: {n} public images, {params} parameters, {steps} steps of {batch_size}")
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(0, n, (batch_size,), generator=gen)
        x0 = x_all[idx]
        if spec.hflip:
            flip = torch.rand(batch_size, generator=gen) < 0.5
            x0 = torch.where(flip[:, None, None, None], x0.flip(-1), x0)
        t = torch.randint(0, DIFFUSION_STEPS, (batch_size,), generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        a = alpha_bar[t][:, None, None, None]
        loss = F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * eps, t), eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            for k, v in model.state_dict().items():
                averaged[k].mul_(ema).add_(v.detach(), alpha=1 - ema) if v.is_floating_point() else averaged[k].copy_(v)
        running += float(loss.detach())
        if step % 250 == 0 or step == steps:
            count = 250 if step % 250 == 0 else step % 250
            history.append(
                {"step": step, "loss": round(running / count, 5), "seconds": round(time.perf_counter() - start, 1)}
            )
            log(f"step {step}/{steps}: loss {running / count:.4f}  {time.perf_counter() - start:.0f} s")
            running = 0.0
    wall = time.perf_counter() - start
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    weights = out / _weights_file(spec.name)
    state = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in averaged.items()}
    sha = save_torch_atomic(weights, state)
    info = {
        "dataset": spec.name,
        "architecture": f"Denoiser (U-Net) widths={list(WIDTHS)}, GroupNorm+SiLU residual blocks, "
        "sinusoidal step embedding",
        "params": params,
        "weights_bytes": weights.stat().st_size,
        "weights_sha256": sha,
        "weights_dtype": "float16 (exponential moving average of the weights)",
        "process": f"DDPM, linear betas {BETA_START}..{BETA_END} over {DIFFUSION_STEPS} steps, "
        "eps-prediction, simple loss",
        "training_set": {
            "description": "the server's public pool: fl_attack.federation.data.server_test_set("
            f"load_bundled('{spec.name}'), "
            f"{PUBLIC_SAMPLES}, seed={PUBLIC_SEED}) (fl_attack.attacker.diffusion.public_pool); no client's sample",
            "size": n,
            "sha256_of_images": _images_sha256(pool.images),
        },
        "steps": steps,
        "batch_size": batch_size,
        "optimizer": f"AdamW lr {lr}, weight decay 0, {warmup}-step warm-up then cosine decay; EMA {ema}",
        "augmentation": "random horizontal flip" if spec.hflip else "none",
        "seed": seed,
        "threads": int(threads),
        "wall_seconds": round(wall, 1),
        "torch_version": torch.__version__,
        "final_loss": history[-1]["loss"],
        "history": history,
        "command": f"python -m fl_attack.attacker.diffusion --dataset {spec.name} --steps {steps} --seed {seed} "
        f"--threads {threads}",
    }
    write_json_atomic(out / f"diffusion_{spec.name}.json", info)
    if grid is not None:
        _write_grid(Path(grid), weights, spec.name, pool.images[:32], seed)
    log(f"diffusion prior {spec.name}: final loss {history[-1]['loss']}, {wall:.0f} s, {weights.stat().st_size} bytes")
    return info


def _images_sha256(images: Tensor) -> str:
    import hashlib

    return hashlib.sha256((images * 255).round().to(torch.uint8).numpy().tobytes()).hexdigest()


def _write_grid(path: Path, weights: Path, dataset: str, real: Tensor, seed: int) -> None:
    """64 DDIM samples (100 steps) of the weights just written, then 32 of the public images."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = Denoiser(dataset)
    model.load_state_dict({k: v.float() for k, v in torch.load(weights, weights_only=True).items()})
    samples = DiffusionPrior(model).sample(64, steps=100, generator=torch.Generator().manual_seed(seed + 1))
    rows = [samples[i : i + 16] for i in range(0, 64, 16)] + [real[:16], real[16:32]]
    tiles = torch.cat([torch.cat(list(r), dim=-1) for r in rows], dim=-2)  # (C, 6H, 16W)
    image = tiles.permute(1, 2, 0).numpy()
    fig = plt.figure(figsize=(8, 3.4))
    ax = fig.add_axes([0, 0, 1, 0.92])
    ax.imshow(np.squeeze(image), cmap="gray" if image.shape[-1] == 1 else None, vmin=0, vmax=1)
    ax.axis("off")
    fig.suptitle(f"diffusion prior ({dataset}): 64 samples (rows 1-4), public training images (rows 5-6)", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``python -m fl_attack.attacker.diffusion --dataset femnist|cifar100 [--steps N] [--seed 0] [--threads 1]
    [--out fl_attack/assets] [--grid PNG]``: train and write the diffusion prior (:func:`train_prior`)."""
    ap = argparse.ArgumentParser(
        prog="python -m fl_attack.attacker.diffusion", description=train_prior.__doc__.split("\n")[0]
    )
    ap.add_argument("--dataset", required=True, choices=sorted(n for n, s in DATASETS.items() if s.prior_steps))
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"optimiser steps, default { ({n: s.prior_steps for n, s in DATASETS.items() if s.prior_steps}) }",
    )
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ASSETS), help="folder for diffusion_<dataset>.pt/.json")
    ap.add_argument("--grid", default=None, help="a PNG of samples beside public training images")
    args = ap.parse_args(argv)
    train_prior(
        args.dataset,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        threads=args.threads,
        out=args.out,
        grid=args.grid,
        log=lambda s: print(s, flush=True),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
