"""The leakage-over-rounds study: federations that learn, tracked clients attacked every round.

    python -m analysis.leakage_study --out DIR [--only femnist,cifar100,femnist-topk] [--skip-replays]

Each run of ``RUNS`` is a real federation through the checked launcher (``strategies.launch``:
Flower simulation, Ray attacker actors, the server's centralised evaluation), 15 rounds
(strategies/run_configs/learning-*.toml), with its tracked clients attacked by PI-SME in every round
and every attacked update recorded. Each entry of ``REPLAYS`` then attacks those recorded updates
again offline (``fl-attack replay``) with another method (SME, IG) or with the true labels
(oracle), so all methods see exactly the same updates.
Everything is resumable: a run or replay that finished (its summary.json exists) is skipped, and
an interrupted run is resumed from its checkpoint. Written into DIR:

- ``runs/<name>/``: each run folder, with ``replays/<replay>/`` inside;
- ``study.csv`` and ``study.md``: per run, method and labels, per round: mean PSNR, SSIM, LPIPS,
  label accuracy and the global model's accuracy;
- ``report/``: ``analysis.report`` over every run and replay (leakage against round and against
  the model's accuracy), as markdown with its figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from fl_attack.records import write_text_atomic
from strategies import run_configs

from .studies import study_main

# The learning regime (FedAvg on real writers at lr 0.05, the paper's local protocol shape at a CPU
# size) lives in the run-config presets strategies/run_configs/learning-{femnist,cifar100}.toml, which
# also run on their own: python -m strategies.launch --run-config strategies/run_configs/learning-femnist.toml
FEMNIST, CIFAR100 = run_configs.load("learning-femnist"), run_configs.load("learning-cifar100")
RUNS: list[tuple[str, dict, int]] = [  # (name, run config, supernodes)
    ("femnist", FEMNIST, 20),
    ("cifar100", CIFAR100, 20),
    ("femnist-topk", {**FEMNIST, "attack-clients": "0", "defense": "topk", "defense-topk-fraction": 0.1}, 20),
]
REPLAYS: list[tuple[str, list[str]]] = [  # (run, fl-attack replay arguments)
    # The runs' PI-SME used the paper's label estimator; SME and IG get the same labels.
    ("femnist", ["--methods", "sme,ig", "--options", "label_estimator=paper", "--name", "sme-ig"]),
    ("femnist", ["--methods", "pisme", "--labels", "oracle", "--name", "pisme-oracle"]),
    ("femnist", ["--methods", "pisme", "--options", "label_estimator=support", "--name", "pisme-support"]),
    ("cifar100", ["--methods", "sme,ig", "--options", "label_estimator=paper", "--name", "sme-ig"]),
    ("cifar100", ["--methods", "pisme", "--labels", "oracle", "--name", "pisme-oracle"]),
]
TABLE_COLUMNS = [
    "run",
    "method",
    "labels",
    "label_estimator",
    "round",
    "global_accuracy",
    "n",
    "psnr",
    "ssim",
    "lpips",
    "label_accuracy",
]


def study_table(folders: list[Path]) -> pd.DataFrame:
    """Per run folder, method, labels and round: the mean leakage over the tracked clients, beside
    the global model's accuracy in that round."""
    from analysis.load import load_run

    frames = []
    for folder in folders:
        run = load_run(folder)
        attacks = run.attacks[run.attacks["status"] == "ok"].copy()
        if attacks.empty:
            continue
        name = folder.name if folder.parent.name != "replays" else f"{folder.parent.parent.name}/{folder.name}"
        if "label_estimator" not in attacks:
            attacks["label_estimator"] = ""
        attacks["label_estimator"] = attacks["label_estimator"].fillna("")
        grouped = (
            attacks.groupby(["method", "labels", "label_estimator", "round"])
            .agg(
                n=("psnr", "size"),
                psnr=("psnr", "mean"),
                ssim=("ssim", "mean"),
                lpips=("lpips", "mean"),
                label_accuracy=("label_accuracy", "mean"),
            )
            .reset_index()
        )
        accuracy = run.rounds.set_index("round")["global_accuracy"] if "global_accuracy" in run.rounds else None
        grouped["global_accuracy"] = grouped["round"].map(accuracy) if accuracy is not None else float("nan")
        grouped.insert(0, "run", name)
        frames.append(grouped)
    return pd.concat(frames, ignore_index=True)[TABLE_COLUMNS] if frames else pd.DataFrame(columns=TABLE_COLUMNS)


def write_outputs(out: Path, folders: list[Path]) -> pd.DataFrame:
    """study.csv, study.md and the report over every folder."""
    from analysis.report import main as report_main

    table = study_table(folders)
    write_text_atomic(out / "study.csv", table.to_csv(index=False, float_format="%.4g"))
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row) + " |")
    write_text_atomic(out / "study.md", "\n".join(lines) + "\n")
    if folders:
        report_main([*map(str, folders), "--out", str(out / "report"), "--format", "md"])
    return table


def main(argv: list[str] | None = None) -> int:
    return study_main(
        argv,
        label="leakage study",
        prog="python -m analysis.leakage_study",
        doc=__doc__,
        runs=RUNS,
        replays=REPLAYS,
        outputs=write_outputs,
    )


if __name__ == "__main__":
    sys.exit(main())
