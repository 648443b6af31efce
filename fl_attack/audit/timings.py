"""Where a federation's time goes: seconds measured where the work happens, and the breakdown table.

Each role measures its own work: the clients put ``train-seconds`` in their fit metrics (and the
epoch second they started, ``train-started``, in their simulation bookkeeping); the strategy times
its hooks, each round's training and federated-evaluation spans and the final wait for attacks; the
attacker times each attack (AttackOutcome.attack_seconds); the evaluator times its scoring, images and CSV
rows; the ServerApp times its own writes. The ServerApp stores the record as ``timings`` in
summary.json; the launcher adds its clock (launch, ``flwr run`` exit) and prints ``table``.

Instants are epoch seconds (``time.time()``, comparable across the processes of one machine); the
rest are durations in seconds. The server's timeline is split into spans that do not overlap and,
with "other", add up to the ``flwr run`` wall time. Client training and attacks run meanwhile on
other workers, so their busy sums are reported beside the spans, not in the sum.

Light on purpose (no torch): the launcher imports it after the run.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

# Busy-time phases. client_train and attack run on Ray workers (they overlap the server's spans);
# the others run on the server's thread, one at a time.
BUSY = ("client_train", "attack")
SERVER = ("strategy", "scoring", "images", "writing", "drain_wait")


class Timings:
    """Seconds and counts per phase, accumulated as the run goes."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, phase: str, seconds: float, count: int = 1) -> None:
        if seconds is None or not math.isfinite(seconds):
            return
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, float(seconds))
        self.counts[phase] = self.counts.get(phase, 0) + count

    @contextmanager
    def measure(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def merged(self, *others: Timings) -> Timings:
        out = Timings()
        for t in (self, *others):
            for phase, seconds in t.seconds.items():
                out.add(phase, seconds, t.counts.get(phase, 0))
        return out

    def as_dict(self) -> dict:
        return {
            "seconds": {k: round(v, 3) for k, v in sorted(self.seconds.items())},
            "counts": dict(sorted(self.counts.items())),
        }


def _span(end, start) -> float:
    return max(0.0, end - start) if end is not None and start is not None else 0.0


def breakdown(record: dict) -> list[tuple[str, float | None, str]]:
    """The table rows (label, wall seconds, note) of a summary.json ``timings`` record.

    Spans of the server's timeline, which do not overlap: start-up (launch to the first client fit),
    each round's training (first fit start to aggregation) and federated evaluation (aggregation done
    to evaluation replies), the strategy's hooks, scoring, writing, and the wait for the last attacks.
    "other" is the wall time none of them covers (Flower between rounds, Ray and Flower shutdown).
    Without the launcher's clock the wall time is the ServerApp's own.
    """
    seconds, counts = record.get("seconds", {}), record.get("counts", {})
    launcher = record.get("launcher", {})
    main_started = record.get("main_started")
    launched = launcher.get("launched", main_started)
    exited = launcher.get("flwr_exited", record.get("main_finished"))
    rounds = [record["rounds"][k] for k in sorted(record.get("rounds", {}), key=int)]
    first = rounds[0] if rounds else {}
    configured = first.get("configured", record.get("rounds_finished"))
    fit_started = first.get("fit_started") or configured
    wall = _span(exited, launched)
    startup = _span(fit_started, launched)
    training = sum(_span(r.get("trained"), r.get("fit_started") or r.get("configured")) for r in rounds)
    evaluation = sum(_span(r.get("evaluating"), r.get("aggregated")) for r in rounds)
    get = lambda phase: seconds.get(phase, 0.0)  # noqa: E731
    spans = [
        (
            "start-up: launch to the first client fit",
            startup,
            f"Flower + SuperLink {_span(main_started, launched):.1f}, ServerApp set-up "
            f"{_span(configured, main_started):.1f}, client start-up (Ray actors or ClientApp processes) "
            f"{_span(fit_started, configured):.1f}",
        ),
        (
            f"client training, wall span of {len(rounds)} round(s)",
            training,
            f"busy {get('client_train'):.1f} s summed over {counts.get('client_train', 0)} fits, in parallel",
        ),
        ("strategy: configure, aggregate, dispatch", get("strategy"), ""),
        ("federated evaluation, wall span", evaluation, ""),
        (
            "attacks: server waiting for the last ones",
            get("drain_wait"),
            f"busy {get('attack'):.1f} s summed over {counts.get('attack', 0)} attacks, overlapping training",
        ),
        ("evaluation: scoring reconstructions", get("scoring"), ""),
        ("writing results: images, csv, json", get("images") + get("writing"), ""),
    ]
    other = wall - sum(s for _, s, _ in spans)
    rows = (
        [("flwr run: launch to exit (wall)", wall, "")]
        + spans
        + [("other: Flower between rounds, shutdown", other, "")]
    )
    return rows


def table(record: dict) -> str:
    """The breakdown as printed text."""
    rows = breakdown(record)
    width = max(len(label) for label, _, _ in rows)
    lines = [
        "fl-attack: where the time went (seconds; the spans add up to the wall time, the busy sums "
        "of clients and attacks overlap them)"
    ]
    for label, value, note in rows:
        lines.append(f"  {label:<{width}}  {value:7.1f}" + (f"   {note}" if note else ""))
    return "\n".join(lines)
