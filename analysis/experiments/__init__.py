"""The PI-SME paper's experiments, one command each, on real data (the bundled samples by default).

    python -m analysis.experiments NAME [--scale cpu|paper|tiny] [--out DIR] [--device auto|cpu|cuda]
                                        [--precision fp32|bf16|tf32|auto] [--seeds N] [--clients N]
                                        [--iterations N] [--threads N] [--data-dir PATH]

NAME is one of ``EXPERIMENTS``: table1, node-sweep, class-deficiency, path-consistency,
matched-compute, adaptive-nodes, label-recovery, client-optimizers, precision. Each writes DIR/NAME.csv (one row
per measurement), DIR/NAME.png and DIR/NAME.md (a table whose caption states the scale, the command and its wall time).
Scales (the presets of fl_attack.federation.config.PRESETS): ``paper`` is the
paper's protocol (a GPU job), ``cpu`` finishes on a few CPU cores, ``tiny`` is a smoke test.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

from fl_attack.federation.config import PRESETS

from .common import make_context

__all__ = ["EXPERIMENTS", "main", "run_experiment"]


EXPERIMENTS = {
    "table1": ("table1", "IG, SME, NL-SME, PI-SME on CIFAR-100 and FEMNIST at T=100 and T=250 (Table 1)"),
    "node-sweep": ("node_sweep", "PI-SME at m in {3,4,5,7,10,12} with the cost per iteration (Table 2)"),
    "class-deficiency": ("class_deficiency", "SME, NL-SME, PI-SME with C classes per CIFAR-100 client (Fig. 2)"),
    "path-consistency": ("path_consistency", "single true state vs quadrature on the true batch (Table 3)"),
    "matched-compute": ("matched_compute", "NL-SME at 1x/5x/7x the iterations vs PI-SME (section 4.2)"),
    "adaptive-nodes": ("adaptive_nodes", "beyond the paper: m chosen from a quadrature-error tolerance"),
    "label-recovery": ("label_recovery", "beyond the paper: label estimators in a learning FedAvg federation"),
    "client-optimizers": ("optimizers", "beyond the paper: momentum, weight decay, Adam; optimizer-aware vs naive"),
    "precision": ("precision", "beyond the paper: bf16 (and tf32 on CUDA) against fp32, per method (the fidelity)"),
}


def _module(name: str):
    """The experiment's module: ``run(ctx)`` and ``GRID``, the axes --grid may set."""
    return importlib.import_module(f".{EXPERIMENTS[name][0]}", __name__)


def run_experiment(
    name: str,
    scale: str = "cpu",
    out: str | Path = "results/experiments",
    device: str = "auto",
    seeds: int | None = None,
    clients: int | None = None,
    iterations: int | None = None,
    data_dir: str | None = None,
    command: str = "",
    grid: dict | None = None,
    workers: int = 0,
    ray_address: str = "",
    threads: int = 1,
    precision: str = "fp32",
    compile: str = "auto",
    batch: int | str = 1,
) -> Path:
    """Run one experiment; returns the output folder. ValueError for bad options, before any work
    (``common.make_context``; the precision experiment sets its own arms' precision).

    command: the command line to quote in NAME.md (default: the equivalent of the arguments).
    grid: {axis: "v1,v2"} to sweep other values than the experiment's defaults (its ``GRID``).
    Experiments with a grid resume: rows already in OUT/NAME.csv are skipped, and they fan their
    attacks out over ``workers`` local processes (0: this process) or, with ``ray_address``, that
    many actors on a Ray cluster, each with ``threads`` torch threads.
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment '{name}'; choose from: {', '.join(EXPERIMENTS)}")
    module = _module(name)
    axes = getattr(module, "GRID", ())
    ctx = make_context(
        name,
        scale,
        out,
        device,
        seeds,
        clients,
        iterations,
        data_dir,
        grid,
        axes,
        workers,
        ray_address,
        threads,
        precision,
        compile,
        batch,
    )
    ctx.command = command
    ctx.out.mkdir(parents=True, exist_ok=True)
    module.run(ctx)
    ctx.log(f"done in {ctx.elapsed():.0f} s: {ctx.out / name}.{{csv,png,md}}")
    return ctx.out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.experiments",
        description="Reproduce one experiment of the PI-SME paper on real data: writes OUT/NAME.csv, .png, .md.",
        epilog="experiments:\n" + "\n".join(f"  {k:17s} {v[1]}" for k, v in EXPERIMENTS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=list(EXPERIMENTS), metavar="NAME", help="the experiment (see below)")
    parser.add_argument(
        "--scale",
        choices=[name for name, p in PRESETS.items() if not p.rule],
        default="cpu",
        help="paper: the paper's protocol (GPU); cpu: a few CPU minutes; tiny: a smoke test",
    )
    parser.add_argument("--out", default="results/experiments", help="output folder (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda for the attacks (default: auto)")
    parser.add_argument(
        "--precision",
        default="fp32",
        help="the attacks' arithmetic: fp32, bf16, tf32 (CUDA) or auto (docs/performance.md, Mixed precision; "
        "the precision experiment compares its own arms) (default: fp32)",
    )
    parser.add_argument(
        "--compile",
        default="auto",
        metavar="{off,on,auto}",
        help="each attack step as one torch.compile'd torch.func function; auto = on CUDA only "
        "(docs/performance.md, Compiled step) (default: auto)",
    )
    parser.add_argument(
        "--batch",
        default="1",
        metavar="N",
        help="run up to N attacks of one method and k as one batched attack (reconstruct_batch), with the "
        "rows of unbatched ones; auto = 16 on CUDA, 1 on the CPU (default: 1)",
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per client (default: the scale's)")
    parser.add_argument("--clients", type=int, default=None, help="clients per cell (default: the scale's)")
    parser.add_argument("--iterations", type=int, default=None, help="attack iterations (default: the scale's)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on a shared machine more threads oversubscribe the "
        "cores and ran 10-20x slower here; 0 = torch's default)",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="AXIS=V1,V2",
        help="sweep these values of one grid axis (repeatable): class-deficiency: classes, labels; "
        "matched-compute: dataset, paper_T, labels; node-sweep: dataset, paper_T, nodes, labels; "
        "precision: dataset, precision (the arms against fp32: bf16, tf32). "
        "These experiments resume: rerunning a command skips the rows OUT/NAME.csv already holds",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="class-deficiency, matched-compute, node-sweep, precision: run the attacks on N local processes "
        "(or N Ray actors with --ray-address), each with --threads torch threads (default 0: this process)",
    )
    parser.add_argument(
        "--ray-address",
        default="",
        help="run the attacks on this Ray cluster (e.g. 127.0.0.1:6379 from `ray start --head`, or auto)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="a LEAF FEMNIST dir, a cifar-100-python dir or an .npz (default: the bundled sample)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 for bad options)."""
    args = build_parser().parse_args(argv)
    if args.threads < 0:
        print("python -m analysis.experiments: error: --threads must be >= 0", file=sys.stderr)
        return 2
    grid = {}
    for item in args.grid:
        axis, sep, values = item.partition("=")
        if not sep or not axis.strip() or not values.strip():
            print(f"python -m analysis.experiments: error: --grid wants AXIS=V1,V2, got {item!r}", file=sys.stderr)
            return 2
        grid[axis.strip()] = values
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        run_experiment(
            args.name,
            args.scale,
            args.out,
            args.device,
            args.seeds,
            args.clients,
            args.iterations,
            args.data_dir,
            grid=grid,
            workers=args.workers,
            ray_address=args.ray_address,
            threads=args.threads or torch.get_num_threads(),
            precision=args.precision,
            compile=args.compile,
            batch=args.batch,
            command="python -m analysis.experiments " + " ".join(sys.argv[1:] if argv is None else argv),
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"python -m analysis.experiments: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # failed attacks: the others are recorded, a rerun retries these
        print(f"python -m analysis.experiments: error: {exc}", file=sys.stderr)
        return 1
    return 0
