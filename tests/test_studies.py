"""Unit tests of analysis.studies.plan_run, what a study does with a run folder it finds (no federation
runs here; tests/test_frontier_runs.py kills and resumes a real one), and a real SIGTERM to a study's
command (analysis.studies.command_line)."""

from __future__ import annotations

import json

from analysis.studies import plan_run

CONFIG = {"num-server-rounds": 1, "samples-per-client": 8}


def test_a_finished_run_is_kept_as_it_is(tmp_path):
    folder = tmp_path / "runs" / "none"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run_config": CONFIG}))
    (folder / "summary.json").write_text('{"rounds": 1}')
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    said = []
    assert plan_run(folder, CONFIG, 3, log=said.append) is None  # nothing to launch
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before and said == []
    assert [p.name for p in folder.parent.iterdir()] == ["none"]  # nothing set aside


def test_a_run_killed_before_its_first_checkpoint_is_set_aside_and_restarted(tmp_path):
    folder = tmp_path / "runs" / "quantize-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run_config": CONFIG}))
    said = []
    values = plan_run(folder, CONFIG, 3, log=said.append)
    assert values == {**CONFIG, "results-dir": str(folder.parent), "run-name": "quantize-1"}  # no "resume"
    (aside,) = folder.parent.glob("quantize-1.set-aside-*")
    assert (aside / "config.json").is_file() and not folder.exists()
    assert len(said) == 1 and said[0].startswith("restarting quantize-1: its unfinished run cannot be resumed")


def test_an_empty_folder_starts_a_run_and_without_reuse_nothing_is_checked(tmp_path):
    folder = tmp_path / "runs" / "topk-0.01"
    values = {**CONFIG, "results-dir": str(folder.parent), "run-name": "topk-0.01"}
    assert plan_run(folder, CONFIG, 3) == values
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    assert plan_run(folder, CONFIG, 3, reuse=False) == values  # the launcher refuses a folder holding a run


# A study's command in a child process: its main waits in a `finally` that a SIGTERM must still reach.
STOPPABLE = """
import sys, time
from analysis.studies import command_line

def main():
    try:
        print("ready", flush=True)
        time.sleep(600)
        return 0
    finally:
        print("cleaned up", flush=True)

command_line(main, "a study", "rerun the same command")
"""


def test_a_sigterm_unwinds_a_study_through_its_finally_blocks_and_exits_130(tmp_path):
    """The leakage study and the frontier both run under analysis.studies.command_line: a SIGTERM (a real one,
    to a real process) runs the finally blocks that stop a setting's launcher, then exits 130 saying how to
    go on. Without it Python dies at once on SIGTERM and the launcher's SuperLink is left running."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", STOPPABLE], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"  # the event: main is in its try block
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)  # a hang guard, not a bound
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert out.strip() == "cleaned up"
    assert "a study: interrupted; what finished is kept: rerun the same command" in err
