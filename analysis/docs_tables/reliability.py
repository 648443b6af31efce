"""docs/reliability.md's long-study tables: the uninterrupted soak run's resident memory, folder size and
backlog by round (docs/reliability/soak/samples.csv, one row every 2 s by benchmarks/soak.py) and each
phase's wall time (soak.json)."""

from __future__ import annotations

import json
from pathlib import Path

from .core import ROOT, _head, _read, _table

PAGE = Path("docs/reliability.md")
SOAK = Path("docs/reliability/soak")
SAMPLES = SOAK / "samples.csv"
SUMMARY = SOAK / "soak.json"
PHASES = {  # soak.json's phase: the page's words
    "full": "run A, straight through",
    "until-killed": "run B, to the SIGKILL",
    "resumed": "run B, resumed (the attacks left in flight first)",
    "replay-missing": "`fl-attack replay RUN --missing` on run B",
}


def _mb(x: float) -> str:
    return f"{x:.0f} MB"


def soak_by_round() -> str:
    """Run A's first sample once a quarter of its rounds are recorded (as soak.json's full_run_by_round picks
    them), then its last sample with the attacker actor alive (the end of the drain): each process group's
    resident memory, the run folder's size, the attack rows written, and, while rounds are still recorded,
    rounds.csv's attacks in flight and lag.

    Raises ValueError when run A has no sample at one of those rounds."""
    frame = _read(SAMPLES)
    full = frame[frame["phase"] == "full"]
    last = int(full["rounds"].max())
    rows = []
    for r in sorted({1, last // 4, last // 2, 3 * last // 4, last}):
        reached = full[full["rounds"] >= r]
        if reached.empty:
            raise ValueError(f"{SAMPLES} has no sample of the full run at round {r}")
        s = reached.iloc[0]
        rows.append([str(s["rounds"]), *_sizes(s), f"{s['attacks_in_flight']:.0f}", f"{s['attack_lag_rounds']:.0f}"])
    drain = full[full["attackers_rss_mb"] > 0].iloc[-1]
    rows.append(["end of the drain", *_sizes(drain), "", ""])
    header = [
        "rounds recorded (run A)",
        "ServerApp RSS",
        "attacker",
        "clients (2 actors)",
        "rest",
        "run folder",
        f"attack rows (of {full['attack_rows'].max()})",
        "attacks in flight",
        "lag (rounds)",
    ]
    return _head(SAMPLES, page=PAGE) + "\n" + _table(header, rows)


def _sizes(s) -> list[str]:
    attacker = "not started" if s["attackers_rss_mb"] == 0 else _mb(s["attackers_rss_mb"])
    sizes = [_mb(s["serverapp_rss_mb"]), attacker, _mb(s["clients_rss_mb"]), _mb(s["other_rss_mb"])]
    return [*sizes, _mb(s["folder_mb"]), str(s["attack_rows"])]


def soak_phases() -> str:
    """Each phase of the soak: its wall seconds and exit code (-9: SIGKILLed), from soak.json."""
    summary = json.loads((ROOT / SUMMARY).read_text(encoding="utf-8"))
    rows = [
        [words, f"{summary['phases'][phase]['seconds']:.0f} s", str(summary["phases"][phase]["returncode"])]
        for phase, words in PHASES.items()
    ]
    return _head(SUMMARY, page=PAGE) + "\n" + _table(["phase", "wall", "exit code"], rows)


BLOCKS = {PAGE: {"soak-by-round": soak_by_round, "soak-phases": soak_phases}}
