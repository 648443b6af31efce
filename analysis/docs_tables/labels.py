"""docs/label-recovery.md's RLU table: each label estimator's mean accuracy per set of updates, from
docs/label-recovery-rlu/rlu_labels.csv through the study's own table (analysis.experiments.rlu_labels)."""

from __future__ import annotations

import csv
from pathlib import Path

from .core import ROOT, _head

PAGE = Path("docs/label-recovery.md")
RLU = Path("docs/label-recovery-rlu/rlu_labels.csv")


def rlu_table() -> str:
    """The study's table of its record (the row's best update-based estimator in bold, rlu's updates above /
    below the best of the others, and the median seconds per update), as ``--table`` writes it."""
    from analysis.experiments.rlu_labels import table  # torch: imported only when the block is written

    with open(ROOT / RLU, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return _head(RLU, page=PAGE) + "\n" + table(rows)


BLOCKS = {PAGE: {"rlu-labels": rlu_table}}
