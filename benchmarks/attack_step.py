"""``python -m benchmarks.attack_step``: the cost of one PI-SME optimisation step, ours against the literal loop.

One step = the m node gradients (eq. 8), the objective (eq. 10), its double backward to X_hat, P1 and
d, and the Adam update, on a real client batch after a warm-up: "fast" is fl_attack.attacker.attacks.pisme
(the structured path of fl_attack.attacker.attacks.gradients), "reference" the literal Algorithm-1 loop of
tests/reference.py. Each benchmark alternates what it compares (a step of one, a step of the other),
so a machine whose speed drifts biases none, and reports medians; docs/performance.md explains the
columns (GFLOP/s from torch.utils.flop_counter, %peak against a GEMM peak measured in the same
process before and after the grid, peak memory, the gradients' largest relative difference in
float64 and float32).

``--batched N``: N whole attacks on N real clients of one FedAvg round (oracle labels), N sequential
``fl_attack.reconstruct`` calls against one ``fl_attack.reconstruct_batch`` call.

``--compiled N``: eager against compiled (``fl_attack.attacker.attacks.compiled``), one client against N batched
(``reconstruct_batch``), for the paper's CNNs and a user model with max pooling (``MaxPoolCNN``, the
generic path): the compile time (the first compiled attack's wall time less an eager one's) apart
from the step time (each whole attack's wall time at ``--iterations`` less its time at 1 iteration,
per iteration, median over the alternated repeats; per attack: a batched step's time / N).

``--precisions fp32,bf16[,tf32]``: the shipped step in each precision (``fl_attack.attacker.precision``)
side by side, each against its own GEMM peak, its gradients against fp32's, and whole PI-SME attacks
(``--iterations`` each, recovered labels) in each (docs/performance.md, "Mixed precision").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from fl_attack.attacker.api import reconstruct, reconstruct_batch, resolve_device
from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.attacks.pisme import PathIntegralSME
from fl_attack.attacker.precision import autocast, check_precision, gemm_gflops, precision_scope, resolve_precision
from fl_attack.evaluation.victims import train_victim
from fl_attack.federation.config import PAPER
from fl_attack.federation.data import client_partition, get_spec, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.update import flatten, layout, unflatten
from tests.reference import pisme_objective_reference


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
    max_grad_diff: float  # float64, relative to the largest reference value
    max_grad_diff_fp32: float
    width: int = 0


def gemm_peak_gflops(
    device: torch.device, n: int = 2048, repeats: int = 5, precision: str = "fp32", max_seconds: float | None = None
) -> float:
    """GEMM throughput (GFLOP/s) of this process: the best of ``repeats`` n x n matmuls, in fp32, in
    bf16 (precision "bf16") or in fp32 with TF32 allowed ("tf32"; ``fl_attack.attacker.precision.gemm_gflops``;
    max_seconds: its time bound)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return gemm_gflops(device, dtype, n, repeats, tf32=precision == "tf32", max_seconds=max_seconds)


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
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: resets the peak resident set size (VmHWM)


def _peak_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _train(dataset: str, partition: int, samples: int, seed: int, width: int | None):
    """Client ``partition``'s victim: k samples, B = min(10, k), E = 1, the paper's lr."""
    batch_size = min(PAPER.batch_size, samples)
    return train_victim(
        dataset, partition, samples=samples, batch_size=batch_size, local_epochs=1, lr=PAPER.lr, seed=seed, width=width
    )


@functools.lru_cache(maxsize=4)
def _client_update(dataset: str, samples: int, seed: int, width: int | None):
    """Client 0's update and labels; shared by a configuration's float64 check and its float32 timing."""
    victim = _train(dataset, 0, samples, seed, width)
    return victim.update, victim.labels


class _Problem:
    """A real client update and everything a PI-SME step needs, for both implementations."""

    def __init__(
        self,
        dataset: str,
        nodes: int,
        samples: int,
        device: torch.device,
        seed: int = 0,
        width: int | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        spec = get_spec(dataset)
        update, labels = _client_update(dataset, samples, seed, width)
        self.model = build_model(dataset, width=width).to(device=device, dtype=dtype)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.width = self.model.conv1.out_channels
        self.shapes = layout(update.w0)
        self.w0_state = {k: v.to(device=device, dtype=dtype) for k, v in update.w0.items()}
        self.wT_state = {k: v.to(device=device, dtype=dtype) for k, v in update.wT.items()}
        self.nodes = nodes
        self.config = AttackConfig(nodes=nodes)
        self.attack = PathIntegralSME(
            self.model, flatten(self.w0_state), flatten(self.wT_state), self.shapes, self.config
        )
        gen = torch.Generator().manual_seed(seed)
        a = self.attack
        with torch.no_grad():  # a state off the initial one: P1 off the midpoint, d != 1
            rms = a.delta_w.norm() / a.delta_w.numel() ** 0.5
            a.control_point.add_(0.5 * rms * torch.randn(a.w0.shape, generator=gen).to(a.w0))
            a.calibration.copy_(0.5 + torch.rand(a.w0.shape, generator=gen).to(a.w0))
        self.x = (
            torch.randn(samples, *spec.image_shape, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
        )
        self.y = labels.to(device)
        groups = [{"params": [self.x], "lr": 1.0}] + [
            {k: v for k, v in g.items() if k != "optimizer"} for g in self.attack.param_groups()
        ]
        self.optimizer = torch.optim.Adam(groups)

    def grads(self, impl: str, precision: str = "fp32") -> list[torch.Tensor]:
        """dL/dX_hat, dL/dP1, dL/dd of one step, in ``precision`` (a resolved one), as the attack
        loop computes them (``fl_attack.attacker.api._optimise``: autocast around the forward only)."""
        a, device = self.attack, self.x.device
        with precision_scope(precision, device):
            with autocast(precision, device):
                if impl == "fast":
                    loss = a.objective(self.x, self.y)["loss"]
                else:
                    loss = pisme_objective_reference(
                        self.model,
                        self.w0_state,
                        self.wT_state,
                        unflatten(a.control_point, self.shapes),
                        unflatten(a.calibration, self.shapes),
                        self.x,
                        self.y,
                        self.nodes,
                    )
            return list(torch.autograd.grad(loss, [self.x, a.control_point, a.calibration]))

    def step(self, impl: str, precision: str = "fp32") -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p, g in zip([self.x, self.attack.control_point, self.attack.calibration], self.grads(impl, precision)):
            p.grad = g
        self.optimizer.step()


def _max_rel_diff(problem: _Problem) -> float:
    """The largest difference of the step's gradients between the two implementations, relative to
    the largest reference value."""
    fast, ref = problem.grads("fast"), problem.grads("reference")
    return max(float((f - r).abs().max() / r.abs().max().clamp_min(1e-30)) for f, r in zip(fast, ref))


def _alternate(device: torch.device, repeats: int, runs: dict) -> tuple[dict, dict, dict]:
    """Call each of ``runs`` (name: function) in turn, ``repeats`` rounds, so that drift biases none;
    per name: the median seconds, the peak memory (MB) and the last call's result."""
    times, memory, results = {name: [] for name in runs}, dict.fromkeys(runs, 0.0), {}
    for _ in range(repeats):
        for name, run in runs.items():
            _reset_peak(device)
            _sync(device)
            t = time.perf_counter()
            results[name] = run()
            _sync(device)
            times[name].append(time.perf_counter() - t)
            memory[name] = max(memory[name], _peak_mb(device))
    return {name: statistics.median(t) for name, t in times.items()}, memory, results


def _time_steps(device: torch.device, repeats: int, steps: dict) -> dict:
    """Per name of ``steps`` (name: step function), each warmed up and its FLOPs counted, then
    alternated: (median seconds per step, GFLOP per step, GFLOP/s, peak memory in MB)."""
    flops = {}
    for name, step in steps.items():
        step()  # warm-up
        flops[name] = count_flops(step)
    seconds, memory, _ = _alternate(device, repeats, steps)
    return {n: (seconds[n], flops[n] / 1e9, flops[n] / seconds[n] / 1e9, memory[n]) for n in steps}


IMPLS = ("fast", "reference")


def bench_one(
    dataset: str, nodes: int, samples: int, device: torch.device, repeats: int, peak: float, width: int | None = None
) -> list[BenchRow]:
    """Both implementations at one configuration, their steps alternated."""
    diff64 = _max_rel_diff(_Problem(dataset, nodes, samples, device, width=width, dtype=torch.float64))
    problem = _Problem(dataset, nodes, samples, device, width=width)
    diff32 = _max_rel_diff(problem)
    timed = _time_steps(device, repeats, {impl: functools.partial(problem.step, impl) for impl in IMPLS})
    return [
        BenchRow(dataset, nodes, samples, impl, sec, gflop, rate, rate / peak, mb, diff64, diff32, problem.width)
        for impl, (sec, gflop, rate, mb) in timed.items()
    ]


def _as_tuple(samples) -> tuple:
    return (samples,) if isinstance(samples, int) else tuple(samples)


def _device(device, threads: int | None) -> torch.device:
    device = resolve_device(device)
    if threads:
        torch.set_num_threads(threads)
    return device


def _grid(bench, header: str, fmt, datasets, widths, samples, nodes, progress) -> list:
    """``bench(dataset, m, k, width)`` (a list of rows) at every point of the grid; ``progress``
    gets the header, then each row as it comes."""
    rows = []
    progress(header)
    for dataset, width, k, m in itertools.product(datasets, widths, _as_tuple(samples), nodes):
        for row in bench(dataset, int(m), int(k), width):
            rows.append(row)
            progress(fmt(row))
    return rows


def _result(device: torch.device, rows: list, **extra) -> dict:
    return {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        **extra,
        "rows": [asdict(r) for r in rows],
    }


def validate_bench(datasets, nodes, samples, repeats, threads, widths) -> None:
    """Every check of run_bench's arguments, before any timing; raises ValueError naming the bad one."""
    samples = _as_tuple(samples)
    if not datasets or not nodes or not samples or not widths:
        raise ValueError("datasets, nodes, samples and widths must be non-empty")
    if repeats < 1 or (threads is not None and threads < 1):
        raise ValueError(f"repeats and threads must be >= 1, got {repeats} and {threads}")
    for name, values in (("nodes", nodes), ("samples", samples), ("widths", [w for w in widths if w is not None])):
        if any(not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"{name} must be integers >= 1, got {tuple(values)}")
    for dataset in datasets:
        get_spec(dataset)  # unknown names fail here
        client_partition(load_pool(dataset), 0, max(samples))  # so does a k no client has


def run_bench(
    datasets=("cifar100", "femnist"),
    nodes=(1, 3, 7, 12),
    samples=(50,),
    device="auto",
    repeats: int = 3,
    threads: int | None = None,
    widths=(None,),
    progress=print,
) -> dict:
    """Run the benchmark grid; returns {"device", "threads", "gemm_peak_gflops", "rows": [...]}.

    samples: batch sizes k; widths: conv1 channel counts (None: the paper's model). The GEMM peak is
    the best of one measurement before and one after the grid. Raises ValueError on bad arguments.
    """
    validate_bench(datasets, nodes, samples, repeats, threads, widths)
    device = _device(device, threads)
    peak = gemm_peak_gflops(device)
    bench = lambda dataset, m, k, width: bench_one(dataset, m, k, device, repeats, peak, width)
    rows = _grid(bench, HEADER, format_row, datasets, widths, samples, nodes, progress)
    peak_after = gemm_peak_gflops(device)
    if peak_after > peak:  # express every row against the better of the two peak measurements
        for row in rows:
            row.peak_fraction *= peak / peak_after
        peak = peak_after
    return _result(device, rows, gemm_peak_gflops=peak)


HEADER = (
    f"{'dataset':9} {'width':>5} {'k':>3} {'m':>3} {'impl':9} {'s/step':>8} {'GFLOP':>7} {'GFLOP/s':>8} "
    f"{'%peak':>6} {'peakMB':>7} {'dg fp64':>8} {'dg fp32':>8}"
)


def format_row(r: BenchRow | dict) -> str:
    r = BenchRow(**r) if isinstance(r, dict) else r
    return (
        f"{r.dataset:9} {r.width:>5} {r.samples:>3} {r.nodes:>3} {r.impl:9} {r.seconds_per_step:8.3f} "
        f"{r.gflop_per_step:7.1f} {r.gflops:8.1f} {100 * r.peak_fraction:5.1f}% {r.peak_memory_mb:7.0f} "
        f"{r.max_grad_diff:8.1e} {r.max_grad_diff_fp32:8.1e}"
    )


def summarize(result: dict) -> str:
    """Speed-ups (reference / fast) per configuration and the m-scaling of the fast step, as text."""
    rows = result["rows"]
    lines = [
        f"device {result['device']}, {result['threads']} threads, fp32 GEMM peak "
        f"{result['gemm_peak_gflops']:.1f} GFLOP/s (best of before and after), torch {result['torch']}",
        HEADER,
    ] + [format_row(r) for r in rows]
    by = {(r["dataset"], r["width"], r["samples"], r["nodes"], r["impl"]): r for r in rows}
    configs = sorted({key[:4] for key in by})
    for dataset, width, k, m in configs:
        f, ref = by[(dataset, width, k, m, "fast")], by[(dataset, width, k, m, "reference")]
        lines.append(
            f"{dataset} width={width} k={k} m={m}: fast {f['seconds_per_step']:.3f} s, reference "
            f"{ref['seconds_per_step']:.3f} s, speed-up x{ref['seconds_per_step'] / f['seconds_per_step']:.2f},"
            f" fast at {100 * f['peak_fraction']:.0f}% of the GEMM peak"
        )
    for dataset, width, k in sorted({c[:3] for c in configs}):
        one, seven = by.get((dataset, width, k, 1, "fast")), by.get((dataset, width, k, 7, "fast"))
        if one and seven:
            lines.append(
                f"{dataset} width={width} k={k}: fast step time at m=7 / m=1 = "
                f"{seven['seconds_per_step'] / one['seconds_per_step']:.2f}"
            )
    return "\n".join(lines)


@dataclass
class BatchRow:
    dataset: str
    method: str
    nodes: int
    samples: int
    clients: int
    iterations: int
    sequential_seconds: float  # median wall time of the N sequential attacks
    batched_seconds: float  # median wall time of the one batched call
    sequential_attacks_per_second: float
    batched_attacks_per_second: float
    throughput_ratio: float  # batched / sequential attacks per second
    sequential_peak_mb: float
    batched_peak_mb: float
    max_lsim_diff: float  # largest |Lsim_batched - Lsim_sequential| over clients, honest and calibrated
    width: int = 0


def bench_batched(
    dataset: str,
    nodes: int,
    samples: int,
    clients: int,
    iterations: int,
    device: torch.device,
    repeats: int,
    width: int | None = None,
    method: str = "pisme",
) -> BatchRow:
    """N attacks of ``iterations`` steps on N real clients, sequential against batched, alternated."""
    victims = [_train(dataset, i, samples, 0, width) for i in range(clients)]
    model = build_model(dataset, width=width)
    settings = dict(nodes=nodes, iterations=iterations, device=device, model=model)
    updates, labels = [v.update for v in victims], [v.labels for v in victims]

    def sequential(steps: int = iterations):
        return [reconstruct(v.update, method, labels=v.labels, **{**settings, "iterations": steps}) for v in victims]

    def batched(steps: int = iterations):
        return reconstruct_batch(updates, method, labels=labels, **{**settings, "iterations": steps})

    sequential(1), batched(1)  # warm-up
    seconds, memory, results = _alternate(device, repeats, {"sequential": sequential, "batched": batched})
    diff = max(
        max(abs(a.lsim_honest - b.lsim_honest), abs(a.lsim_calibrated - b.lsim_calibrated))
        for a, b in zip(results["sequential"], results["batched"])
    )
    seq, bat = seconds["sequential"], seconds["batched"]
    rates = (clients / seq, clients / bat, seq / bat)  # attacks per second of each, and their ratio
    peak_mb = (memory["sequential"], memory["batched"])
    width = model.conv1.out_channels
    return BatchRow(dataset, method, nodes, samples, clients, iterations, seq, bat, *rates, *peak_mb, diff, width)


BATCH_HEADER = (
    f"{'dataset':9} {'width':>5} {'k':>3} {'m':>3} {'N':>3} {'iters':>5} {'seq s':>8} {'batch s':>8} "
    f"{'seq att/s':>9} {'bat att/s':>9} {'ratio':>6} {'seqMB':>7} {'batMB':>7} {'dLsim':>8}"
)


def format_batch_row(r: BatchRow | dict) -> str:
    r = BatchRow(**r) if isinstance(r, dict) else r
    return (
        f"{r.dataset:9} {r.width:>5} {r.samples:>3} {r.nodes:>3} {r.clients:>3} {r.iterations:>5} "
        f"{r.sequential_seconds:8.2f} {r.batched_seconds:8.2f} {r.sequential_attacks_per_second:9.3f} "
        f"{r.batched_attacks_per_second:9.3f} {r.throughput_ratio:6.2f} {r.sequential_peak_mb:7.0f} "
        f"{r.batched_peak_mb:7.0f} {r.max_lsim_diff:8.1e}"
    )


def run_batched(
    datasets=("cifar100",),
    nodes=(3,),
    samples=(10,),
    clients: int = 4,
    iterations: int = 5,
    device="auto",
    repeats: int = 3,
    threads: int | None = None,
    widths=(None,),
    progress=print,
) -> dict:
    """The batched-against-sequential grid; returns {"device", "threads", "torch", "rows": [...]}.
    Raises ValueError on bad arguments (as run_bench, plus clients and iterations >= 1)."""
    validate_bench(datasets, nodes, samples, repeats, threads, widths)
    if clients < 1 or iterations < 1:
        raise ValueError(f"--batched N and --iterations must be >= 1, got {clients} and {iterations}")
    validate_clients(datasets, samples, clients)
    device = _device(device, threads)
    bench = lambda dataset, m, k, width: [bench_batched(dataset, m, k, clients, iterations, device, repeats, width)]
    return _result(device, _grid(bench, BATCH_HEADER, format_batch_row, datasets, widths, samples, nodes, progress))


def validate_clients(datasets, samples, clients: int) -> None:
    """N clients of k samples exist in every dataset; ValueError otherwise."""
    for dataset, k in itertools.product(datasets, _as_tuple(samples)):
        client_partition(load_pool(dataset), clients - 1, k)


def summarize_batched(result: dict) -> str:
    lines = [
        f"device {result['device']}, {result['threads']} threads, torch {result['torch']}",
        BATCH_HEADER,
    ] + [format_batch_row(r) for r in result["rows"]]
    for r in result["rows"]:
        lines.append(
            f"{r['dataset']} width={r['width']} k={r['samples']} m={r['nodes']} N={r['clients']}: "
            f"sequential {r['sequential_attacks_per_second']:.3f} attacks/s, batched "
            f"{r['batched_attacks_per_second']:.3f} attacks/s, batched/sequential throughput "
            f"x{r['throughput_ratio']:.2f}"
        )
    return "\n".join(lines)


class MaxPoolCNN(torch.nn.Module):
    """A user model with max pooling (``fl_attack.attacker.attacks.gradients``' generic path): the paper's
    FEMNIST / CIFAR-100 CNN layout (conv 3x3 pad 1, ReLU, pool 2, conv, ReLU, pool 2, fc, ReLU, fc)
    with 2x2 max pooling instead of average pooling."""

    def __init__(self, dataset: str):
        super().__init__()
        channels, size, _ = get_spec(dataset).image_shape
        width = 32 if channels == 1 else 64
        self.conv1 = torch.nn.Conv2d(channels, width, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = torch.nn.Linear(2 * width * (size // 4) ** 2, 100 if channels == 1 else 200)
        self.fc2 = torch.nn.Linear(self.fc1.out_features, get_spec(dataset).num_classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


@dataclass
class CompileRow:
    model: str  # "femnist" / "cifar100" (the paper's CNN, structured path) or "<dataset>+maxpool" (generic)
    samples: int
    nodes: int
    clients: int  # 1: reconstruct; N: reconstruct_batch of N clients
    iterations: int
    eager_step_ms: float  # per attack and iteration: (wall(K) - wall(1)) / (K - 1) / clients, median
    compiled_step_ms: float
    speedup: float  # eager / compiled
    compile_seconds: float  # the first compiled attack (1 iteration) less an eager one
    break_even_steps: float  # compile_seconds / (eager - compiled) per step; inf when compiled is not faster
    max_lsim_diff: float  # |Lsim_compiled - Lsim_eager| after K iterations, over the clients
    compile_note: str
    gflop_per_step: float = 0.0  # one client's step (FlopCounterMode: an unbatched 2-iteration attack less 1)
    compiled_gflops: float = 0.0  # gflop_per_step / the compiled step's time
    peak_fraction: float = 0.0  # compiled_gflops / the GEMM peak measured in the same process (TF32 on CUDA)


def _synthetic_updates(model, dataset: str, samples: int, clients: int):
    """N updates of ``model`` at its seeded initial weights: wT = w0 - 0.01 noise (the step's cost
    does not depend on the values), with oracle labels."""
    from fl_attack.federation.update import ObservedUpdate, TrainingMetadata

    spec, updates = get_spec(dataset), []
    for n in range(clients):
        g = torch.Generator().manual_seed(n)
        w0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
        wT = {k: v - 0.01 * torch.randn(v.shape, generator=g) for k, v in w0.items()}
        updates.append(ObservedUpdate(w0, wT, TrainingMetadata(dataset, PAPER.lr, min(10, samples), 1, samples)))
    labels = torch.randint(spec.num_classes, (clients, samples), generator=torch.Generator().manual_seed(0))
    return updates, labels


def bench_compiled(
    model_name: str, nodes: int, samples: int, clients: int, iterations: int, device, repeats: int, peak: float = 0.0
):
    """Eager against compiled PI-SME attacks of one model, one client (clients 1) or N batched."""
    from fl_attack.attacker.attacks import compiled as compiled_step

    dataset, _, kind = model_name.partition("+")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MaxPoolCNN(dataset) if kind == "maxpool" else build_model(dataset, seed=0)
    model.eval()
    updates, labels = _synthetic_updates(model, dataset, samples, clients)

    def attack(mode: str, steps: int):
        options = dict(nodes=nodes, iterations=steps, device=device, model=model, compile=mode, trace_every=steps)
        if clients == 1:
            return [reconstruct(updates[0], "pisme", labels=labels[0], **options)]
        return reconstruct_batch(updates, "pisme", labels=labels, **options)

    compiled_step.reset()
    attack("off", 1)  # warm-up
    eager_one = _alternate(device, 1, {"one": lambda: attack("off", 1)})[0]["one"]
    start = time.perf_counter()
    note = attack("on", 1)[0].compile
    compile_seconds = time.perf_counter() - start - eager_one
    runs = {
        "eager1": lambda: attack("off", 1),
        "compiled1": lambda: attack("on", 1),
        "eager": lambda: attack("off", iterations),
        "compiled": lambda: attack("on", iterations),
    }
    seconds, _, results = _alternate(device, repeats, runs)
    per = {m: (seconds[m] - seconds[f"{m}1"]) / max(1, iterations - 1) / clients * 1e3 for m in ("eager", "compiled")}
    diff = max(abs(a.lsim_honest - b.lsim_honest) for a, b in zip(results["eager"], results["compiled"]))
    saving = (per["eager"] - per["compiled"]) / 1e3 * clients  # seconds a compiled step saves (one call)
    # FLOPs of one client's step, counted unbatched: flop_counter over-counts the grouped convolutions of a
    # vmapped batch ("Batched attacks" in docs/performance.md), and a batch does N clients' same work
    one = dict(nodes=nodes, device=device, model=model, compile="off", labels=labels[0])
    gflop = (
        count_flops(lambda: reconstruct(updates[0], "pisme", iterations=2, trace_every=2, **one))
        - count_flops(lambda: reconstruct(updates[0], "pisme", iterations=1, trace_every=1, **one))
    ) / 1e9
    gflops = gflop / (per["compiled"] / 1e3)
    return CompileRow(
        model_name,
        samples,
        nodes,
        clients,
        iterations,
        per["eager"],
        per["compiled"],
        per["eager"] / per["compiled"],
        compile_seconds,
        compile_seconds / saving if saving > 0 else float("inf"),
        diff,
        note,
        gflop,
        gflops,
        gflops / peak if peak else 0.0,
    )


COMPILE_HEADER = (
    f"{'model':16} {'k':>3} {'m':>3} {'N':>3} {'iters':>5} {'eager ms':>9} {'comp ms':>9} {'speedup':>7} "
    f"{'compile s':>9} {'break-even':>10} {'dLsim':>8} {'GFLOP':>6} {'GFLOP/s':>8} {'%peak':>6}"
)


def format_compile_row(r: CompileRow | dict) -> str:
    r = CompileRow(**r) if isinstance(r, dict) else r
    return (
        f"{r.model:16} {r.samples:>3} {r.nodes:>3} {r.clients:>3} {r.iterations:>5} {r.eager_step_ms:9.1f} "
        f"{r.compiled_step_ms:9.1f} {r.speedup:7.2f} {r.compile_seconds:9.1f} {r.break_even_steps:10.0f} "
        f"{r.max_lsim_diff:8.1e} {r.gflop_per_step:6.2f} {r.compiled_gflops:8.1f} {100 * r.peak_fraction:5.1f}%"
        + ("" if r.compile_note == "compiled" else f"  [{r.compile_note}]")
    )


def run_compiled(
    datasets=("femnist", "cifar100"),
    nodes=(3,),
    samples=(10,),
    clients: int = 4,
    iterations: int = 4,
    device="auto",
    repeats: int = 3,
    threads: int | None = None,
    widths=(None,),
    progress=print,
) -> dict:
    """Eager/compiled x one client/N batched for each dataset's paper CNN and its max-pooling user
    model; returns {"device", "threads", "torch", "rows": [...]}. ValueError on bad arguments."""
    validate_bench(datasets, nodes, samples, repeats, threads, widths)
    if clients < 1 or iterations < 2:
        raise ValueError(f"--compiled N must be >= 1 and --iterations >= 2, got {clients} and {iterations}")
    device = _device(device, threads)
    precision = "tf32" if device.type == "cuda" else "fp32"
    peak = gemm_peak_gflops(device, 2048 if device.type == "cuda" else 1024, precision=precision)
    progress(f"{precision} GEMM peak: {peak:.1f} GFLOP/s")
    models = [name for d in datasets for name in (d, f"{d}+maxpool")]
    rows = []
    progress(COMPILE_HEADER)
    for name, k, m, n in itertools.product(models, _as_tuple(samples), nodes, sorted({1, clients})):
        rows.append(bench_compiled(name, int(m), int(k), n, iterations, device, repeats, peak))
        progress(format_compile_row(rows[-1]))
    return _result(device, rows, gemm_peak_gflops=peak, gemm_peak_precision=precision)


def summarize_compiled(result: dict) -> str:
    lines = [
        f"device {result['device']}, {result['threads']} threads, torch {result['torch']}, "
        f"{result.get('gemm_peak_precision', 'fp32')} GEMM peak {result.get('gemm_peak_gflops', 0):.1f} GFLOP/s",
        COMPILE_HEADER,
    ]
    return "\n".join(lines + [format_compile_row(r) for r in result["rows"]])


@dataclass
class PrecisionRow:
    dataset: str
    nodes: int
    samples: int
    precision: str
    seconds_per_step: float  # median over the alternated repeats
    gflop_per_step: float
    gflops: float
    gemm_peak_gflops: float  # this precision's own 2048^2 GEMM peak (bf16; fp32; fp32 with TF32)
    peak_fraction: float  # gflops / its own peak
    peak_memory_mb: float
    grad_cosine: float  # the smallest cosine of dL/dX_hat, dL/dP1, dL/dd with the fp32 step's
    grad_rel_error: float  # the largest ||g - g_fp32|| / ||g_fp32|| of the three
    attack_iterations: int
    attack_seconds: float  # one whole PI-SME attack (reconstruct, recovered labels)
    attacks_per_second: float
    width: int = 0


def _agreement(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> tuple[float, float]:
    """(smallest cosine, largest relative norm error) of the step's gradients against the reference's, in float64."""
    cos, rel = [], []
    for g, r in zip(grads, reference):
        g, r = g.double().flatten(), r.double().flatten()
        cos.append(float(g @ r / (g.norm() * r.norm()).clamp_min(1e-300)))
        rel.append(float((g - r).norm() / r.norm().clamp_min(1e-300)))
    return min(cos), max(rel)


def bench_precisions(
    dataset: str,
    nodes: int,
    samples: int,
    device: torch.device,
    repeats: int,
    peaks: dict,
    precisions: tuple,
    iterations: int,
    width: int | None = None,
) -> list[PrecisionRow]:
    """The shipped PI-SME step in each resolved precision at one configuration, in one process: the
    steps alternate between the precisions so drift biases none; then one whole attack each."""
    problem = _Problem(dataset, nodes, samples, device, width=width)
    reference = problem.grads("fast", "fp32")
    agreement = {p: _agreement(problem.grads("fast", p), reference) for p in precisions}
    timed = _time_steps(device, repeats, {p: functools.partial(problem.step, "fast", p) for p in precisions})
    update, _ = _client_update(dataset, samples, 0, width)
    model = build_model(dataset, width=width)
    # whole attacks with recovered labels, as a user runs them
    attack = functools.partial(reconstruct, update, "pisme", nodes=nodes, iterations=iterations, device=device)
    attacks = {p: functools.partial(attack, model=model, precision=p) for p in precisions}
    attack_seconds = _alternate(device, 1, attacks)[0]
    rows = []
    for p, (sec, gflop, rate, mb) in timed.items():
        peak = (peaks[p], rate / peaks[p])  # its own GEMM peak, and the fraction of it reached
        whole = (iterations, attack_seconds[p], 1 / attack_seconds[p])  # iterations, seconds, attacks per second
        rows.append(
            PrecisionRow(dataset, nodes, samples, p, sec, gflop, rate, *peak, mb, *agreement[p], *whole, problem.width)
        )
    return rows


def resolve_precisions(precisions, device) -> tuple[str, ...]:
    """The resolved precisions to compare, fp32 first (the reference), each once; ValueError for a
    bad value or one the device cannot run (tf32 off CUDA)."""
    device = resolve_device(device)
    resolved = [resolve_precision(check_precision(p), device) for p in precisions]
    return tuple(dict.fromkeys(["fp32", *resolved]))


def run_precisions(
    datasets=("cifar100", "femnist"),
    nodes=(7,),
    samples=(50,),
    device="auto",
    repeats: int = 3,
    threads: int | None = None,
    widths=(None,),
    precisions=("fp32", "bf16"),
    iterations: int = 5,
    progress=print,
    peak_size: int = 2048,
) -> dict:
    """The precision comparison grid; returns {"device", "threads", "torch", "gemm_peak_gflops":
    {precision: GFLOP/s}, "gemm_size": n, "rows": [...]}. Each precision's GEMM peak (n = peak_size)
    is the best of one measurement before and one after the grid, each bounded to about 10 s.
    Raises ValueError on bad arguments (as run_bench, plus the precisions, iterations >= 1 and
    peak_size >= 1), before any timing."""
    validate_bench(datasets, nodes, samples, repeats, threads, widths)
    if iterations < 1 or peak_size < 1:
        raise ValueError(f"--iterations and --peak-size must be >= 1, got {iterations} and {peak_size}")
    precisions = resolve_precisions(precisions, device)
    device = _device(device, threads)
    peak = functools.partial(gemm_peak_gflops, device, peak_size, max_seconds=PEAK_SECONDS)
    peaks = {p: peak(precision=p) for p in precisions}
    bench = lambda dataset, m, k, width: bench_precisions(
        dataset, m, k, device, repeats, peaks, precisions, iterations, width
    )
    rows = _grid(bench, PRECISION_HEADER, format_precision_row, datasets, widths, samples, nodes, progress)
    for precision in precisions:
        after = peak(precision=precision)
        if after > peaks[precision]:  # every row against the better of the two measurements
            for row in rows:
                if row.precision == precision:
                    row.peak_fraction *= peaks[precision] / after
                    row.gemm_peak_gflops = after
            peaks[precision] = after
    return _result(device, rows, gemm_peak_gflops=peaks, gemm_size=peak_size)


PEAK_SECONDS = 10.0  # each GEMM peak measurement's bound (an emulated bf16 2048^2 matmul takes ~15 s)
PRECISION_HEADER = (
    f"{'dataset':9} {'width':>5} {'k':>3} {'m':>3} {'prec':5} {'s/step':>8} {'GFLOP':>7} {'GFLOP/s':>8} "
    f"{'peak':>7} {'%peak':>6} {'peakMB':>7} {'cos':>8} {'rel err':>8} {'iters':>5} {'attack s':>8} {'att/s':>7}"
)


def format_precision_row(r: PrecisionRow | dict) -> str:
    r = PrecisionRow(**r) if isinstance(r, dict) else r
    return (
        f"{r.dataset:9} {r.width:>5} {r.samples:>3} {r.nodes:>3} {r.precision:5} {r.seconds_per_step:8.3f} "
        f"{r.gflop_per_step:7.2f} {r.gflops:8.1f} {r.gemm_peak_gflops:7.1f} {100 * r.peak_fraction:5.1f}% "
        f"{r.peak_memory_mb:7.0f} {r.grad_cosine:8.5f} {r.grad_rel_error:8.1e} {r.attack_iterations:>5} "
        f"{r.attack_seconds:8.2f} {r.attacks_per_second:7.3f}"
    )


def summarize_precisions(result: dict) -> str:
    """The precisions side by side: the table, then each lowered precision's step and attack
    against fp32's at every configuration, as text."""
    peaks = ", ".join(f"{p} {v:.1f}" for p, v in result["gemm_peak_gflops"].items())
    lines = [
        f"device {result['device']}, {result['threads']} threads, torch {result['torch']}; "
        f"{result.get('gemm_size', 2048)}^2 GEMM peaks (GFLOP/s, best of before and after): {peaks}",
        PRECISION_HEADER,
    ] + [format_precision_row(r) for r in result["rows"]]
    by = {(r["dataset"], r["width"], r["samples"], r["nodes"], r["precision"]): r for r in result["rows"]}
    for dataset, width, k, m, precision in by:
        if precision == "fp32":
            continue
        r, f = by[(dataset, width, k, m, precision)], by[(dataset, width, k, m, "fp32")]
        lines.append(
            f"{dataset} width={width} k={k} m={m}: {precision} step {r['seconds_per_step']:.3f} s against fp32 "
            f"{f['seconds_per_step']:.3f} s (x{f['seconds_per_step'] / r['seconds_per_step']:.2f}); "
            f"{100 * r['peak_fraction']:.0f}% of its GEMM peak against fp32's {100 * f['peak_fraction']:.0f}%; "
            f"gradients: cosine >= {r['grad_cosine']:.5f}, relative error <= {r['grad_rel_error']:.2e}; "
            f"whole attack ({r['attack_iterations']} iterations) {r['attack_seconds']:.2f} s against "
            f"{f['attack_seconds']:.2f} s (x{f['attack_seconds'] / r['attack_seconds']:.2f})"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    """Command line: prints the table (or --json); exit status 2 with one line for a bad argument."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.attack_step",
        description="Time one PI-SME optimisation step (m node gradients, objective, double backward, Adam) at "
        "the paper's size on a real client batch, for this project's implementation and the literal "
        "Algorithm-1 loop, in one process. Prints seconds per step, GFLOP/s "
        "(torch.utils.flop_counter), the fraction of an fp32 GEMM peak measured in the same process, "
        "peak memory and the largest relative gradient difference (float64 and float32).",
    )
    add = parser.add_argument
    add("--datasets", help="comma-separated (default: cifar100,femnist; with --batched: cifar100)")
    add("--nodes", help="comma-separated m values (default: 1,3,7,12; with --batched: 3)")
    add("--samples", metavar="K", help="comma-separated batch sizes k (default: 50; with --batched: 10)")
    add(
        "--widths",
        default="",
        metavar="W",
        help="comma-separated conv1 widths for a scaling table (default: the paper's model)",
    )
    add("--repeats", type=int, default=3, help="timed steps per configuration, median reported (default: 3)")
    add("--threads", type=int, default=0, help="torch threads, >= 1 (default 0: torch's choice)")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto", help="(default: auto)")
    add(
        "--batched",
        type=int,
        default=0,
        metavar="N",
        help="time N whole PI-SME attacks on N clients, batched (reconstruct_batch) against sequential "
        "(reconstruct), instead of the step grid",
    )
    add(
        "--compiled",
        type=int,
        default=0,
        metavar="N",
        help="eager against compiled PI-SME attacks, one client and N batched, for the paper's CNNs and a "
        "max-pooling user model, with the compile time apart (default datasets: femnist,cifar100; m 3; k 10)",
    )
    add(
        "--iterations",
        type=int,
        default=5,
        help="attack iterations with --batched, --compiled or --precisions (default: 5)",
    )
    add(
        "--precisions",
        default="",
        metavar="LIST",
        help="compare the shipped step and whole attacks in these precisions, side by side (fp32, bf16, tf32 "
        "on CUDA, auto; fp32 is always included), instead of the step grid (default m: 7)",
    )
    add("--peak-size", type=int, default=2048, metavar="N", help="with --precisions: the GEMM peaks' n (default: 2048)")
    add("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    defaults = ("cifar100", "3", "10") if args.batched else ("cifar100,femnist", "1,3,7,12", "50")
    if args.precisions and not args.batched:
        defaults = ("cifar100,femnist", "7", "50")
    if args.compiled:
        defaults = ("femnist,cifar100", "3", "10")
    args.datasets, args.nodes, args.samples = (
        given or default for given, default in zip((args.datasets, args.nodes, args.samples), defaults)
    )
    datasets = tuple(args.datasets.split(","))
    try:
        nodes = tuple(int(m) for m in args.nodes.split(","))
        samples = tuple(int(k) for k in args.samples.split(","))
        widths = tuple(int(w) for w in args.widths.split(",")) if args.widths else (None,)
        validate_bench(datasets, nodes, samples, args.repeats, args.threads or None, widths)
        if args.batched < 0 or args.iterations < 1:
            raise ValueError(f"--batched must be >= 1 and --iterations >= 1, got {args.batched} and {args.iterations}")
        if sum(map(bool, (args.batched, args.precisions, args.compiled))) > 1:
            raise ValueError("--batched, --compiled and --precisions are three benchmarks; give one")
        if args.compiled < 0 or (args.compiled and args.iterations < 2):
            raise ValueError(
                f"--compiled must be >= 1 and --iterations >= 2, got {args.compiled} and {args.iterations}"
            )
        precisions = resolve_precisions(tuple(args.precisions.split(",")), args.device) if args.precisions else ()
        if args.batched:
            validate_clients(datasets, samples, args.batched)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if precisions:
        run, summary = run_precisions, summarize_precisions
        extra = dict(precisions=precisions, iterations=args.iterations, peak_size=args.peak_size)
    elif args.batched:
        run, summary, extra = run_batched, summarize_batched, dict(clients=args.batched, iterations=args.iterations)
    elif args.compiled:
        run, summary, extra = run_compiled, summarize_compiled, dict(clients=args.compiled, iterations=args.iterations)
    else:
        run, summary, extra = run_bench, summarize, {}
    result = run(
        datasets,
        nodes,
        samples,
        device=args.device,
        repeats=args.repeats,
        threads=args.threads or None,
        widths=widths,
        progress=(lambda s: None) if args.json else print,
        **extra,
    )
    print(json.dumps(result, indent=2) if args.json else summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
