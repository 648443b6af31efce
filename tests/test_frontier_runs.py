"""The frontier study on the real path (python -m analysis.defenses --grid frontier, tiny settings: 3 writers
of 8 samples, 1 round, 5 attack iterations): a study SIGKILLed after a run folder has its config.json but
before its first checkpoint completes with --resume (the killed run restarted, its record set aside), and
the grid submitted as Ray jobs to a local `ray start --head` cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from analysis.frontier import read_frontier
from tests.test_resume import _tree

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--rounds", "1", "--supernodes", "3", "--samples", "8", "--iterations", "5"]


def _study(out: Path, only: str, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "analysis.defenses", "--grid", "frontier", "--out", str(out), "--only", only]
    return [*command, *QUICK, *extra]


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home")}


def _run(command: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)


def _start(tmp_path: Path, out: Path, only: str, log: Path) -> subprocess.Popen:
    """The study on ``only`` with --resume, started in a session of its own, its output in ``log``."""
    with open(log, "w") as sink:
        return subprocess.Popen(
            _study(out, only, "--resume"),
            cwd=ROOT,
            env=_env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.mark.runtime
# Two flwr runs, 95-207 s on 2 cores: slow for the suite's 15-minute budget. CI keeps the study's resume rule
# (test_studies.py, plan_run), its launcher arguments (test_defenses.py) and flwr run (test_e2e_federation.py).
@pytest.mark.slow
def test_a_study_killed_before_its_first_checkpoint_completes_with_resume(tmp_path):
    """Before the fix the resumed study stopped at the killed folder: "run folder ... already holds a run".
    (That a finished run is kept as it is, not rerun, is test_studies.py's unit test of plan_run.)"""
    env, out = _env(tmp_path), tmp_path / "study"
    log = tmp_path / "killed.log"
    run = out / "runs" / "quantize-1"
    proc = _start(tmp_path, out, "quantize-1", log)
    try:
        while not (run / "config.json").exists():  # the event: the ServerApp has written the run's config
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.02)
    finally:
        doomed = _tree(proc.pid)  # the launcher's SuperLink and simulation run in sessions of their own
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert not (run / "checkpoint.pt").exists(), "killed too late: round 1's checkpoint was already written"
    assert not (out / "frontier.csv").exists()

    resumed = _run(_study(out, "quantize-1", "--resume"), env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "restarting quantize-1: its unfinished run cannot be resumed" in resumed.stdout
    (aside,) = (out / "runs").glob("quantize-1.set-aside-*")  # the killed record, kept aside
    assert (aside / "config.json").is_file() and not (aside / "checkpoint.pt").exists()
    assert (run / "summary.json").is_file() and (run / "checkpoint.pt").is_file()
    table = read_frontier(out / "frontier.csv")
    assert list(table["setting"]) == ["quantize-1"] and (table["rounds"] == 1).all()
    assert (table["attacks_ok"] > 0).all()
    # study.json: both calls, the killed one seen as never ended; the resumed one timed its setting
    calls = json.loads((out / "study.json").read_text())["calls"]
    assert [c["ended"] is None for c in calls] == [True, False]
    assert set(calls[-1]["settings"]) == {"quantize-1"} and calls[-1]["settings"]["quantize-1"] > 0
    assert all("--grid frontier" in c["command"] for c in calls)


@pytest.mark.runtime
@pytest.mark.slow  # a flwr run started and stopped: about a minute on 2 cores (the suite's 15-minute budget)
def test_a_sigterm_stops_the_study_and_everything_its_setting_started(tmp_path):
    """SIGTERM to the study while its first setting's federation runs (what `kill` or a job's stop sends, and
    the only stop a study started in the background by a non-interactive shell hears, since such a shell has
    it ignore SIGINT): the study exits 130 saying how to resume, starts no next setting, and leaves no process
    of its setting behind (the launcher's SuperLink and flwr run included)."""
    out, log = tmp_path / "study", tmp_path / "study.log"
    proc = _start(tmp_path, out, "quantize-1,none", log)
    run = out / "runs" / "quantize-1"
    try:
        while not (run / "config.json").exists():  # the event: the setting's ServerApp is running
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.02)
        started = _tree(proc.pid)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=600)  # a hang guard, not a bound: a study that ignored it would run on
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert "interrupted; what finished is kept: rerun with --resume" in text
    assert "running none" not in text and not (out / "runs" / "none").exists()
    # The SuperLink's own child (flwr-simulation) ends a moment after the SuperLink: wait for every process
    # the setting had started to end by itself (a guard against a leak, not a bound), then look.
    guard = time.monotonic() + 300
    while (left := [pid for pid in started if _state(pid) == "alive"]) and time.monotonic() < guard:
        time.sleep(0.2)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]


def _state(pid: int) -> str:
    """ "alive", or "gone" for an ended process (a zombie waiting for its parent included)."""
    try:
        return "gone" if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z" else "alive"
    except OSError:
        return "gone"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """`ray start --head --block --num-cpus 2` with its dashboard (the job server), in a process group of
    its own; stopped by signalling that group (never `ray stop`, which stops every Ray on the machine).
    Yields the cluster's address HOST:PORT."""
    ray_bin = Path(sys.executable).parent / "ray"
    if not ray_bin.exists():
        pytest.skip("the ray command is not installed")
    port, dashboard = _free_port(), _free_port()
    # Every port of its own: a Ray already on this machine (a study's federation) holds Ray's default agent
    # port 52365, and a head whose dashboard agent cannot bind its HTTP port takes no job (submissions hang).
    own = {
        "--dashboard-agent-listen-port": _free_port(),
        "--dashboard-agent-grpc-port": _free_port(),
        "--runtime-env-agent-port": _free_port(),
        "--metrics-export-port": _free_port(),
        "--ray-client-server-port": _free_port(),
    }
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    log = tmp_path / "ray-start.log"
    command = [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1"]
    command += ["--num-cpus=2", "--include-dashboard=true", f"--dashboard-port={dashboard}", f"--temp-dir={temp}"]
    command += ["--disable-usage-stats", *(f"{flag}={value}" for flag, value in own.items())]
    # A loaded machine starts the dashboard's modules slower than Ray's 30 s default allows.
    env = {**os.environ, "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "600"}
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while "Ray runtime started" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        import shutil

        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.runtime
@pytest.mark.slow  # a Ray cluster with its dashboard and two federations as jobs: minutes on 2 cores
def test_the_grid_runs_as_ray_jobs_on_a_cluster(ray_head, tmp_path):
    """--ray-address: each setting is a Ray job (Ray's JobSubmissionClient lists them, SUCCEEDED) running the
    launcher for its one setting with --ray-address, so its attacks ran on the cluster's node (attacks.csv
    worker_node is the cluster's, a Ray worker id per attack); frontier.csv gets both rows."""
    from ray.job_submission import JobSubmissionClient

    from tests.test_workers import _cluster_node_id

    out = tmp_path / "study"
    done = _run(_study(out, "none,quantize-1", "--ray-address", ray_head), _env(tmp_path))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    jobs = {j.metadata.get("run"): j for j in JobSubmissionClient(ray_head).list_jobs()}
    assert {name: jobs[name].status.value for name in ("none", "quantize-1")} == {
        "none": "SUCCEEDED",
        "quantize-1": "SUCCEEDED",
    }
    assert "strategies.launch" in jobs["none"].entrypoint and f"--ray-address {ray_head}" in jobs["none"].entrypoint
    node = _cluster_node_id(ray_head)
    for name in ("none", "quantize-1"):
        import csv

        with open(out / "runs" / name / "attacks.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows and {r["worker_node"] for r in rows} == {node} and all(len(r["worker_id"]) > 20 for r in rows)
    assert list(read_frontier(out / "frontier.csv")["setting"]) == ["none", "quantize-1"]
