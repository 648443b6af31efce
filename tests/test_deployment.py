"""The federation on Flower's deployment engine: a real SuperLink and 2 real SuperNodes on localhost
(``python -m strategies.launch --deployment 2``, strategies/deploy.py), each SuperNode's partition
from its --node-config, the ServerApp spawned by the SuperLink, a ClientApp process per message.

One tiny run (a fixture, about 2 minutes on 2 busy cores) is checked by one test: that it completed
with both partitions, and that round 2 started while round 1's attacks still ran (they wait, through
the GATE_ENV hook, for a file the fixture creates only once round 2 has started).
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from tests.gated import launch_gated

pytestmark = pytest.mark.runtime  # a local SuperLink and SuperNodes

ROOT = Path(__file__).resolve().parent.parent
ATTACK_ITERATIONS = 5  # short: the gate (GATE_ENV), not their length, keeps round 1's attacks in flight


def _read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _processes_under(folder: Path) -> list[str]:
    """Live processes whose FLWR_HOME lies under ``folder``: what the deployment started (the
    SuperLink, the SuperNodes and their ServerApp, SuperExec and ClientApp children)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        home = next((e[len(b"FLWR_HOME=") :].decode() for e in env if e.startswith(b"FLWR_HOME=")), "")
        if home.startswith(str(folder)) and state not in ("Z", "X"):
            found.append(f"{proc.name}: {cmd}")
    return found


@pytest.fixture(scope="module")
def deployed_run(tmp_path_factory):
    """(the launcher's completed process, the run folder, the FLWR_HOME it used)."""
    tmp = tmp_path_factory.mktemp("deployment")
    results, home = tmp / "results", tmp / "flwr-home"
    run_config = (
        "num-server-rounds=2 samples-per-client=10 batch-size=5 local-epochs=1 fraction-evaluate=0.0 "
        f'server-test-samples=100 attack-clients="all" attack-rounds="1" attack-method="pisme" '
        f"attack-iterations={ATTACK_ITERATIONS} attack-nodes=2 attack-threads=1 "
        f'results-dir="{results}" run-name="deployed"'
    )
    gate = tmp / "attacks-may-end"  # the attacks wait for it (GATE_ENV): opened once round 2 has started
    env = {"FLWR_HOME": str(home), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "strategies.launch", "--deployment", "2", "--run-config", run_config]
    try:
        proc = launch_gated(command, env, results / "deployed", gate, timeout=400)
    finally:
        leftover = _processes_under(home)
    assert not leftover, "the deployment's processes outlived the launcher:\n" + "\n".join(leftover)
    return proc, results / "deployed", home


def test_the_federation_completes_on_two_supernodes_and_round_2_starts_while_round_1s_attacks_run(deployed_run):
    """One run, checked twice (one test: the run costs about 2 minutes on 2 busy cores). First, that it
    completed with both partitions. Then, that round 1's two attacks could not end before round 2 started
    (they wait for the gate the fixture opens then), so the strategy must have counted both in flight at
    round 1's end and at round 2's start: training never waited for the attacker."""
    proc, run, home = deployed_run
    log = proc.stdout[-6000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    assert "fl-attack: starting a SuperLink and 2 SuperNode(s) on localhost" in proc.stdout
    assert re.search(r"fl-attack: run \d+ finished:completed", proc.stdout), log  # flwr ls said so
    assert not any((home / "deployments").iterdir()), "a deployment that worked leaves no logs behind"
    config = json.loads((run / "config.json").read_text())
    assert config["num_nodes"] == 2
    rounds = _read_csv(run / "rounds.csv")
    assert [r["round"] for r in rounds] == ["1", "2"] and all(r["clients"] == "2" for r in rounds), rounds
    attacks = _read_csv(run / "attacks.csv")
    # Both SuperNodes trained their own partition (from --node-config) and were attacked in round 1.
    assert sorted((a["round"], a["partition_id"]) for a in attacks) == [("1", "0"), ("1", "1")], attacks
    assert len({a["node_id"] for a in attacks}) == 2 and len({a["client_id"] for a in attacks}) == 2, attacks
    assert all(a["status"] == "ok" for a in attacks), [a["error"] for a in attacks]
    assert all((run / a["image"]).is_file() for a in attacks)

    assert int(rounds[0]["attacks_in_flight"]) == 2
    events = (run / "events.log").read_text()
    in_flight = re.search(r"round 2: training starts with (\d+) attack\(s\) in flight", events)
    assert in_flight and int(in_flight.group(1)) == 2, events
    timings = json.loads((run / "summary.json").read_text())["timings"]["rounds"]
    assert timings["2"]["configured"] > timings["1"]["trained"]


def test_a_supernode_without_a_partition_id_is_told_how_to_start():
    from types import SimpleNamespace

    from clients.client_app import node_partition

    assert node_partition(SimpleNamespace(node_config={"partition-id": 3, "num-partitions": 4})) == 3
    with pytest.raises(ValueError, match=r'--node-config "partition-id=I num-partitions=N"'):
        node_partition(SimpleNamespace(node_config={}))


def test_a_superlink_that_does_not_come_up_is_reported_with_its_log(tmp_path, monkeypatch):
    """start_local raises DeploymentError with the log's end when the SuperLink exits at once."""
    from strategies.deploy import DeploymentError, start_local

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "flower-superlink"
    fake.write_text("#!/bin/sh\necho 'address already in use' >&2\nexit 3\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    with pytest.raises(DeploymentError, match=r"(?s)superlink exited with status 3.*address already in use"):
        start_local(2, env, tmp_path / "deployment", timeout=20)


@pytest.mark.runtime
def test_stop_ends_the_groups_and_the_descendants_that_left_them(tmp_path):
    """Flower's SuperLink starts its SuperExec in a new session: stop() must end it too."""
    from strategies.deploy import LocalDeployment, _stat

    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    deployment = LocalDeployment(tmp_path, "127.0.0.1:1", {})
    leader = deployment._spawn("superlink", [sys.executable, "-c", script], dict(os.environ))
    log = tmp_path / "superlink.log"
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(log.read_text().split()[0])
    assert os.getpgid(child) != os.getpgid(leader.pid)
    deployment.stop(grace=2)
    assert leader.poll() is not None
    stat = _stat(child)
    assert stat is None or stat[1] in ("Z", "X"), f"the child in its own session survived stop(): {stat}"
