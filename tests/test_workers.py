"""Attack workers (fl_attack.attacker.runtime.workers): local processes, this process, and a real Ray cluster started
with ``ray start --head``. Faults are injected on the real path: a worker process is SIGKILLed
while it runs a job (as the OOM killer would)."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from fl_attack import AttackConfig
from fl_attack.attacker.runtime.workers import (
    GATE_ENV,
    AttackJob,
    InlineWorkers,
    ProcessWorkers,
    RayWorkers,
    make_workers,
    run_job,
)
from fl_attack.federation.update import AttackTarget
from tests.inprocess import small_update

REPO = Path(__file__).resolve().parents[1]


def _job(job_id: int, iterations: int = 3, seed: int = 0) -> AttackJob:
    config = AttackConfig(iterations=iterations, trace_every=iterations, seed=seed)
    return AttackJob(job_id, small_update(), "sme", config, AttackTarget(1, (job_id,)))


def _wait_until(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_inline_workers_run_at_submit_in_this_process():
    workers = InlineWorkers(device="cpu", threads=1)
    workers.submit(_job(1))
    assert workers.in_flight == 0
    (outcome,) = workers.poll()
    assert outcome.status == "ok" and outcome.images.shape == (2, 1, 28, 28)
    assert outcome.worker_id == f"pid{os.getpid()}" and outcome.worker_node
    assert workers.poll() == []


@pytest.mark.runtime
def test_process_workers_do_not_block_and_equal_this_process():
    """Two spawned processes: submit hands the job over and returns (all 3 in flight, none run
    here), each job runs in another process, and the results equal the same job run here (same seed,
    one torch thread)."""
    workers = ProcessWorkers(2, threads=1, device="cpu")
    try:
        for job_id in (1, 2, 3):
            workers.submit(_job(job_id, iterations=5, seed=job_id))
        assert workers.in_flight == 3  # in flight until collected, however fast the jobs are
        outcomes = workers.drain(timeout=240)
    finally:
        workers.shutdown()
    assert sorted(o.job_id for o in outcomes) == [1, 2, 3] and all(o.status == "ok" for o in outcomes)
    pids = {o.worker_id for o in outcomes}
    assert f"pid{os.getpid()}" not in pids and 1 <= len(pids) <= 2
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = {j: run_job(_job(j, iterations=5, seed=j), "cpu") for j in (1, 2, 3)}
    finally:
        torch.set_num_threads(before)
    for o in outcomes:
        torch.testing.assert_close(o.images, here[o.job_id].images, rtol=0, atol=0)
        assert o.lsim_honest == here[o.job_id].lsim_honest


def _kill_a_waiting_worker(workers: ProcessWorkers, gate: Path) -> int:
    """SIGKILL the pool's process once its job waits at the gate (``gated``, below: the job said so
    with "<gate>.waiting-<pid>", and cannot end before the test creates the gate)."""
    _wait_until(lambda: workers.pids and Path(f"{gate}.waiting-{workers.pids[0]}").exists())
    pid = workers.pids[0]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.fixture
def gated(tmp_path, monkeypatch):
    """Every attack waits for a file (GATE_ENV, inherited by the spawned workers) until the test
    creates it: a worker killed before then is provably killed under its job, however fast it is."""
    gate = tmp_path / "attacks-may-end"
    monkeypatch.setenv(GATE_ENV, str(gate))
    return gate


@pytest.mark.runtime
def test_a_killed_process_is_replaced_and_its_job_resubmitted_once(gated):
    workers = ProcessWorkers(1, threads=1, device="cpu")
    try:
        workers.submit(_job(7))
        killed = _kill_a_waiting_worker(workers, gated)
        gated.touch()  # only now may the job end: in the replacement process
        outcomes = workers.drain(timeout=240)
    finally:
        workers.shutdown()
    assert [(o.job_id, o.status) for o in outcomes] == [(7, "ok")], outcomes[0].error
    assert outcomes[0].worker_id != f"pid{killed}" and workers.restarts == 1


@pytest.mark.runtime
def test_a_job_whose_process_dies_twice_is_recorded_as_failed(gated):
    workers = ProcessWorkers(1, threads=1, device="cpu")
    try:
        workers.submit(_job(8))
        first = _kill_a_waiting_worker(workers, gated)
        _wait_until(lambda: not workers.poll() and workers.restarts == 1 and workers.pids and workers.pids[0] != first)
        _kill_a_waiting_worker(workers, gated)
        gated.touch()  # too late: the job has died with its process twice
        outcomes = workers.drain(timeout=60)
    finally:
        workers.shutdown()
    assert [(o.job_id, o.status) for o in outcomes] == [(8, "failed")]
    assert outcomes[0].error.startswith("BrokenProcessPool: the attack process died under this job 2 times")


@pytest.mark.runtime
def test_make_workers_chooses_and_checks():
    assert isinstance(make_workers(0, device="cpu"), InlineWorkers)
    assert isinstance(make_workers(2, device="cpu"), ProcessWorkers)
    ray_workers = make_workers(0, address="127.0.0.1:1", threads=2)
    assert isinstance(ray_workers, RayWorkers) and ray_workers.num_actors == 1 and ray_workers.num_cpus == 2
    for kwargs, message in (
        (dict(num_workers=-1), "number of workers must be >= 0"),
        (dict(num_workers=1, threads=0), "threads per worker must be >= 1"),
        (dict(num_workers=1, num_gpus=-0.5), "num_gpus must be >= 0"),
    ):
        with pytest.raises(ValueError, match=message):
            make_workers(**kwargs)


# ------------------------------------------------------------------------- a real Ray cluster


@pytest.fixture
def ray_cluster(tmp_path):
    """A local Ray cluster started with ``ray start --head --block``; stopped (its process group
    killed) at the end. Yields (address, node id)."""
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray_bin is None:
        pytest.skip("the ray command is not installed")
    port = _free_port()
    log = tmp_path / "ray-start.log"
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    command = [ray_bin, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1"]
    command += ["--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        _wait_until(lambda: "Ray runtime started" in log.read_text() or proc.poll() is not None, timeout=180)
        assert proc.poll() is None, log.read_text()[-2000:]
        yield address, _cluster_node_id(address)
    finally:
        _stop_group(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (``ray start --block`` stops its cluster), SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_node_id(address: str) -> str:
    """The cluster's (only) node id, asked from a separate driver process."""
    code = "import ray; ray.init(address=%r, log_to_driver=False); print([n['NodeID'] for n in ray.nodes()][0])"
    out = subprocess.run([sys.executable, "-c", code % address], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.runtime
def test_ray_workers_join_a_cluster_by_address_and_run_there(ray_cluster):
    address, node = ray_cluster
    workers = make_workers(2, address=address, threads=1, device="cpu")
    try:
        for job_id in (1, 2):
            workers.submit(_job(job_id))
        outcomes = workers.drain(timeout=240)
    finally:
        workers.shutdown()
    import ray

    assert not ray.is_initialized()  # it left the cluster it joined
    assert sorted((o.job_id, o.status) for o in outcomes) == [(1, "ok"), (2, "ok")]
    assert {o.worker_node for o in outcomes} == {node}
    assert all(o.worker_id and o.worker_id != f"pid{os.getpid()}" for o in outcomes)


@pytest.mark.runtime
@pytest.mark.slow  # a real flwr run on the cluster, about 60 s (docs/reliability.md, "Slow tests")
def test_a_federation_attached_to_a_ray_cluster_attacks_in_its_workers(ray_cluster, tmp_path):
    """The launcher's --ray-address: Flower's simulation joins the cluster, and the attacker actors
    run in its workers (attacks.csv names the cluster's node and the actors' worker ids). With
    attack-actors=2, the round's two attacks go to the two actors (least loaded), one each."""
    address, node = ray_cluster
    results = tmp_path / "results"
    run_config = (
        "num-server-rounds=1 samples-per-client=6 batch-size=3 local-epochs=1 attack-iterations=5 "
        f'attack-clients="all" attack-method="sme" server-test-samples=0 results-dir="{results}" run-name="ray" '
        "attack-actors=2"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "strategies.launch", "--ray-address", address, "--run-config", run_config]
        + ["--federation-config", "num-supernodes=2 client-resources-num-cpus=1"],
        cwd=REPO,
        env={**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(results / "ray" / "attacks.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows), rows
    assert {r["worker_node"] for r in rows} == {node}
    assert all(len(r["worker_id"]) > 20 for r in rows)  # Ray worker ids, not pid<N>
    assert len({r["worker_id"] for r in rows}) == 2  # one attack on each actor
    # fl-attack replay --ray-address: the recorded updates attacked again on the same cluster.
    from fl_attack.cli import main as cli

    argv = ["replay", str(results / "ray"), "--methods", "sme", "--workers", "1", "--ray-address", address]
    assert cli([*argv, "--threads", "1", "--name", "on-ray"]) == 0
    with open(results / "ray" / "replays" / "on-ray" / "attacks.csv") as f:
        replayed = list(csv.DictReader(f))
    assert len(replayed) == 2 and all(r["status"] == "ok" for r in replayed), replayed
    assert {r["worker_node"] for r in replayed} == {node} and all(len(r["worker_id"]) > 20 for r in replayed)
