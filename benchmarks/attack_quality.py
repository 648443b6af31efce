"""Attack-quality benchmark on real bundled FEMNIST writers (docs/attack-core.md).

Two subcommands, run from the repository root (prefix ``PYTHONPATH=.`` while the package is not
pip-installed); the figures they produced are in docs/attack-core.md:

    # PI-SME vs SME vs IG (and NL-SME) at the paper protocol k=50, B=10, E=20 (T=100)
    python benchmarks/attack_quality.py quality --clients 3 --iterations 300 \\
        --methods pisme,sme,ig,nlsme --out results/benchmarks/attack-quality

    # the control point's optimiser and learning rate, one client, PI-SME only
    python benchmarks/attack_quality.py control-point-lr --iterations 100 \\
        --out results/benchmarks/control-point-lr

``quality`` writes the standalone run's files (results.csv, trace-*.csv, client-*.png; see
fl_attack.standalone) plus summary.json / summary.md with the per-method means and the acceptance
checks, and exits 1 if a check fails:
  * PI-SME's mean PSNR exceeds IG's by >= 3 dB over >= 3 clients;
  * PI-SME's mean honest Lsim is <= SME's;
  * the mean label-count accuracy of the recovered labels is >= 0.9.

``control-point-lr`` trains one victim and runs PI-SME once per control-point setting (Adam at
several learning rates, a frozen control point, SGD at several learning rates), writing sweep.csv.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from fl_attack.attacker.attacks import AttackConfig
from fl_attack.evaluation.evaluator import results_row
from fl_attack.federation.config import PAPER, parse_key_values
from fl_attack.standalone import (
    AttackSettings,
    attack_victim,
    run_attack_experiment,
    train_victim,
    validate_settings,
    write_trace,
)

PSNR_MARGIN_DB = 3.0
MIN_CLIENTS = 3
MIN_LABEL_ACCURACY = 0.9
# (name, optimiser, learning rate) of the control point P1 in the sweep; lr 0 keeps P1 at the midpoint.
CONTROL_POINT_VARIANTS = [
    ("adam-1e-3", "adam", 1e-3),
    ("adam-1e-4", "adam", 1e-4),
    ("adam-1e-5", "adam", 1e-5),
    ("adam-1e-6", "adam", 1e-6),
    ("frozen", "adam", 0.0),
    ("sgd-1e-2", "sgd", 1e-2),
    ("sgd-1e-1", "sgd", 1e-1),
    ("sgd-1", "sgd", 1.0),
]


def summarise(rows: list[dict]) -> dict:
    """Per-method means and the acceptance checks of the quality benchmark."""
    table = pd.DataFrame(rows)
    metrics = ["psnr", "ssim", "fsim", "lpips", "lsim_honest", "lsim_calibrated", "label_accuracy", "attack_seconds"]
    means = {
        m: {k: float(v) for k, v in g[metrics].mean().items()} | {"clients": int(g["psnr"].notna().sum())}
        for m, g in table.groupby("method", sort=False)
    }
    checks = {}
    if "pisme" in means and "ig" in means:
        margin = means["pisme"]["psnr"] - means["ig"]["psnr"]
        n = min(means["pisme"]["clients"], means["ig"]["clients"])
        checks["pisme_beats_ig_by_3db"] = {
            "margin_db": margin,
            "clients": n,
            "passed": bool(margin >= PSNR_MARGIN_DB and n >= MIN_CLIENTS),
        }
    if "pisme" in means and "sme" in means:
        checks["pisme_lsim_honest_le_sme"] = {
            "pisme": means["pisme"]["lsim_honest"],
            "sme": means["sme"]["lsim_honest"],
            "passed": bool(means["pisme"]["lsim_honest"] <= means["sme"]["lsim_honest"]),
        }
    accuracy = float(table["label_accuracy"].mean())
    checks["label_accuracy_ge_0.9"] = {"mean": accuracy, "passed": bool(accuracy >= MIN_LABEL_ACCURACY)}
    return {"means": means, "checks": checks}


def _pairs(values: dict, digits: int) -> str:
    """``key=value, ...``, floats to ``digits`` significant digits."""
    return ", ".join(f"{k}={v:.{digits}g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def markdown(summary: dict, rows: list[dict]) -> str:
    lines = [
        "| client | method | PSNR (dB) | SSIM | LPIPS | honest Lsim | calibrated Lsim | label acc. | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['partition_id']} | {r['method']} | {r['psnr']:.2f} | {r['ssim']:.3f} | {r['lpips']:.3f} | "
            f"{r['lsim_honest']:.4f} | {r['lsim_calibrated']:.4f} | {r['label_accuracy']:.2f} | "
            f"{r['attack_seconds']:.0f} |"
        )
    lines += [
        "",
        "| method | clients | PSNR (dB) | SSIM | LPIPS | honest Lsim | label acc. | s/attack |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, v in summary["means"].items():
        lines.append(
            f"| {m} | {v['clients']} | {v['psnr']:.2f} | {v['ssim']:.3f} | {v['lpips']:.3f} | "
            f"{v['lsim_honest']:.4f} | {v['label_accuracy']:.2f} | {v['attack_seconds']:.0f} |"
        )
    lines.append("")
    for name, check in summary["checks"].items():
        details = _pairs({k: v for k, v in check.items() if k != "passed"}, 4)
        lines.append(f"- {name}: {'PASS' if check['passed'] else 'FAIL'} {details}")
    return "\n".join(lines) + "\n"


def _overrides(items: list[str]) -> dict:
    """--set KEY=VALUE pairs as AttackConfig overrides, typed like AttackConfig's defaults
    (ValueError for an unknown key or a value of the wrong type)."""
    return parse_key_values(",".join(items), asdict(AttackConfig()), "--set", "attack setting")


def _settings(args, methods: tuple[str, ...], clients: int, **extra) -> AttackSettings:
    """FEMNIST at the paper's protocol, with the options both subcommands share."""
    return AttackSettings(
        dataset="femnist",
        methods=methods,
        clients=clients,
        **asdict(PAPER),
        iterations=args.iterations,
        nodes=args.nodes,
        seed=args.seed,
        device=args.device,
        trace_every=args.trace_every,
        **extra,
    )


def run_quality(args) -> int:
    settings = _settings(args, tuple(args.methods.split(",")), args.clients, overrides=_overrides(args.set))
    start = time.perf_counter()
    rows = run_attack_experiment(settings, args.out, progress=True)
    wall = time.perf_counter() - start
    summary = summarise(rows) | {
        "wall_seconds": wall,
        "torch_threads": torch.get_num_threads(),
        "command": " ".join(sys.argv),
    }
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = markdown(summary, rows) + f"\nwall time {wall:.0f} s, {torch.get_num_threads()} torch threads\n"
    (out / "summary.md").write_text(text)
    print(text)
    return 0 if all(c["passed"] for c in summary["checks"].values()) else 1


def run_control_point_lr(args) -> int:
    settings = _settings(args, ("pisme",), args.client + 1)
    pool = validate_settings(settings)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    victim = train_victim(pool, args.client, settings)
    variants = [v for v in CONTROL_POINT_VARIANTS if not args.variants or v[0] in args.variants.split(",")]
    rows = []
    for name, optimizer, lr in variants:
        row, outcome = attack_victim(
            victim, "pisme", settings, overrides={"control_point_optimizer": optimizer, "lr_control_point": lr}
        )
        if outcome.status != "ok":
            raise RuntimeError(f"the {name} attack failed: {outcome.error}")
        last = outcome.trace[-1]
        scored = results_row(row)
        row = {
            "variant": name,
            "optimizer": optimizer,
            "lr_control_point": lr,
            **{k: scored[k] for k in ("psnr", "ssim", "lpips", "lsim_honest", "lsim_calibrated", "attack_seconds")},
            "control_point_shift": last.get("control_point_shift", math.nan),
        }
        rows.append(row)
        write_trace(out / f"trace-{name}.csv", outcome.trace)
        pd.DataFrame(rows).to_csv(out / "sweep.csv", index=False)
        print(_pairs(row, 5), flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality", help="PI-SME vs baselines on >= 3 real FEMNIST writers")
    q.add_argument("--clients", type=int, default=3)
    q.add_argument("--methods", default="pisme,sme,ig,nlsme")
    q.add_argument("--out", default="results/benchmarks/attack-quality")
    q.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an AttackConfig override for every method, e.g. --set lr_control_point=1e-4",
    )
    c = sub.add_parser("control-point-lr", help="PI-SME with several control-point optimisers, one writer")
    c.add_argument("--client", type=int, default=0, help="partition id of the FEMNIST writer")
    c.add_argument(
        "--variants", default="", help="comma-separated subset of: " + ",".join(v[0] for v in CONTROL_POINT_VARIANTS)
    )
    c.add_argument("--out", default="results/benchmarks/control-point-lr")
    for p, iterations in ((q, 300), (c, 100)):
        p.add_argument("--iterations", type=int, default=iterations)
        p.add_argument("--nodes", type=int, default=7)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--device", default="auto")
        p.add_argument("--trace-every", type=int, default=10)
        p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return run_quality(args) if args.command == "quality" else run_control_point_lr(args)


if __name__ == "__main__":
    sys.exit(main())
