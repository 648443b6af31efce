"""Launch a federation whose attacks may end only once round 2 has started
(fl_attack.attacker.runtime.workers.GATE_ENV)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from fl_attack.attacker.runtime.workers import GATE_ENV

ROOT = Path(__file__).resolve().parent.parent


def launch_gated(
    command: list[str], env: dict, run_dir: Path, gate: Path, timeout: float
) -> subprocess.CompletedProcess:
    """Run ``command`` (a launcher) with every attack waiting for the file ``gate``, created once
    ``run_dir``/events.log says round 2 has started (or after 600 s: a strategy that waited for its
    attacks never starts round 2, and the test's in-flight counts then fail)."""
    env = {**os.environ, **env, GATE_ENV: str(gate)}
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        events, give_up = run_dir / "events.log", time.monotonic() + 600
        while (
            time.monotonic() < give_up
            and p.poll() is None
            and not (events.is_file() and "round 2: training starts" in events.read_text())
        ):
            time.sleep(0.2)
        gate.touch()
        stdout, stderr = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(command, p.returncode, stdout, stderr)
