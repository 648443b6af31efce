"""The docs' tables of measured figures, written from the records committed under docs/ (never by hand).

Each block is a table between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` on its page, written by
``python -m analysis.docs records`` (and ``all``) from the CSV files named in its first line;
tests/test_docs.py fails when a committed block differs from what this writes. A record is a run's or a
study's rows as committed (attacks.csv, study.csv, defenses.csv): a dated record is never rewritten, so its
blocks stay what they are until the code that reads them changes.

To add a table: write a function returning its Markdown in the page's module here, most often a call of
``core.records_table`` (the records, the rows or groups, each column's header and cell), add it to ``BLOCKS``
under its page and block name, put the markers on the page and run the command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import (
    audit,
    experiments,
    federations,
    labels,
    leakage,
    memory,
    performance,
    quality,
    reliability,
    results,
    verdict,
)
from .leakage import _epsilon, leakage_verdict, privacy_budget

__all__ = ["BLOCKS", "blocks", "leakage_verdict", "privacy_budget", "_epsilon"]

BLOCKS: dict[Path, dict[str, Callable[[], str]]] = {}
# each module: {page: {block: function}}
_MODULES = (
    leakage,
    federations,
    verdict,
    audit,
    results,
    experiments,
    quality,
    memory,
    reliability,
    labels,
    performance,
)
for _module in _MODULES:
    for _page, _made in _module.BLOCKS.items():
        BLOCKS.setdefault(_page, {}).update(_made)


def blocks() -> dict[Path, dict[str, str]]:
    """{page relative to the root: {block name: its text}} of every block in ``BLOCKS``."""
    return {page: {name: make() for name, make in made.items()} for page, made in BLOCKS.items()}
