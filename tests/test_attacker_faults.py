"""The attacker survives its actors dying: Ray restarts them, the dispatcher resubmits the job once,
and a job that kills its actor twice is recorded as failed with the cause (fl_attack/attacker/runtime/workers.py).

One real Ray runtime (2 CPUs, num_cpus=0 actors as inside Flower); the actor kills itself with
os._exit inside a job, or the test SIGKILLs its process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from fl_attack import AttackConfig
from fl_attack.attacker.runtime.workers import AttackJob, AttackWorker, RayWorkers
from fl_attack.federation.update import AttackTarget
from tests.inprocess import small_update

# Generous: a job here is one attack iteration, but its actor may first start a Python process that
# imports torch (seconds here, far more on a loaded machine).
FINISH_TIMEOUT = 300


def _job(job_id: int) -> AttackJob:
    return AttackJob(job_id, small_update(), "sme", AttackConfig(iterations=1, trace_every=1), AttackTarget(1, (0,)))


@pytest.fixture(scope="module")
def ray_runtime():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.runtime
def test_jobs_go_to_the_actor_with_the_fewest_pending_jobs(ray_runtime, tmp_path):
    """Real actors whose jobs wait for a go-file: pending jobs are an actor's load, and a finished
    job takes its load off (the next job goes to the actor it freed). Where each ran: its worker id."""
    plan = str(tmp_path)

    class GatedActor(AttackWorker):  # defined here so that Ray pickles it by value
        def run(self, job):
            while not os.path.exists(os.path.join(plan, f"go-{job.job_id}")):
                time.sleep(0.05)
            return super().run(job)

    def finish(dispatcher, job_id, timeout=FINISH_TIMEOUT):
        (tmp_path / f"go-{job_id}").touch()
        deadline = time.monotonic() + timeout
        while True:  # wait for the event (with a deadline: a lost job fails the test, never hangs it)
            done = dispatcher.poll()
            if done:
                return done
            assert time.monotonic() < deadline, f"job {job_id} did not finish within {timeout} s of its go-file"
            time.sleep(0.1)

    dispatcher = RayWorkers(num_actors=2, threads=1, device="cpu", actor_cls=GatedActor)
    try:
        # loads 0,0 -> actor 0; 1,0 -> actor 1; 1,1 -> the lowest index, actor 0; 2,1 -> actor 1
        for job_id in (1, 2, 3, 4):
            dispatcher.submit(_job(job_id))
        outcomes = {}
        for job_id in (2, 4):  # actor 1's jobs finish: its load drops to 0, actor 0's stays 2
            outcomes.update({o.job_id: o for o in finish(dispatcher, job_id)})
        assert sorted(outcomes) == [2, 4] and dispatcher.in_flight == 2
        dispatcher.submit(_job(5))  # goes to actor 1 (were finished jobs still counted: a tie, actor 0)
        for job_id in (1, 3, 5):
            outcomes.update({o.job_id: o for o in finish(dispatcher, job_id)})
    finally:
        dispatcher.shutdown()
    assert all(o.status == "ok" for o in outcomes.values())
    where = {job_id: o.worker_id for job_id, o in outcomes.items()}
    assert where[1] == where[3] != where[2] == where[4] == where[5], where


@pytest.mark.runtime
def test_a_dead_actor_is_restarted_and_its_job_resubmitted_once(ray_runtime, tmp_path):
    plan = str(tmp_path)

    class CrashingActor(AttackWorker):  # defined here so that Ray pickles it by value
        """Job j dies (os._exit) as many times as the file crash-j says; hang-j: sleeps the first time."""

        def run(self, job):
            crash = os.path.join(plan, f"crash-{job.job_id}")
            if os.path.exists(crash):
                left = int(open(crash).read())
                if left > 0:
                    open(crash, "w").write(str(left - 1))
                    os._exit(1)
            hang = os.path.join(plan, f"hang-{job.job_id}")
            if os.path.exists(hang) and not os.path.exists(hang + ".started"):
                with open(hang + ".pid", "w") as f:  # the process to kill: whichever actor took the job
                    f.write(str(os.getpid()))
                os.replace(hang + ".pid", hang + ".started")
                time.sleep(1800)  # longer than any guard below: only the test's SIGKILL ends it
            return super().run(job)

    (tmp_path / "crash-1").write_text("1")  # dies once, then completes
    (tmp_path / "crash-2").write_text("2")  # dies on its first try and on its resubmission
    (tmp_path / "hang-3").write_text("")  # hangs until the test kills its actor's process
    dispatcher = RayWorkers(num_actors=2, threads=1, device="cpu", actor_cls=CrashingActor)
    try:
        start, outcomes = time.perf_counter(), []
        for job_id in (1, 2, 3, 4):
            dispatcher.submit(_job(job_id))
        assert dispatcher._load == [2, 2]  # least loaded: 1 and 3 on actor 0, 2 and 4 on actor 1
        while not (tmp_path / "hang-3.started").exists():  # job 3 runs once job 1 has died
            assert time.perf_counter() - start < 900, "job 3 never started"  # a hang guard, not a speed bound
            outcomes += dispatcher.poll()
            time.sleep(0.2)
        # Job 3 was queued behind job 1, so it was resubmitted when job 1 killed actor 0 and may run
        # on either actor: SIGKILL the process that runs it (as the OOM killer would); Ray restarts it.
        os.kill(int((tmp_path / "hang-3.started").read_text()), signal.SIGKILL)
        # Generous: each restart starts a Python process that imports torch (~5 s here, far more on a
        # loaded machine); the test takes ~25 s on an idle 2-core machine.
        outcomes += dispatcher.drain(timeout=900)
    finally:
        dispatcher.shutdown()
    by_id = {o.job_id: o for o in outcomes}
    assert sorted(by_id) == [1, 2, 3, 4] and len(outcomes) == 4
    for job_id in (1, 3, 4):
        assert by_id[job_id].status == "ok", by_id[job_id].error
        assert by_id[job_id].images.shape == (2, 1, 28, 28)
    assert by_id[2].status == "failed"
    assert by_id[2].error.startswith("ActorDiedError: the attacker actor died under this job 2 times; last cause: ")
    assert (tmp_path / "crash-1").read_text() == "0" and (tmp_path / "crash-2").read_text() == "0"


@pytest.mark.runtime
def test_an_actor_past_its_restarts_is_replaced_and_the_job_completes(ray_runtime, tmp_path, caplog):
    plan = str(tmp_path)

    class DiesOnce(AttackWorker):  # defined here so that Ray pickles it by value
        def run(self, job):
            marker = os.path.join(plan, "died")
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)
            return super().run(job)

    dispatcher = RayWorkers(num_actors=1, threads=1, device="cpu", max_restarts=0, actor_cls=DiesOnce)
    try:
        dispatcher.submit(_job(7))
        outcomes = dispatcher.drain(timeout=900)
    finally:
        dispatcher.shutdown()
    assert [(o.job_id, o.status) for o in outcomes] == [(7, "ok")], outcomes[0].error
    assert "attacker actor 0 is gone (ActorDiedError" in caplog.text and "starting a new one" in caplog.text
