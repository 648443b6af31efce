"""docs/audit-your-app.md's worked example: its verdict lines, as the record's events.log holds them."""

from __future__ import annotations

from pathlib import Path

from .core import ROOT, _head

PAGE = Path("docs/audit-your-app.md")
EXAMPLE = Path("docs/audit-example/quickstart-fedavg")
DONE = " attack done: "  # an events.log line: TIMESTAMP attack done: round R partition P METHOD: the verdict


def example_verdicts() -> str:
    """Each attack's verdict line of the worked example's events.log, without its timestamp.

    Raises ValueError when the log holds none."""
    log = EXAMPLE / "events.log"
    lines = [line.split(DONE, 1)[1] for line in (ROOT / log).read_text(encoding="utf-8").splitlines() if DONE in line]
    if not lines:
        raise ValueError(f"{log} holds no line with {DONE.strip()!r}")
    return _head(log, page=PAGE) + "\n```\n" + "\n".join(lines) + "\n```"


BLOCKS = {PAGE: {"audit-example-verdicts": example_verdicts}}
