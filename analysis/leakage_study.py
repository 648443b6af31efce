"""The leakage-over-rounds study: federations that learn, tracked clients attacked every round.

    python -m analysis.leakage_study --out DIR [--only femnist,cifar100] [--skip-replays]

Each run of ``RUNS`` is a real federation through the checked launcher (``strategies.launch``:
Flower simulation, Ray attacker actors, the server's centralised evaluation), 15 rounds
(strategies/run_configs/learning-*.toml), with its tracked clients attacked in every round by the
audit's default attack (PI-SME, m, iterations and schedule chosen from the update's T) and by the
server that remembers (``attack-memory="keep"``: the ``pisme+memory`` rows), every attacked update
recorded and every attack scored by the verdict. Each entry of ``REPLAYS`` then attacks those recorded
updates again offline (``fl-attack replay``) with another method (SME, IG) or with the true labels
(oracle), so all methods see exactly the same updates.
Everything is resumable: a run or replay that finished (its summary.json exists) is skipped, and
an interrupted run is resumed from its checkpoint. Written into DIR:

- ``runs/<name>/``: each run folder, with ``replays/<replay>/`` inside;
- ``study.csv`` and ``study.md``: per run, method and labels, per round: the images recovered (the
  verdict's count summed over the tracked clients, its exact 95% interval, the best update-free
  guess's count, the matched chance), mean PSNR, SSIM, LPIPS, label accuracy and the global model's
  accuracy (``TABLE_COLUMNS``);
- ``study.json``: each call's command, commit and wall time, each run's and replay's (analysis.studies);
- ``report/``: ``analysis.report`` over every run and replay (leakage against round and against
  the model's accuracy), as markdown with its figures.

``python -m analysis.docs rounds-record DIR`` copies the record into docs/leakage-over-rounds/ and writes
docs/leakage-over-rounds.md's tables and figure from it.
"""

from __future__ import annotations

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
]
# The runs attack with the audit's defaults; each replay changes one thing on the same updates, at four of
# the rounds, without memory (every round, and their remembering twins, would cost the study several times over).
REPLAY_ROUNDS = ["--rounds", "1,5,10,15", "--memory", "none"]  # the memoryless methods alone
REPLAYS: list[tuple[str, list[str]]] = [  # (run, fl-attack replay arguments with --name)
    ("femnist", ["--methods", "sme,ig", *REPLAY_ROUNDS, "--name", "sme-ig"]),
    ("femnist", ["--methods", "pisme", "--labels", "oracle", *REPLAY_ROUNDS, "--name", "pisme-oracle"]),
    ("cifar100", ["--methods", "sme,ig", *REPLAY_ROUNDS, "--name", "sme-ig"]),
    ("cifar100", ["--methods", "pisme", "--labels", "oracle", *REPLAY_ROUNDS, "--name", "pisme-oracle"]),
]
TABLE_COLUMNS = [
    "run",
    "method",
    "labels",
    "label_estimator",
    "round",
    "global_accuracy",
    "n",
    "images",
    "recovered",
    "fraction",
    "fraction_low",
    "fraction_high",
    "guess_recovered",
    "chance",
    "psnr",
    "ssim",
    "lpips",
    "label_accuracy",
]
COLUMN_MEANINGS = {
    "run": "the run folder's name (a replay: RUN/REPLAY)",
    "method": 'the attack ("METHOD+memory": the remembering server\'s estimate)',
    "labels": "recovered or oracle",
    "label_estimator": "the label estimator of recovered labels",
    "round": "the attacked round",
    "global_accuracy": "the global model's accuracy on the server's held-out samples after the round",
    "n": "the attacks scored (one per tracked client)",
    "images": "their images (the sum of k)",
    "recovered": "the images recovered, summed (the verdict's count)",
    "fraction": "recovered / images",
    "fraction_low": "the low end of its exact (Clopper-Pearson) two-sided 95% interval",
    "fraction_high": "the high end",
    "guess_recovered": "the best update-free guess's count, summed (the floor)",
    "chance": "the matched chance of a recovery (the k-weighted mean of reid_chance)",
    "psnr": "mean PSNR after matching (dB)",
    "ssim": "mean SSIM",
    "lpips": "mean LPIPS",
    "label_accuracy": "mean label accuracy",
}


def study_table(folders: list[Path]) -> pd.DataFrame:
    """Per run folder, method, labels and round (``TABLE_COLUMNS``, ``COLUMN_MEANINGS``): the images
    the attacks on the tracked clients recovered, summed, with the exact 95% interval, the best guess
    and the chance (the verdict's own columns of attacks.csv, never recomputed; empty for rows scored
    without the verdict), their mean image metrics, beside the global model's accuracy in that round."""
    from analysis.frontier import exact_interval
    from analysis.load import load_run

    def total(values: pd.Series) -> float:  # NaN unless every attack has the value
        return values.sum(min_count=len(values))

    frames = []
    for folder in folders:
        run = load_run(folder)
        attacks = run.attacks[run.attacks["status"] == "ok"].copy()
        if attacks.empty:
            continue
        name = folder.name if folder.parent.name != "replays" else f"{folder.parent.parent.name}/{folder.name}"
        attacks["label_estimator"] = attacks["label_estimator"].fillna("") if "label_estimator" in attacks else ""
        for column in ("recovered", "guess_recovered", "reid_chance", "k"):
            if column not in attacks:
                attacks[column] = float("nan")
        attacks["chance_weight"] = attacks["reid_chance"] * attacks["k"]
        grouped = (
            attacks.groupby(["method", "labels", "label_estimator", "round"])
            .agg(
                n=("psnr", "size"),
                images=("k", total),
                recovered=("recovered", total),
                guess_recovered=("guess_recovered", total),
                chance_weight=("chance_weight", total),
                psnr=("psnr", "mean"),
                ssim=("ssim", "mean"),
                lpips=("lpips", "mean"),
                label_accuracy=("label_accuracy", "mean"),
            )
            .reset_index()
        )
        grouped["fraction"] = grouped["recovered"] / grouped["images"]
        grouped["chance"] = grouped["chance_weight"] / grouped["images"]
        interval = [exact_interval(r, i) for r, i in zip(grouped["recovered"], grouped["images"])]
        grouped["fraction_low"] = [low for low, _ in interval]
        grouped["fraction_high"] = [high for _, high in interval]
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
    from .studies import command_line

    command_line(main, "leakage study", "rerun the same command (finished runs are kept, an interrupted one resumed)")
