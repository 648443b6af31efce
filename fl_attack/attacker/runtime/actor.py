"""Attack workers on Ray: the actor body (``AttackWorker``) and its pool (``RayWorkers``), with the same
interface as the local pools (fl_attack.attacker.runtime.pool). Most of ``RayWorkers`` is what happens when
an actor dies under a job: which job was running, resubmitted ``RESUBMITS`` time(s), then failed
with the cause.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch

from fl_attack.attacker.runtime.outcome import RESUBMITS, AttackJob, AttackOutcome, _died, _first_line
from fl_attack.attacker.runtime.run import run_job, where_am_i

log = logging.getLogger(__name__)

MAX_RESTARTS = 2  # Ray restarts a dead attacker actor this many times, then it is replaced


class AttackWorker:
    """Ray actor body: holds a torch thread count and a device, runs jobs one at a time.

    A job may carry its own thread count (more cores once the clients are idle); the actor sets it
    before the job runs.
    """

    def __init__(self, threads: int, device: str = "auto", marker: str | None = None):
        torch.set_num_threads(max(1, int(threads)))
        self.device = device
        self.marker = marker  # a file naming the job this actor runs (RayWorkers reads it when it dies)

    def execute(self, job: AttackJob) -> AttackOutcome:
        """What RayWorkers calls: notes "PID JOB" in the marker file as the job starts, then ``run``
        (which tests override)."""
        if self.marker:
            with open(self.marker, "a") as f:
                f.write(f"{os.getpid()} {job.job_id}\n")
        return self.run(job)

    def run(self, job: AttackJob) -> AttackOutcome:
        if job.threads:
            torch.set_num_threads(max(1, int(job.threads)))
        return run_job(job, self.device)

    def info(self) -> dict:
        node, worker = where_am_i()
        return {"threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(), "node": node, "worker": worker}


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _check_listening(address: str, timeout: float = 5.0) -> None:
    """ConnectionError within ``timeout`` seconds when nothing listens at a "host:port" or
    "ray://host:port" address (ray.init would wait minutes on a dead one); "auto" is Ray's to find."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address} ({exc.strerror or exc})") from None


class RayWorkers:
    """``num_actors`` Ray actors, started lazily at the first submit.

    Runtime: the one this process has (``ray.is_initialized()``, e.g. Flower's simulation; never
    initialised here then: Flower owns it), else the cluster at ``address`` ("auto", "host:port" or
    "ray://host:port"), which this process joins and leaves at ``shutdown``. Without either,
    submit raises RuntimeError.

    Each actor asks ``num_cpus`` (0 inside Flower's simulation, whose client pool holds every CPU;
    Ray then sets OMP_NUM_THREADS=1, so the actor sets its torch threads itself) and ``num_gpus``
    (a fraction of a GPU), with Ray's ``max_restarts``. A job goes to the live actor with the fewest
    pending jobs (ties: the lowest index).

    Actor death (OOM kill, segfault, ``ray.kill``): the job's ref raises RayActorError
    (ActorUnavailableError while Ray restarts the actor, ActorDiedError once it is gone for good).
    The actor then takes no new job until a probe (``info`` with Ray task retries) answers; an
    actor past its restarts is replaced by a fresh one. The job is resubmitted ``RESUBMITS`` time(s)
    to the least-loaded live actor; when its actor dies again, it is recorded as status "failed"
    with the cause. Jobs queued behind the dying job on the same actor fail with it; they are
    resubmitted without counting (an actor runs its jobs in order: only the oldest was running).
    """

    def __init__(
        self,
        num_actors: int = 1,
        num_gpus: float = 0.0,
        threads: int = 1,
        device: str = "auto",
        address: str | None = None,
        num_cpus: float = 0,
        max_restarts: int = MAX_RESTARTS,
        actor_cls: type = AttackWorker,
    ):
        self.num_actors, self.num_gpus, self.threads, self.device = num_actors, num_gpus, threads, device
        self.address, self.num_cpus = address or None, num_cpus
        self.max_restarts, self.actor_cls = max_restarts, actor_cls
        self._joined = False  # this object called ray.init (and calls ray.shutdown)
        self._actors: list = []
        self._load: list[int] = []  # pending jobs per actor
        # ray ObjectRef -> (AttackJob, actor index, deaths so far, sequence number, the actor's life)
        self._pending: dict = {}
        self._seq = 0
        self._lives: list[int] = []  # per actor: how many of its deaths were handled (its current life)
        self._charged: set = set()  # refs that were running when their actor died and have not settled
        self._markers: str | None = None  # folder of the files where each actor notes the jobs it starts
        self._counted: set = set()  # (pid, job id): deaths already counted from the marker files
        self._probes: dict = {}  # probe ObjectRef -> index of an actor that died and takes no jobs yet
        self._waiting: list = []  # (AttackJob, deaths so far): jobs waiting for a live actor
        self._ready: list[AttackOutcome] = []

    def _ray(self):
        import ray

        if not ray.is_initialized():
            if not self.address:
                raise RuntimeError("Ray is not initialised and no Ray cluster address was given")
            _check_listening(self.address)
            if self.address.startswith("ray://"):  # Ray's client notes on stderr which options it passes on
                logging.getLogger("ray.client_builder").setLevel(logging.WARNING)
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            self._joined = True
            log.info("joined the Ray cluster at %s: %s", self.address, ray.cluster_resources())
        if not self._actors:
            for i in range(self.num_actors):
                self._actors.append(self._new_actor(ray, i))
                self._load.append(0)
                self._lives.append(0)
            log.info(
                "started %d attacker actor(s): num_cpus=%s, num_gpus=%s, torch threads=%d, max_restarts=%d",
                self.num_actors,
                self.num_cpus,
                self.num_gpus,
                self.threads,
                self.max_restarts,
            )
        return ray

    def _new_actor(self, ray, i: int):
        """Actor ``i``. On this machine's runtime it names the job it starts in a file of
        ``_markers`` (read when it dies); joined to a cluster by address, it may run elsewhere."""
        if self._markers is None and not self.address:
            self._markers = tempfile.mkdtemp(prefix="fl-attack-actors-")
        marker = os.path.join(self._markers, f"actor-{i}") if self._markers else None
        return (
            ray.remote(self.actor_cls)
            .options(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_restarts=self.max_restarts)
            .remote(self.threads, self.device, marker)
        )

    def _died_running(self, i: int) -> dict | None:
        """{job id: pid} of the jobs that were running in a process of actor ``i`` that is gone, not
        counted yet: each process's last "PID JOB" line of the marker file. None without markers
        (then the running job is inferred)."""
        if not self._markers:
            return None
        try:
            lines = Path(self._markers, f"actor-{i}").read_text().split()
        except OSError:
            return {}
        last = dict(zip(map(int, lines[0::2]), map(int, lines[1::2]), strict=False))  # pid -> its last job
        return {job: pid for pid, job in last.items() if (pid, job) not in self._counted and not _alive(pid)}

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._waiting)

    def start(self) -> None:
        """Join the runtime and start the actors now rather than at the first submit, so that a
        cluster that cannot be joined is known before any work; raises what ``ray.init`` raises."""
        self._ray()

    def submit(self, job: AttackJob) -> None:
        self._ray()
        self._assign(job, 0)

    def _assign(self, job: AttackJob, deaths: int) -> None:
        """Give ``job`` to the live actor with the fewest pending jobs, or queue it while none is live."""
        down = set(self._probes.values())
        live = [i for i in range(len(self._actors)) if i not in down]
        if not live:
            self._waiting.append((job, deaths))
            return
        i = min(live, key=lambda a: (self._load[a], a))
        self._load[i] += 1
        self._seq += 1
        self._pending[self._actors[i].execute.remote(job)] = (job, i, deaths, self._seq, self._lives[i])

    def _actor_died(self, ray, i: int) -> list[AttackOutcome]:
        """Actor ``i`` died: settle every job its life that died held and take it out of the
        assignment until a probe says it is back (Ray retries the probe while the actor restarts;
        ActorDiedError once it is past its restarts).

        The job that was running counts the death; the others are resubmitted without counting.
        Which one ran: on this machine's runtime, the last job each actor process noted in its
        marker file before it died (Ray fails every job of a dead actor alike, and jobs sent to it
        before the death was seen may already run in its restarted process); joined to a cluster,
        the oldest that did not finish, as an actor runs its jobs in submission order. A job whose
        failure has not arrived within the wait stays pending; its death counts when its failure
        arrives (``_settle_late``) if it was the one running. Returns the outcomes settled here
        (finished jobs, and jobs past ``RESUBMITS``).
        """
        from ray.exceptions import RayActorError

        life = self._lives[i]
        self._lives[i] += 1  # later failures of this life's jobs are late news, not a new death
        refs = sorted(
            (r for r, entry in self._pending.items() if entry[1] == i and entry[4] == life),
            key=lambda r: self._pending[r][3],
        )
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=2.0)  # a dead actor's jobs fail together
        ready = set(ready)
        died = self._died_running(i)  # the actor said which jobs its gone processes ran; else infer it
        out, again, running = [], [], died is not None
        for ref in refs:
            if ref not in ready:
                if not running:  # the oldest unfinished: the one that was running
                    running = True
                    self._charged.add(ref)
                continue
            job, _, deaths, *_ = self._pending.pop(ref)
            self._load[i] -= 1
            try:
                out.append(ray.get(ref))  # it finished before the death
                continue
            except Exception as exc:
                cause = _first_line(exc)
                if not isinstance(exc, RayActorError):
                    out.append(AttackOutcome.failed(job, cause))
                    continue
            if died is not None and job.job_id in died:
                self._counted.add((died.pop(job.job_id), job.job_id))
                deaths += 1
            elif not running:
                running, deaths = True, deaths + 1
            self._resubmit_or_fail(job, deaths, cause, i, out, again)
        if i not in self._probes.values():
            self._probes[self._actors[i].info.options(max_task_retries=-1).remote()] = i
        for job, deaths in again:
            self._assign(job, deaths)
        return out

    def _settle_late(self, ray, ref, exc: Exception) -> list[AttackOutcome]:
        """The failure of a job of an actor's earlier life, arriving after that death was handled:
        its death counts if it was the job running then; it is resubmitted or failed."""
        job, i, deaths, *_ = self._pending.pop(ref)
        self._load[i] -= 1
        died = self._died_running(i)
        if died is not None:
            if job.job_id in died:
                self._counted.add((died[job.job_id], job.job_id))
                deaths += 1
        elif ref in self._charged:
            self._charged.discard(ref)
            deaths += 1
        out, again = [], []
        self._resubmit_or_fail(job, deaths, _first_line(exc), i, out, again)
        for job, deaths in again:
            self._assign(job, deaths)
        return out

    def _resubmit_or_fail(self, job, deaths: int, cause: str, i: int, out: list, again: list) -> None:
        if deaths > RESUBMITS:
            out.append(_died(job, deaths, cause, "ActorDiedError", "attacker actor"))
            return
        log.warning(
            "attacker actor %d died under attack %s on %s (job %s, %d death(s) counted: %s); resubmitting it",
            i,
            job.method,
            job.target.describe(),
            job.job_id,
            deaths,
            cause,
        )
        again.append((job, deaths))

    def _probe_answered(self, ray, ref) -> None:
        i = self._probes.pop(ref)
        try:
            ray.get(ref)
            log.warning("attacker actor %d restarted", i)
        except Exception as exc:  # past its restarts: a fresh actor takes its place
            log.warning("attacker actor %d is gone (%s); starting a new one", i, _first_line(exc))
            ray.kill(self._actors[i], no_restart=True)
            self._actors[i] = self._new_actor(ray, i)
        waiting, self._waiting = self._waiting, []
        for job, tries in waiting:
            self._assign(job, tries)

    def poll(self) -> list[AttackOutcome]:
        """The outcomes finished so far (does not wait)."""
        return self._collect(timeout=0)

    def drain(self, timeout: float) -> list[AttackOutcome]:
        """Wait up to ``timeout`` seconds for every job; the ones still running or still waiting for a
        live actor are recorded as failed."""
        outcomes = self._collect(timeout=timeout)
        if self._pending or self._waiting:
            import ray

            for ref, (job, *_) in list(self._pending.items()):
                ray.cancel(ref)
                outcomes.append(
                    AttackOutcome.failed(job, f"TimeoutError: still running after the {timeout:.0f} s drain")
                )
            for job, _ in self._waiting:
                outcomes.append(
                    AttackOutcome.failed(
                        job, f"TimeoutError: no live attacker actor within the {timeout:.0f} s drain (its actor died)"
                    )
                )
            self._pending.clear()
            self._waiting.clear()
            self._charged.clear()
            self._load = [0] * len(self._actors)
        return outcomes

    def _collect(self, timeout: float) -> list[AttackOutcome]:
        out, self._ready = self._ready, []
        if not (self._pending or self._probes):
            return out
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + timeout
        while self._pending or (self._waiting and self._probes):
            left = max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(self._pending) + list(self._probes), num_returns=1, timeout=left)
            if not done:
                break
            for ref in done:
                if ref in self._probes:
                    self._probe_answered(ray, ref)
                    continue
                job, i, *_, life = self._pending[ref]
                try:
                    outcome = ray.get(ref)
                except RayActorError as exc:  # the actor died under the job (OOM kill, crash, ray.kill)
                    if life < self._lives[i]:  # a death already handled
                        out.extend(self._settle_late(ray, ref, exc))
                    else:
                        out.extend(self._actor_died(ray, i))
                    continue
                except Exception as exc:
                    outcome = AttackOutcome.failed(job, _first_line(exc))
                del self._pending[ref]
                self._charged.discard(ref)
                self._load[i] -= 1
                out.append(outcome)
        return out

    def shutdown(self) -> None:
        if self._actors:
            import ray

            for actor in self._actors:
                ray.kill(actor)
            self._actors.clear()
            self._load.clear()
            self._lives.clear()
            self._probes.clear()
        if self._markers:
            shutil.rmtree(self._markers, ignore_errors=True)
            self._markers = None
        if self._joined:
            import ray

            ray.shutdown()
            self._joined = False
