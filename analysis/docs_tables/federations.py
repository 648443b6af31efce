"""docs/real-federations.md's tables: the optimizer isolated (client-optimizers.csv), the whole federations
(study.csv) and four of them re-read with the verdict (verdict/*-attacks.csv)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .core import _head, _read, _signed, _table, fixed, per_round, records_table, text

PAGE = Path("docs/real-federations.md")
RECORDS = Path("docs/real-federations")
OPTIMIZERS = RECORDS / "client-optimizers.csv"
FIRST_MOMENT = RECORDS / "adam-first-moment.csv"  # Adam's aware rows before its steps counted alike
STUDY = RECORDS / "study.csv"

_REGIMES = {
    "sgd": "sgd (the paper's)",
    "momentum": "momentum 0.9",
    "nesterov": "nesterov 0.9",
    "momentum-wd": "momentum 0.9, weight decay 5e-4",
    "adam": "adam, first-moment weights (withdrawn)",
}


def _aware_minus_naive(rows: pd.DataFrame) -> str:
    """Mean over victims of aware − naive PSNR on the same update, and on how many the aware arm won."""
    pairs = rows.pivot_table(index="client", columns="optimizer_aware", values="psnr")
    if False not in pairs.columns:
        return "identical by construction"
    gain = pairs[True] - pairs[False]
    return f"{_db(gain.mean())} dB, {int((gain > 0).sum())}/{len(gain)}"


def _db(x: float) -> str:
    """+0.76, −0.17 (a typographic minus): a PSNR difference to 0.01 dB."""
    return f"{x:+.2f}".replace("-", "−")


def client_optimizers() -> str:
    """Per regime and T: seed 0's and seed 1's aware − naive (mean, wins), seed 0's aware PSNR. The SGD family
    from client-optimizers.csv; Adam's withdrawn first-moment rows from adam-first-moment.csv."""
    current, first = _read(OPTIMIZERS), _read(FIRST_MOMENT)
    out = []
    for frame, regimes in ((current, ["sgd", "momentum", "nesterov", "momentum-wd"]), (first, ["adam"])):
        for steps in (10, 100):
            for regime in regimes:
                rows = frame[(frame["regime"] == regime) & (frame["local_steps"] == steps)]
                seeds = [rows[rows["seed"] == seed] for seed in (0, 1)]
                aware = seeds[0][seeds[0]["optimizer_aware"]]["psnr"].mean()
                out.append(
                    [
                        _REGIMES[regime],
                        str(steps),
                        *(_aware_minus_naive(s) if len(s) else "" for s in seeds),
                        f"{aware:.1f}",
                    ]
                )
    header = ["regime", "T", "seed 0: aware − naive, wins", "seed 1: aware − naive, wins", "PSNR aware, seed 0"]
    return _head(OPTIMIZERS, FIRST_MOMENT, page=PAGE) + "\n" + _table(header, out)


_RUNS = {  # each run's regime in the page's words, and its pixels per parameter (k·784 / the model's size)
    "paper": ("plain SGD lr 0.004, the paper's partitions (one writer each)", "0.037"),
    "quickstart-iid": ("momentum 0.9 lr 0.01, IID (Flower's quickstart)", "0.037"),
    "momentum-wd-iid": ("+ weight decay 5e-4", "0.037"),
    "adam-iid": ("Adam lr 1e-3, IID (its aware attack is the naive one)", "0.037"),
    "dirichlet-1": ("momentum 0.9, Dirichlet α=1", "0.037"),
    "dirichlet-0.1": ("momentum 0.9, Dirichlet α=0.1", "0.037"),
    "whole-writers": (
        "momentum 0.9, natural partitions, the whole writer (k=144 and 133), B=32, E=1 (T=5); 1 round, 2 clients",
        "0.33",
    ),
    "batchnorm-eval": (
        "a batch-norm net (BN on input and after each conv, max pooling, dropout), eval mode, momentum",
        "0.51",
    ),
    "batchnorm-train": ("the same net in train mode", "0.51"),
    "batchnorm-train-seed1": ("the same, seed 1 (other w0, data draw and batches), E=2 (T=4)", "0.51"),
    "flower-app-cifar100": (
        "the flower-app recipe ([audit-your-app.md](audit-your-app.md)) made small (k=16, B=8, E=5, 100 "
        "iterations, no memory): quickstart CNN (max pooling) on CIFAR-100, momentum, Dirichlet 0.5; 2 clients",
        "0.71",
    ),
}


def _naive_gain(study: pd.DataFrame) -> object:
    """The cell of a run's aware − naive: its mean PSNR minus its naive replay's over the same (client, round)
    pairs (the rounds' means are over equally many clients), blank where no replay was recorded."""

    def cell(group: pd.DataFrame) -> str:
        naive = study[study["run"] == group["run"].iloc[0] + "/naive"]
        if group["run"].iloc[0] == "paper":
            return "(identical)"
        if naive.empty:
            return ""
        return f"{_db(group['psnr'].mean() - naive['psnr'].mean())} dB"

    return cell


def federations_study() -> str:
    """One row per run of study.csv (its naive replays are the aware − naive column): mean PSNR and label
    accuracy over the tracked clients per round."""
    study = _read(STUDY)
    return records_table(
        PAGE,
        STUDY,
        [
            ("run", lambda g: g["run"].iloc[0]),
            ("regime", text("run", {run: words for run, (words, _) in _RUNS.items()})),
            ("PSNR r1 / r2", per_round("psnr", fixed(".1f"))),
            ("label acc. r1 / r2", per_round("label_accuracy", fixed(".2f"))),
            ("aware − naive", _naive_gain(study)),
            ("pixels per parameter", text("run", {run: pixels for run, (_, pixels) in _RUNS.items()})),
        ],
        by="run",
        rows=list(_RUNS),
    )


VERDICT_RUNS = {
    "paper": "paper (plain SGD lr 0.004, one writer each; rerun 2026-12-06)",
    "quickstart-iid": "quickstart-iid (momentum 0.9 lr 0.01, IID)",
    "adam-iid": "adam-iid (Adam lr 1e-3, IID)",
    "dirichlet-0.1": "dirichlet-0.1 (momentum 0.9, Dirichlet α = 0.1)",
}


def _verdict_round(r: int):
    def cell(group: pd.DataFrame) -> str:
        rows = group[group["round"] == r]
        recovered = f"{rows['recovered'].sum()} of {rows['k'].sum()}"
        return f"{recovered}, {100 * rows['reidentified'].mean():.0f}%, {_signed(rows['psnr_margin'].mean())} dB"

    return cell


def federations_verdict() -> str:
    """The four runs re-read with the verdict: per round, images recovered over the tracked clients' k,
    the share singled out, the mean PSNR over the best update-free guess."""
    records = [RECORDS / "verdict" / f"{run}-attacks.csv" for run in VERDICT_RUNS]
    return records_table(
        PAGE,
        records,
        [
            ("run", lambda g: VERDICT_RUNS[g["record"].iloc[0].removesuffix("-attacks")]),
            ("round 1: recovered, singled out, PSNR over the guess", _verdict_round(1)),
            ("round 2", _verdict_round(2)),
        ],
        where=lambda f: f["method"] == "pisme",
        by="record",
    )


BLOCKS = {
    PAGE: {
        "federations-optimizers": client_optimizers,
        "federations-study": federations_study,
        "federations-verdict": federations_verdict,
    }
}
