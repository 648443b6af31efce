"""docs/time-to-quality.md's lever and seed tables, from each measurement's levers.csv through the same
functions that write its levers.md and seeds.md (analysis.experiments.time_to_quality)."""

from __future__ import annotations

from pathlib import Path

from analysis.experiments import time_to_quality
from fl_attack.records import read_csv
from fl_attack.schema import FORMER_NAMES

from .core import ROOT, _head, _signed, _table

PAGE = Path("docs/time-to-quality.md")
RECORDS = Path("docs/time-to-quality")


def _rows(record: Path) -> list[dict]:
    """The record's rows under today's column names (a dated levers.csv says nodes)."""
    return read_csv(ROOT / record, FORMER_NAMES, time_to_quality.COLUMNS)[1]


def _levers(folder: str):
    record = RECORDS / folder / "levers.csv"
    return lambda: _head(record, page=PAGE) + "\n" + time_to_quality.table(_rows(record)).rstrip("\n")


def _seeds(folder: str):
    record = RECORDS / folder / "levers.csv"
    return lambda: _head(record, page=PAGE) + "\n" + time_to_quality.seed_table(_rows(record)).rstrip("\n")


BLOCKS = {
    PAGE: {
        "ttq-levers-demo": _levers(""),
        "ttq-levers-paper": _levers("paper"),
        "ttq-levers-heldout": _levers("heldout"),
        "ttq-seeds-demo": _seeds("third-demo"),
        "ttq-seeds-heldout": _seeds("third-heldout"),
        "ttq-seeds-paper": _seeds("third-paper"),
        "ttq-levers-third-demo": _levers("third-demo"),
        "ttq-levers-third-heldout": _levers("third-heldout"),
        "ttq-levers-third-paper": _levers("third-paper"),
    }
}


# --- the summary of the three sets (issue #50's target), from the seed measurements -------------------------

SETS = [  # (record folder, the page's words for its updates, the rounds kept, the options of "today")
    ("third-demo", "the demo, writer 0, rounds 1–3", None, "label_estimator=aux"),
    ("third-demo", "its round 1 alone, the issue's own case", 1, "label_estimator=aux"),
    (
        "third-paper",
        "the paper-protocol federation, 3 writers × rounds 1–2 (lr 0.004, T=10; its m=7 for today's columns)",
        None,
        "",
    ),
    (
        "third-heldout",
        "the demo's federation, held-out writers 1 and 2, rounds 1–2",
        None,
        "label_estimator=aux,lr_decay=True,lr_images=1.0",
    ),
]


def _arm(rows: list[dict], options: str, iterations: int, nodes: int | None = None) -> dict[int, list[dict]]:
    """{attack seed: its rows} of the setting (``options`` less the seed, ``iterations``, ``nodes`` if given)."""
    arm: dict[int, list[dict]] = {}
    for r in rows:
        kept, seed = time_to_quality._setting(r["options"])
        m = int(r["gradients_per_iteration"])  # PI-SME's m
        if kept == options and int(r["iterations"]) == iterations and nodes in (None, m):
            arm.setdefault(seed, []).append(r)
    if not arm:
        raise ValueError(f"no rows of options {options!r} at {iterations} iterations")
    return dict(sorted(arm.items()))


def _counts(arm: dict[int, list[dict]]) -> list[int]:
    return [sum(int(r["recovered"]) for r in rows) for rows in arm.values()]


def _count_cell(arm: dict[int, list[dict]]) -> str:
    """'15, 10, 10 (11.7)' over seeds, '3 (seed 0)' for one seed."""
    counts = _counts(arm)
    if len(counts) == 1:
        return f"{counts[0]} (seed {next(iter(arm))})"
    return f"{', '.join(map(str, counts))} ({sum(counts) / len(counts):.1f})"


def _seconds(arm: dict[int, list[dict]]) -> float:
    every = [r for rows in arm.values() for r in rows]
    return sum(float(r["attack_seconds"]) for r in every) / len(every)


def summary() -> str:
    records = [RECORDS / folder / "levers.csv" for folder in ("third-demo", "third-paper", "third-heldout")]
    body = []
    for folder, words, round_, today in SETS:
        rows = [r for r in _rows(RECORDS / folder / "levers.csv") if round_ in (None, int(r["round"]))]
        aux = "label_estimator=aux," if today else ""
        arms = [
            _arm(rows, today, 200),
            _arm(rows, today, 1000),
            _arm(rows, f"{aux}lr_decay=False,lr_images=0.3", 200, None if today else 7),
            _arm(rows, f"{aux}lr_schedule=plateau,lr_images=1.0", 400, 1),
        ]
        images = sum(int(r["k"]) for r in next(iter(arms[0].values())))
        gain = sum(_counts(arms[3])) / len(arms[3]) - sum(_counts(arms[1])) / len(arms[1])
        seconds = " / ".join(f"{_seconds(arms[i]):.0f}" for i in (0, 1, 3))
        body.append([f"{words} ({images} images)", *map(_count_cell, arms), _signed(gain), seconds])
    header = [
        "recorded updates",
        "today, 200 it., m=3",
        "today, 1,000 it., m=3",
        "constant 0.3, 200 it., m=3 (the last default)",
        "the default: m=1, 400 it., plateau",
        "default − today at 1,000 (mean)",
        "mean s an attack: today 200 / 1,000 / default",
    ]
    return _head(*records, page=PAGE) + "\n" + _table(header, body)


BLOCKS[PAGE]["ttq-summary"] = summary
