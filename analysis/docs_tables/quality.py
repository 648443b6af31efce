"""docs/time-to-quality.md's lever and seed tables, from each measurement's levers.csv through the same
functions that write its levers.md and seeds.md (analysis.experiments.time_to_quality)."""

from __future__ import annotations

import csv
from pathlib import Path

from analysis.experiments import time_to_quality

from .core import ROOT, _head

PAGE = Path("docs/time-to-quality.md")
RECORDS = Path("docs/time-to-quality")


def _rows(record: Path) -> list[dict]:
    with open(ROOT / record, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


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
