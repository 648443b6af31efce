"""The defense study: one federation per defense setting, and what each costs the attacker and the model.

    python -m analysis.defenses --grid frontier --out DIR [--resume] [--only ...] [--ray-address HEAD:6379]
    python -m analysis.defenses --dataset femnist --rounds R --out DIR [--only none,secagg] [--resume]
    python -m analysis.defenses --grid privacy --rounds 10 --out DIR [--resume]

``--grid frontier`` is the privacy-utility frontier (analysis/frontier.py: its regime, grid and
frontier.csv; docs/defenses.md, "The privacy-utility frontier"). Its settings run one after another,
or, with ``--ray-address``, as Ray jobs on that cluster (analysis/ray_jobs.py). The rest of this
docstring is the older grids' (their study: docs/defenses-2026-12.md).

Runs every setting of ``GRID`` as a real federation through the checked launcher
(``strategies.launch``; Flower simulation, Ray attacker actors, evaluator), all at the same scale
(``SCALE``, overridable: --supernodes, --samples, --iterations), and writes into DIR:

- ``runs/<setting>/``: each run folder (config.json, rounds.csv, attacks.csv, images/);
- ``defenses.csv`` and ``defenses.md``: one row per setting: defense, parameters, mean PSNR, SSIM,
  LPIPS and label accuracy of PI-SME's reconstructions (over ok attacks), final accuracy (global
  when the run has it, else the clients' eval accuracy);
- ``leakage_vs_accuracy.png``: final test accuracy against mean PSNR, one point per setting;
- ``report/report.html``: analysis.write_report over all the runs.

The grid (a small one, sized for CPUs):

| setting | defense | why |
|---|---|---|
| none | none | the baseline leakage |
| local-dp-weak | local-dp, C=0.05, epsilon=1000 | Flower's LocalDpMod, noise norm about the update norm |
| local-dp-strong | local-dp, C=0.05, epsilon=10 | a strong local DP setting |
| central-dp | central-dp, server-side clipping, C=0.05, z=1 | the attacker sees clipped, noise-free updates |
| secagg | secagg (SecAgg+, 3 shares, threshold 2) | the attacker sees only the aggregate |
| topk | topk 0.1, adaptive attacker | matches only the observed coordinates |
| topk-naive | topk 0.1, naive attacker | matches all coordinates, zeros included |
| low-rank | low-rank, r=2 | rank-2 update of every weight matrix |
| quantize | quantize, 2 bits | stochastic quantisation |

``--grid privacy`` runs ``PRIVACY_GRID`` at ``PRIVACY_SCALE`` instead (20 clients by default): none,
local-dp at per-round ε 10⁴, 10³, 10² and central-dp at z = 0.01, 0.1, 1 on a learning FEMNIST
federation, with the ε spent in the table (docs/defenses.md, "The privacy-budget study").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import pandas as pd

from fl_attack.federation.config import PRESETS
from fl_attack.records import write_text_atomic

from .studies import launch_run

GRID: list[tuple[str, dict]] = [
    ("none", {"defense": "none"}),
    ("local-dp-weak", {"defense": "local-dp", "defense-clip-norm": 0.05, "defense-epsilon": 1000.0}),
    ("local-dp-strong", {"defense": "local-dp", "defense-clip-norm": 0.05, "defense-epsilon": 10.0}),
    (
        "central-dp",
        {
            "defense": "central-dp",
            "defense-clipping": "server",
            "defense-clip-norm": 0.05,
            "defense-noise-multiplier": 1.0,
        },
    ),
    ("secagg", {"defense": "secagg", "secagg-num-shares": 3, "secagg-reconstruction-threshold": 2}),
    ("topk", {"defense": "topk", "defense-topk-fraction": 0.1, "defense-adaptive-attack": True}),
    ("topk-naive", {"defense": "topk", "defense-topk-fraction": 0.1, "defense-adaptive-attack": False}),
    ("low-rank", {"defense": "low-rank", "defense-rank": 2}),
    ("quantize", {"defense": "quantize", "defense-bits": 2}),
]
# The common scale of every run: the "cpu" preset's victims (k=8 samples per client, B=4, lr 0.004)
# for E=5 (T=10 local steps), one attacked client (partition 0) per round, PI-SME with 100
# iterations and m=3 nodes.
SCALE = {
    **PRESETS["cpu"].protocol.with_epochs(5).run_config(),
    "attack-method": "pisme",
    "attack-clients": "0",
    "attack-iterations": 100,
    "attack-nodes": 3,
    "attack-lr-schedule": "steps",  # as its docs were recorded
    "seed": 0,
}
# The privacy-budget study (docs/defenses.md, "The privacy budget spent"): a learning FEMNIST
# federation (the regime of strategies/run_configs/learning-femnist.toml: k=16, B=8, E=5, lr 0.05;
# 20 writers, half of them sampled per round) with three tracked writers attacked by PI-SME,
# memoryless and by a server that remembers (attack-memory=keep); local-dp at three per-round
# epsilons and central-dp at three noise multipliers, with C = 0.5 (about the round-1 update norm).
PRIVACY_GRID: list[tuple[str, dict]] = [
    ("none", {"defense": "none"}),
    *(
        (f"local-dp-eps{eps:g}", {"defense": "local-dp", "defense-clip-norm": 0.5, "defense-epsilon": float(eps)})
        for eps in (10000, 1000, 100)
    ),
    *(
        (
            f"central-dp-z{z:g}",
            {
                "defense": "central-dp",
                "defense-clip-norm": 0.5,
                "defense-noise-multiplier": z,
                "defense-clipping": "server",
            },
        )
        for z in (0.01, 0.1, 1.0)
    ),
]
PRIVACY_SCALE = {
    "samples-per-client": 16,
    "batch-size": 8,
    "local-epochs": 5,
    "lr": 0.05,
    "fraction-train": 0.5,
    "server-test-samples": 1000,
    "attack-method": "pisme",
    "attack-memory": "keep",
    "attack-clients": "0,1,2",
    "attack-iterations": 100,
    "attack-nodes": 3,
    "attack-lr-schedule": "steps",  # as its docs were recorded
    "seed": 0,
}
GRIDS = {"defenses": (GRID, SCALE), "privacy": (PRIVACY_GRID, PRIVACY_SCALE)}
CHOICES = [*GRIDS, "frontier"]
TABLE_COLUMNS = [
    "setting",
    "defense",
    "parameters",
    "attacks",
    "recovered",
    "images",
    "reidentified",
    "psnr_margin",
    "psnr",
    "ssim",
    "lpips",
    "label_accuracy",
    "psnr_memory",
    "final_accuracy",
    "epsilon",
]


def summarize(run_dirs: list[Path], settings: list[str]) -> pd.DataFrame:
    """One row per run: TABLE_COLUMNS: the images recovered of those attacked (sums over the ok
    memoryless attacks with a verdict), metric means over the ok memoryless attacks, psnr_memory over
    the ok "+memory" rows (NaN without), final accuracy (`final_accuracy`) and the ε spent by the
    last round (rounds.csv's, the most any client spent; NaN without DP)."""
    from .aggregate import final_accuracy
    from .load import load_run

    rows = []
    for setting, path in zip(settings, run_dirs):
        run = load_run(path)
        defense = run.config.get("defense", {})
        ok = run.attacks[run.attacks["status"] == "ok"]
        remembered = ok["memory"].fillna("").astype(str) != ""
        memoryless = run.attacks[run.attacks["memory"].fillna("").astype(str) == ""]
        row = {
            "setting": setting,
            "defense": defense.get("label", "?"),
            "parameters": json.dumps({k: v for k, v in defense.get("parameters", {}).items()}),
            "attacks": f"{int((~remembered).sum())}/{len(memoryless)}",
        }
        judged = ok.loc[~remembered & ok["recovered"].notna()]  # the verdict (fl_attack.evaluation.verdict)
        row["recovered"] = float(judged["recovered"].sum()) if len(judged) else math.nan
        row["images"] = float(judged["k"].sum()) if len(judged) else math.nan
        for metric in ("reidentified", "psnr_margin", "psnr", "ssim", "lpips", "label_accuracy"):
            values = ok.loc[~remembered, metric].dropna()
            row[metric] = float(values.mean()) if len(values) else math.nan
        row["psnr_memory"] = float(ok.loc[remembered, "psnr"].mean()) if remembered.any() else math.nan
        row["final_accuracy"] = final_accuracy(run)[0]
        spent = run.rounds.sort_values("round")["epsilon"].dropna()
        row["epsilon"] = float(spent.iloc[-1]) if len(spent) else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def markdown_table(table: pd.DataFrame) -> str:
    """The study table as Markdown, the verdict first (images recovered of those attacked, the fraction
    singled out, PSNR over the guess), then PSNR in dB (2 decimals), SSIM, LPIPS (3), accuracies in %."""

    def num(value, digits):
        return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"

    def pct(value):
        return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f}%"

    def recovered(r):
        return "n/a" if math.isnan(r.recovered) else f"{int(r.recovered)} of {int(r.images)}"

    lines = [
        "| setting | defense | parameters | attacks ok | images recovered | singled out | PSNR over the guess (dB) "
        "| PSNR (dB) | SSIM | LPIPS | label acc. | PSNR +memory (dB) | final test acc. | ε spent |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        params = (
            ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in json.loads(r.parameters).items()
            )
            or "-"
        )
        lines.append(
            f"| {r.setting} | `{r.defense}` | {params} | {r.attacks} | {recovered(r)} | {pct(r.reidentified)} | "
            f"{num(r.psnr_margin, 2)} | {num(r.psnr, 2)} | "
            f"{num(r.ssim, 3)} | {num(r.lpips, 3)} | {pct(r.label_accuracy)} | {num(r.psnr_memory, 2)} | "
            f"{pct(r.final_accuracy)} | {'-' if math.isnan(r.epsilon) else f'{r.epsilon:.3g}'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.defenses", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="defenses", choices=CHOICES, help="which study: its settings and scale")
    parser.add_argument("--dataset", default="femnist", choices=["femnist", "cifar100"])
    parser.add_argument("--rounds", type=int, default=None, help="FedAvg rounds per run (2; frontier: its regime's)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--supernodes", type=int, default=None, help="clients per federation (4; privacy: 20; frontier: its regime's)"
    )
    parser.add_argument("--samples", type=int, default=None, help="k, samples per client (the grid's scale)")
    parser.add_argument(
        "--iterations", type=int, default=None, help="attack iterations (the grid's; frontier: the audit's default)"
    )
    parser.add_argument("--seed", type=int, default=None, help="the runs' seed (the grid's scale: 0)")
    parser.add_argument("--only", default="", help="comma-separated settings of the grid to run (default: all)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs of DIR that finished, resume the interrupted ones, restart those that cannot be resumed",
    )
    parser.add_argument(
        "--ray-address",
        default="",
        help="frontier: submit each setting as a Ray job to this cluster (HEAD:6379 of `ray start --head`)",
    )
    parser.add_argument(
        "--job-resource",
        default="",
        help="frontier with --ray-address: a custom resource each job asks one unit of (run K at a time)",
    )
    args = parser.parse_args(argv)
    if args.grid == "frontier":
        return frontier_main(args, parser, argv)
    if args.ray_address or args.job_resource:
        parser.error("--ray-address and --job-resource are for --grid frontier")
    args.rounds = 2 if args.rounds is None else args.rounds

    grid, base = GRIDS[args.grid]
    supernodes = args.supernodes or (20 if args.grid == "privacy" else 4)
    names = [name for name, _ in grid]
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; choose from {', '.join(names)}")
    if args.rounds < 1 or supernodes < 2:
        parser.error("--rounds must be >= 1 and --supernodes >= 2")
    out = Path(args.out).resolve()
    results = out / "runs"

    def log(message):
        print(f"analysis.defenses: {message}", flush=True)

    samples = args.samples or base["samples-per-client"]
    scale = {
        **base,
        "samples-per-client": samples,
        "batch-size": min(base["batch-size"], samples),
        "attack-iterations": args.iterations or base["attack-iterations"],
        "seed": base["seed"] if args.seed is None else args.seed,
    }
    run_dirs, settings, failed = [], [], []
    for name, setting in grid:
        if name not in chosen:
            continue
        config = {"dataset": args.dataset, "num-server-rounds": args.rounds, **scale, **setting}
        if launch_run(results / name, config, supernodes, log, reuse=args.resume):
            run_dirs.append(results / name)
            settings.append(name)
        else:
            failed.append(name)
    if not run_dirs:
        print("analysis.defenses: error: no run completed", file=sys.stderr)
        return 1

    from . import write_report
    from .load import load_run
    from .plots import plot_utility_vs_leakage, save_figure

    table = summarize(run_dirs, settings)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "defenses.csv", table.to_csv(index=False))
    scale_text = f"{args.dataset}, {supernodes} clients, {args.rounds} round(s), " + ", ".join(
        f"{k}={v}" for k, v in scale.items()
    )
    write_text_atomic(out / "defenses.md", f"Scale: {scale_text}\n\n" + markdown_table(table))
    save_figure(plot_utility_vs_leakage([load_run(d) for d in run_dirs]), out / "leakage_vs_accuracy.png")
    report = write_report(run_dirs, out / "report")
    print(markdown_table(table), flush=True)
    print(
        f"analysis.defenses: table {out / 'defenses.md'}, plot {out / 'leakage_vs_accuracy.png'}, report {report}",
        flush=True,
    )
    if failed:
        print(f"analysis.defenses: error: these runs failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def frontier_main(args, parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """``--grid frontier``: run the grid (analysis.frontier.run_grid), then frontier.md and its figures
    from frontier.csv. --seed alone runs the study's second configuration (the same regime at another seed,
    to check its findings); --rounds, --supernodes, --samples and --iterations change the regime for a quick
    look (a test, a fixture): such a run is not the study, and says so."""
    from .frontier import REGIME_ROUNDS, REGIME_SUPERNODES, frontier_grid, run_grid
    from .studies import end_call, record_call, start_call

    rounds = args.rounds or REGIME_ROUNDS
    supernodes = args.supernodes or REGIME_SUPERNODES
    if args.dataset != "femnist":
        parser.error("--grid frontier is a FEMNIST study (its regime: analysis/frontier.py)")
    if rounds < 1 or supernodes < 3:
        parser.error("--rounds must be >= 1 and --supernodes >= 3 (the tracked panel is partitions 0, 1, 2)")
    grid = frontier_grid(supernodes)
    names = [s.name for s in grid]
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; choose from {', '.join(names)}")
    overrides = {}
    if args.samples is not None:
        overrides.update({"samples-per-client": args.samples, "batch-size": min(16, args.samples)})
    if args.iterations is not None:
        overrides["attack-iterations"] = args.iterations
    if args.seed is not None:
        overrides["seed"] = args.seed
    out = Path(args.out).resolve()

    def log(message):
        print(f"analysis.defenses: {message}", flush=True)

    if set(overrides) == {"seed"} and not (args.rounds or args.supernodes):
        log(f"the study's second configuration: the regime at seed {args.seed} (docs: frontier-second-record)")
    elif overrides or args.rounds or args.supernodes:
        changed = f"{overrides or ''} {rounds} rounds, {supernodes} clients"
        log(f"a quick look, not the study: the regime changed by {changed}")
    by_name = {s.name: s for s in grid}
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    call = start_call(out, "analysis.defenses", argv, started)
    rows, failed = run_grid(
        out,
        [by_name[n] for n in chosen],  # in --only's order: the rows stay in the grid's
        rounds,
        supernodes,
        resume=args.resume,
        overrides=overrides,
        ray_address=args.ray_address,
        job_resource=args.job_resource,
        log=log,
        grid_order=names,
        timings=call["settings"],
        on_setting=lambda: record_call(out, call),  # each setting's time kept, even if the call is killed later
    )
    end_call(out, call, started)
    if rows:
        write_frontier_outputs(out)
    if failed:
        print(f"analysis.defenses: error: these runs failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    if not rows:
        print("analysis.defenses: error: no run completed", file=sys.stderr)
        return 1
    return 0


def write_frontier_outputs(out: Path) -> None:
    """out/frontier.md, out/frontier.png and out/frontier-rounds.png from out/frontier.csv."""
    from .frontier import read_frontier
    from .frontier_figure import frontier_markdown, plot_frontier, plot_rounds
    from .plots import save_figure

    table = read_frontier(out / "frontier.csv")
    write_text_atomic(out / "frontier.md", frontier_markdown(table))
    save_figure(plot_frontier(table), out / "frontier.png")
    save_figure(plot_rounds(table), out / "frontier-rounds.png")
    print(frontier_markdown(table), flush=True)
    print(f"analysis.defenses: {out / 'frontier.csv'}, {out / 'frontier.md'}, {out / 'frontier.png'}", flush=True)


if __name__ == "__main__":
    from .studies import command_line

    command_line(main, "analysis.defenses", "rerun with --resume")
