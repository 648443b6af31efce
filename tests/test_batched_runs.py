"""attack-batch: a round's attacks run as one ``reconstruct_batch`` on a worker (``attacker.runtime.workers.Pipeline``)
give the rows the unbatched attacks give, in the federation, ``fl-attack replay`` and an experiment.

Exactness in float64: the attacks of these tests run with dtype torch.float64 (``reconstruct`` and
``reconstruct_batch`` as the workers call them, monkeypatched), so batched and unbatched differ only by
summation order (~1e-13); the images are float32 in [0,1] either way, so the image metrics (PSNR,
SSIM, ...) may differ in their last float32 digits: 1e-5 relative there, 1e-9 on Lsim.
"""

from __future__ import annotations

import csv
import math
from functools import partial

import pytest
import torch

import fl_attack.attacker.runtime.run as run_module  # where run_job calls reconstruct and reconstruct_batch
import fl_attack.attacker.runtime.workers as workers_module
from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.runtime.workers import AttackJob, InlineWorkers, Pipeline, batch_key, resolve_batch
from fl_attack.federation.update import AttackTarget, ObservedUpdate
from tests.inprocess import federate, small_update

FLOAT64 = torch.float64
# columns that say how or where an attack ran, not what it found
HOW = {"attack_seconds", "batch", "worker_node", "worker_id", "threads", "lag_rounds", "compile", "image"}


@pytest.fixture
def float64(monkeypatch):
    """The workers' attacks in float64 (the exactness checks' precision)."""
    monkeypatch.setattr(run_module, "reconstruct", partial(run_module.reconstruct, dtype=FLOAT64))
    monkeypatch.setattr(run_module, "reconstruct_batch", partial(run_module.reconstruct_batch, dtype=FLOAT64))


def _close(a: str, b: str, column: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return a == b
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    tol = 1e-9 if column.startswith("lsim") else 1e-5 * max(1.0, abs(x))
    return abs(x - y) <= tol


def assert_same_rows(batched: list[dict], alone: list[dict], key=("round", "partition_id", "method")) -> None:
    order = lambda r: tuple(r[k] for k in key)  # noqa: E731
    assert len(batched) == len(alone) > 0
    for mine, theirs in zip(sorted(batched, key=order), sorted(alone, key=order)):
        assert mine["status"] == theirs["status"] == "ok", (mine.get("error"), theirs.get("error"))
        for column in theirs:
            if column not in HOW:
                assert _close(mine[column], theirs[column], column), (column, mine[column], theirs[column])


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------ unit: the Pipeline


def _job(job_id: int, seed: int, method: str = "pisme", **changes) -> AttackJob:
    base = small_update()
    gen = torch.Generator().manual_seed(seed)
    wT = {k: v - 1e-3 * torch.randn(v.shape, generator=gen) for k, v in base.w0.items()}
    update = ObservedUpdate(base.w0, wT, base.metadata, {"round": 1})
    config = AttackConfig(iterations=3, nodes=2, trace_every=1)
    return AttackJob(job_id, update, method, config, AttackTarget(1, (seed,)), labels="recovered", **changes)


class Counting(InlineWorkers):
    def __init__(self):
        super().__init__(device="cpu")
        self.sent = []

    def submit(self, job):
        self.sent.append(job)
        super().submit(job)


def test_resolve_batch_and_bad_values():
    assert resolve_batch("auto", "cpu") == 1 and resolve_batch("auto", "cuda") == workers_module.BATCH_ON_CUDA
    assert resolve_batch(4) == 4 and resolve_batch("3") == 3
    for bad in ("0", "-2", "many", 1.5):
        with pytest.raises(ValueError, match="attack batch must be an integer >= 1 or 'auto'"):
            resolve_batch(bad)
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        Pipeline(InlineWorkers("cpu"), batch=0)


def test_memory_jobs_and_unbatchable_methods_stay_alone():
    assert batch_key(_job(0, 0)) is not None
    assert batch_key(_job(0, 0, "pisme-adaptive")) is None  # each client would choose its own m
    assert batch_key(_job(0, 0, "pisme+memory")) is None  # not a registered attack: attack_with_memory runs it
    remembering = _job(0, 0)
    remembering.memory = object()  # a "+memory" job's snapshot: its warm starts are not reconstruct_batch's
    assert batch_key(remembering) is None
    other_round = _job(1, 1)
    other_round.target = AttackTarget(2, (1,))
    assert batch_key(other_round) != batch_key(_job(2, 2))


@pytest.mark.heavy
def test_the_pipeline_batches_a_rounds_jobs_and_each_gets_its_unbatched_outcome(float64):
    jobs = [_job(i, i) for i in range(3)] + [_job(3, 0, "ig"), _job(4, 1, "ig")]
    alone_workers, batch_workers = Counting(), Counting()
    alone, batched = Pipeline(alone_workers), Pipeline(batch_workers, batch=3)
    for job in jobs:
        alone.submit(job)
        batched.submit(job)
    assert batched.in_flight == 5 and batched.rounds_in_flight() == [1] * 5  # held until the next poll
    one, many = dict((j.job_id, o) for j, o in alone.poll()), dict((j.job_id, o) for j, o in batched.poll())
    assert [len(j.batch) + 1 for j in batch_workers.sent] == [3, 2]  # pisme x3, ig x2: one job each
    assert sorted(many) == sorted(one) == list(range(5)) and batched.in_flight == 0
    for job_id, mine in many.items():
        theirs = one[job_id]
        assert mine.status == theirs.status == "ok" and mine.batch == (3 if job_id < 3 else 2) and theirs.batch == 1
        assert mine.method == theirs.method and mine.target == theirs.target
        assert abs(mine.lsim_honest - theirs.lsim_honest) < 1e-9
        assert abs(mine.lsim_calibrated - theirs.lsim_calibrated) < 1e-9
        assert torch.equal(mine.labels, theirs.labels)
        assert float((mine.images - theirs.images).abs().max()) < 1e-6


def test_a_batch_that_times_out_fails_each_of_its_jobs():
    jobs = [_job(i, i, time_limit=1e-9) for i in range(3)]
    pipeline = Pipeline(Counting(), batch=4)
    for job in jobs:
        pipeline.submit(job)
    done = pipeline.drain(60)
    assert sorted(j.job_id for j, _ in done) == [0, 1, 2]
    for job, outcome in done:
        assert outcome.job_id == job.job_id and outcome.status == "failed" and "TimeoutError" in outcome.error


# ------------------------------------------------------------------------------ the federation, replay


@pytest.mark.heavy
@pytest.mark.slow  # 32 s; CI keeps the batch's path: test_a_batch_crosses_to_a_worker_process_and_back
def test_a_batched_federation_and_its_replay_give_the_unbatched_rows(tmp_path, float64, capsys):
    from fl_attack.cli import main
    from strategies.server_app import write_run_config
    from tests.inprocess import flower_run_config

    run = dict(attack_iterations=3, attack_method="pisme,ig", attack_clients="all", attack_threads=1)
    alone_dir, batch_dir = tmp_path / "alone", tmp_path / "batched"
    partitions = (0, 1, 2)
    _, _, _, alone_jobs = federate(alone_dir, partitions, attack_batch="1", **run)
    settings, _, _, batch_jobs = federate(batch_dir, partitions, attack_batch="3", **run)
    assert len(alone_jobs) == 6 and [len(j.batch) + 1 for j in batch_jobs] == [3, 3]
    alone, batched = _rows(alone_dir / "attacks.csv"), _rows(batch_dir / "attacks.csv")
    assert {r["batch"] for r in alone} == {"1"} and {r["batch"] for r in batched} == {"3"}
    assert_same_rows(batched, alone)

    # a replay of the batched run, batched, reproduces its rows
    write_run_config(batch_dir, settings, flower_run_config(**run, attack_batch="3"), num_nodes=3)
    argv = ["replay", str(batch_dir), "--threads", "1", "--device", "cpu", "--batch", "3", "--name", "b3"]
    assert main(argv) == 0
    replayed = _rows(batch_dir / "replays" / "b3" / "attacks.csv")
    assert {r["batch"] for r in replayed} == {"3"}
    assert_same_rows(replayed, batched)


@pytest.mark.heavy
def test_an_experiment_batched_gives_the_unbatched_rows(tmp_path, float64, monkeypatch):
    from analysis.experiments import main

    sizes, batch = [], run_module.reconstruct_batch

    def counted(updates, *args, **kwargs):
        sizes.append(len(updates))
        return batch(updates, *args, **kwargs)

    monkeypatch.setattr(run_module, "reconstruct_batch", counted)

    common = ["node-sweep", "--scale", "tiny", "--device", "cpu", "--threads", "1", "--clients", "3"]
    common += ["--grid", "nodes=2", "--grid", "labels=recovered"]
    assert main([*common, "--out", str(tmp_path / "alone")]) == 0
    assert sizes == []
    assert main([*common, "--out", str(tmp_path / "batched"), "--batch", "3"]) == 0
    assert sizes == [3]  # the three clients' attacks as one reconstruct_batch
    alone, batched = _rows(tmp_path / "alone" / "node-sweep.csv"), _rows(tmp_path / "batched" / "node-sweep.csv")
    assert len(alone) == len(batched) >= 3
    for mine, theirs in zip(batched, alone):
        for column in theirs:
            if column in ("invocation", "elapsed", "attack_seconds", "seconds_per_iteration", "worker"):
                continue
            assert _close(mine[column], theirs[column], column), (column, mine[column], theirs[column])


class Echo:
    """Workers that attack nothing: each job (a batch: each of its jobs) comes back "ok" at once."""

    def __init__(self):
        self.sent, self.ready = [], []

    def submit(self, job):
        self.sent.append(job)
        members = [job, *job.batch]
        done = [workers_module.AttackOutcome(j.job_id, j.method, j.target, "ok", batch=len(members)) for j in members]
        done[0].batched = done[1:] if job.batch else None
        self.ready.append(done[0])

    def poll(self):
        out, self.ready = self.ready, []
        return out

    def drain(self, timeout):
        return self.poll()

    def shutdown(self):
        pass


def test_run_forms_whole_batches_from_interleaved_jobs_and_never_stalls():
    """A replay lists each update's methods in turn: pisme, ig, pisme, ig, ... still batch by method;
    with more keys than can form whole groups within the held bound, the held jobs go as they are."""
    jobs = [_job(i, i // 2, "pisme" if i % 2 == 0 else "ig") for i in range(12)]
    workers = Echo()
    done = list(Pipeline(workers, batch=3).run(jobs, ahead=1))
    assert sorted(j.job_id for j, _ in done) == list(range(12)) and all(o.status == "ok" for _, o in done)
    assert [(j.method, len(j.batch) + 1) for j in workers.sent] == [("pisme", 3), ("ig", 3)] * 2
    # 20 different rounds: no group is ever whole; at most HOLD_BATCHES x 1 x 2 = 16 held, then sent alone
    lonely = [_job(i, i) for i in range(20)]
    for i, job in enumerate(lonely):
        job.target = AttackTarget(i + 1, (i,))
    workers = Echo()
    done = list(Pipeline(workers, batch=2).run(lonely, ahead=1))
    assert sorted(j.job_id for j, _ in done) == list(range(20))
    assert all(not j.batch for j in workers.sent)


@pytest.mark.runtime
def test_a_batch_crosses_to_a_worker_process_and_back():
    """The batch job and its outcome (with the other jobs' outcomes in ``batched``) pickle to and from
    a spawned attack process."""
    from fl_attack.attacker.runtime.workers import ProcessWorkers

    pipeline = Pipeline(ProcessWorkers(1, threads=1, device="cpu"), batch=2)
    try:
        for job in (_job(0, 0), _job(1, 1)):
            pipeline.submit(job)
        done = pipeline.drain(300)
    finally:
        pipeline.shutdown()
    assert sorted((j.job_id, o.status, o.batch) for j, o in done) == [(0, "ok", 2), (1, "ok", 2)]
    assert all(o.job_id == j.job_id and o.batched is None for j, o in done)
