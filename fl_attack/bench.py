"""``fl-attack bench``: the cost of one PI-SME optimisation step, ours against the literal loop.

One step = the m node gradients (eq. 8), the objective (eq. 10), its backward through the gradient
(double backward) to X_hat, P1 and d, and the Adam update. Both implementations run in the same
process on the same real client batch, after a warm-up:
- "fast": fl_attack.attacks.pisme (flat weights, batched nodes, one autograd call);
- "reference": fl_attack.attacks.reference, the literal Algorithm-1 loop (one call per node).
Reported per configuration: the median seconds per step, GFLOP/s (counted with
torch.utils.flop_counter on the real step), the fraction of an fp32 GEMM peak measured in the same
process, peak memory, and the largest gradient difference between the two implementations.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from .api import resolve_device
from .attacks import AttackConfig
from .attacks.pisme import PathIntegralSME
from .attacks.reference import pisme_objective_reference
from .data import client_partition, get_spec, load_pool
from .models import build_model
from .training import train_local
from .update import flatten, layout, unflatten


@dataclass
class BenchRow:
    dataset: str
    nodes: int
    samples: int
    impl: str
    seconds_per_step: float
    gflop_per_step: float
    gflops: float
    peak_fraction: float
    peak_memory_mb: float
    max_grad_diff: float


def gemm_peak_gflops(device: torch.device, n: int = 2048, repeats: int = 5) -> float:
    """fp32 GEMM throughput (GFLOP/s) of this process: the best of ``repeats`` n x n matmuls."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        _sync(device)
        t = time.perf_counter()
        (a @ b).sum().item()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


class _NoModuleTracker:
    """Stands in for FlopCounterMode's module tracker, whose backward hooks break the nested
    autograd.grad of the surrogate gradient; totals do not need per-module attribution."""

    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


def count_flops(fn) -> int:
    """FLOPs of ``fn()`` counted by torch.utils.flop_counter (forward and all backward passes)."""
    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _NoModuleTracker()
    with counter:
        fn()
    return counter.get_total_flops()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: "5" resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class _Problem:
    """A real client update and everything a PI-SME step needs, for both implementations."""

    def __init__(self, dataset: str, nodes: int, samples: int, device: torch.device, seed: int = 0):
        spec = get_spec(dataset)
        split = client_partition(load_pool(dataset), 0, samples, seed=seed)
        model = build_model(dataset, seed=seed)
        update = train_local(model, split.train.images, split.train.labels, dataset=dataset,
                             batch_size=min(10, samples), local_epochs=1, seed=seed).update
        self.model = build_model(dataset).to(device)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.shapes = layout(update.w0)
        self.w0_state = {k: v.to(device) for k, v in update.w0.items()}
        self.wT_state = {k: v.to(device) for k, v in update.wT.items()}
        self.nodes = nodes
        self.config = AttackConfig(nodes=nodes)
        self.attack = PathIntegralSME(self.model, flatten(update.w0).to(device), flatten(update.wT).to(device),
                                      self.shapes, self.config)
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, *spec.image_shape, generator=gen).to(device).requires_grad_(True)
        self.y = split.train.labels.to(device)
        groups = [{"params": [self.x], "lr": 1.0}] + [
            {k: v for k, v in g.items() if k != "optimizer"} for g in self.attack.param_groups()]
        self.optimizer = torch.optim.Adam(groups)

    def grads(self, impl: str) -> list[torch.Tensor]:
        a = self.attack
        if impl == "fast":
            loss = a.objective(self.x, self.y)["loss"]
        else:
            loss = pisme_objective_reference(self.model, self.w0_state, self.wT_state,
                                             unflatten(a.control_point, self.shapes),
                                             unflatten(a.calibration, self.shapes), self.x, self.y, self.nodes)
        return list(torch.autograd.grad(loss, [self.x, a.control_point, a.calibration]))

    def step(self, impl: str) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p, g in zip([self.x, self.attack.control_point, self.attack.calibration], self.grads(impl)):
            p.grad = g
        self.optimizer.step()


def bench_one(dataset: str, nodes: int, samples: int, device: torch.device, repeats: int, peak: float) -> list[BenchRow]:
    problem = _Problem(dataset, nodes, samples, device)
    fast, ref = problem.grads("fast"), problem.grads("reference")
    diff = max(float((f - r).abs().max() / r.abs().max().clamp_min(1e-30)) for f, r in zip(fast, ref))
    rows = []
    for impl in ("fast", "reference"):
        problem.step(impl)  # warm-up
        flops = count_flops(lambda: problem.step(impl))
        times = []
        _reset_peak(device)
        for _ in range(repeats):
            _sync(device)
            t = time.perf_counter()
            problem.step(impl)
            _sync(device)
            times.append(time.perf_counter() - t)
        sec = statistics.median(times)
        rows.append(BenchRow(dataset, nodes, samples, impl, sec, flops / 1e9, flops / sec / 1e9,
                             flops / sec / 1e9 / peak, _peak_mb(device), diff))
    return rows


def run_bench(datasets=("cifar100", "femnist"), nodes=(1, 3, 7, 12), samples: int = 50, device="auto",
              repeats: int = 3, threads: int | None = None, progress=print) -> dict:
    """Run the benchmark grid; returns {"device", "threads", "gemm_peak_gflops", "rows": [...]}."""
    device = resolve_device(device)
    if threads:
        torch.set_num_threads(threads)
    peak = gemm_peak_gflops(device)
    rows = []
    progress(HEADER)
    for dataset in datasets:
        for m in nodes:
            for row in bench_one(dataset, m, samples, device, repeats, peak):
                rows.append(row)
                progress(format_row(row))
    return {"device": str(device), "threads": torch.get_num_threads(), "gemm_peak_gflops": peak,
            "torch": torch.__version__, "rows": [asdict(r) for r in rows]}


HEADER = (f"{'dataset':9} {'m':>3} {'k':>3} {'impl':9} {'s/step':>8} {'GFLOP':>7} {'GFLOP/s':>8} "
          f"{'%peak':>6} {'peakMB':>7} {'max|dg|':>8}")


def format_row(r: BenchRow) -> str:
    return (f"{r.dataset:9} {r.nodes:>3} {r.samples:>3} {r.impl:9} {r.seconds_per_step:8.3f} {r.gflop_per_step:7.1f} "
            f"{r.gflops:8.1f} {100 * r.peak_fraction:5.1f}% {r.peak_memory_mb:7.0f} {r.max_grad_diff:8.1e}")


def summarize(result: dict) -> str:
    """Speed-ups (reference / fast) and the m-scaling of the fast step, as text."""
    lines = [f"device {result['device']}, {result['threads']} threads, fp32 GEMM peak "
             f"{result['gemm_peak_gflops']:.1f} GFLOP/s, torch {result['torch']}"]
    rows = result["rows"]
    for dataset in sorted({r["dataset"] for r in rows}):
        by = {(r["nodes"], r["impl"]): r for r in rows if r["dataset"] == dataset}
        for m in sorted({r["nodes"] for r in rows if r["dataset"] == dataset}):
            f, ref = by[(m, "fast")], by[(m, "reference")]
            lines.append(f"{dataset} m={m}: fast {f['seconds_per_step']:.3f} s, reference {ref['seconds_per_step']:.3f} s,"
                         f" speed-up x{ref['seconds_per_step'] / f['seconds_per_step']:.2f}")
        ms = sorted({r["nodes"] for r in rows if r["dataset"] == dataset})
        if 1 in ms and 7 in ms:
            lines.append(f"{dataset}: fast step time at m=7 / m=1 = "
                         f"{by[(7, 'fast')]['seconds_per_step'] / by[(1, 'fast')]['seconds_per_step']:.2f}")
    return "\n".join(lines)
