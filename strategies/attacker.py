"""The attacker: fl_attack reconstructions run on Ray actors, off the training path.

Facts this relies on (measured on Flower 1.42 with Ray 2.55): Flower's simulation process is the Ray driver and
its client pool holds every CPU, so an attacker asking num_cpus >= 1 would never start. The actors
therefore ask num_cpus=0 (plus a fraction of a GPU when one is configured) and set their torch
thread count explicitly. Ray is never initialised here; without Ray (unit tests, plain Python)
the same work runs in-process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from fl_attack import AttackConfig, ObservedUpdate, reconstruct
from fl_attack.evaluation import nodes_per_iteration
from fl_attack.update import AttackTarget

log = logging.getLogger(__name__)


@dataclass
class AttackJob:
    """One attack to run: the observed update, the method and its settings (no private data)."""

    job_id: int
    update: ObservedUpdate
    method: str
    config: AttackConfig
    target: AttackTarget  # whose update (public identifiers)
    labels: object = "recovered"  # "recovered", or an oracle label tensor the evaluator gave
    time_limit: float | None = None
    threads: int | None = None  # torch threads on the actor for this job (None = the actor's own)
    model: str = ""  # the victims' architecture as a spec (fl_attack.models.resolve_model), rebuilt on the actor


@dataclass
class AttackOutcome:
    """What came back: a reconstruction, or status "failed" with the error text."""

    job_id: int
    method: str
    target: AttackTarget
    status: str
    error: str = ""
    images: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    label_source: str = ""
    lsim_honest: float = float("nan")
    lsim_calibrated: float = float("nan")
    seconds: float = float("nan")
    device: str = ""
    local_steps: int | None = None  # T of the attacked update
    nodes: int | float | None = None  # gradient evaluations per iteration (fl_attack.evaluation.nodes_per_iteration)

    @classmethod
    def failed(cls, job: AttackJob, error: str, seconds: float = float("nan")) -> AttackOutcome:
        """A job that produced no reconstruction, with the cause."""
        return cls(
            job.job_id,
            job.method,
            job.target,
            "failed",
            error=error,
            seconds=seconds,
            label_source="oracle" if not isinstance(job.labels, str) else job.labels,
            local_steps=job.update.metadata.local_steps,
        )


def run_job(job: AttackJob, device: str = "auto") -> AttackOutcome:
    """Run one attack; never raises (an exception becomes status "failed" with its message)."""
    start = time.perf_counter()
    try:
        rec = reconstruct(
            job.update,
            job.method,
            labels=job.labels,
            config=job.config,
            device=device,
            time_limit=job.time_limit,
            model=job.model,
        )
        return AttackOutcome(
            job.job_id,
            job.method,
            job.target,
            "ok",
            images=rec.images,
            labels=rec.labels,
            label_source=rec.label_source,
            lsim_honest=rec.lsim_honest,
            lsim_calibrated=rec.lsim_calibrated,
            seconds=rec.seconds,
            device=str(torch.device(device) if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")),
            local_steps=job.update.metadata.local_steps,
            nodes=nodes_per_iteration(job.method, rec.config, rec.trace),
        )
    except Exception as exc:  # one failed attack must never kill the federation
        log.warning("attack %s on %s failed: %s", job.method, job.target.describe(), exc)
        return AttackOutcome.failed(job, f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - start)


class AttackerActor:
    """Ray actor body: holds a torch thread count and a device, runs jobs one at a time.

    A job may carry its own thread count (more cores once the clients are idle); the actor sets it
    before the job runs.
    """

    def __init__(self, threads: int, device: str = "auto"):
        torch.set_num_threads(max(1, int(threads)))
        self.device = device

    def run(self, job: AttackJob) -> AttackOutcome:
        if job.threads:
            torch.set_num_threads(max(1, int(job.threads)))
        return run_job(job, self.device)

    def info(self) -> dict:
        return {"threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}


MAX_RESTARTS = 2  # Ray restarts a dead attacker actor this many times, then the dispatcher replaces it
RESUBMITS = 1  # a job whose actor died under it is resubmitted this many times, then recorded as failed


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


class AttackDispatcher:
    """Submits attack jobs without blocking the rounds and hands back the finished outcomes.

    With Ray initialised (inside a Flower simulation) it starts ``num_actors`` actors lazily, with
    num_cpus=0, ``num_gpus`` each and Ray's ``max_restarts``, and gives each job to the actor with
    the fewest pending jobs (ties: the lowest index). Without Ray it runs each job in-process at
    submit time (the outcome is then ready at the next poll).

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
        use_ray: bool | None = None,
        max_restarts: int = MAX_RESTARTS,
        actor_cls: type = AttackerActor,
    ):
        self.num_actors, self.num_gpus, self.threads, self.device = num_actors, num_gpus, threads, device
        self.use_ray = use_ray
        self.max_restarts, self.actor_cls = max_restarts, actor_cls
        self._actors: list = []
        self._load: list[int] = []  # pending jobs per actor
        self._pending: dict = {}  # ray ObjectRef -> (AttackJob, actor index, deaths so far, sequence number)
        self._seq = 0
        self._probes: dict = {}  # probe ObjectRef -> index of an actor that died and takes no jobs yet
        self._waiting: list = []  # (AttackJob, deaths so far): jobs waiting for a live actor
        self._ready: list[AttackOutcome] = []

    def _ray(self):
        if self.use_ray is False:
            return None
        import ray

        if not ray.is_initialized():  # never ray.init() here: Flower owns the Ray runtime
            if self.use_ray:
                raise RuntimeError("Ray is not initialised; the attacker must run inside a Flower simulation")
            return None
        if not self._actors:
            for _ in range(self.num_actors):
                self._actors.append(self._new_actor(ray))
                self._load.append(0)
            log.info(
                "started %d attacker actor(s): num_cpus=0, num_gpus=%s, torch threads=%d, max_restarts=%d",
                self.num_actors,
                self.num_gpus,
                self.threads,
                self.max_restarts,
            )
        return ray

    def _new_actor(self, ray):
        return (
            ray.remote(self.actor_cls)
            .options(num_cpus=0, num_gpus=self.num_gpus, max_restarts=self.max_restarts)
            .remote(self.threads, self.device)
        )

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._waiting)

    def submit(self, job: AttackJob) -> None:
        ray = self._ray()
        if ray is None:
            self._ready.append(run_job(job, self.device))
            return
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
        self._pending[self._actors[i].run.remote(job)] = (job, i, deaths, self._seq)

    def _actor_died(self, ray, i: int) -> list[AttackOutcome]:
        """Actor ``i`` died: settle every job it held and take it out of the assignment until a probe
        says it is back (Ray retries the probe while the actor restarts; ActorDiedError once it is past
        its restarts).

        An actor runs its jobs in submission order, so of the jobs that failed with it the oldest was
        running and counts the death; the ones queued behind it are resubmitted without counting.
        Returns the outcomes settled here (finished jobs, and jobs past ``RESUBMITS``).
        """
        from ray.exceptions import RayActorError

        refs = sorted((r for r, entry in self._pending.items() if entry[1] == i), key=lambda r: self._pending[r][3])
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=2.0)  # the jobs of a dead actor fail together
        out, again, counted = [], [], False
        for ref in (r for r in refs if r in set(ready)):
            job, _, deaths, _ = self._pending.pop(ref)
            self._load[i] -= 1
            try:
                out.append(ray.get(ref))
                continue
            except RayActorError as exc:
                cause = _first_line(exc)
            except Exception as exc:
                out.append(AttackOutcome.failed(job, _first_line(exc)))
                continue
            if not counted:  # the job that was running when the actor died
                counted, deaths = True, deaths + 1
            if deaths > RESUBMITS:
                out.append(
                    AttackOutcome.failed(
                        job,
                        f"ActorDiedError: the attacker actor died under this job {deaths} times; last cause: {cause}",
                    )
                )
            else:
                log.warning(
                    "attacker actor %d died under attack %s on %s (%s); resubmitting it",
                    i,
                    job.method,
                    job.target.describe(),
                    cause,
                )
                again.append((job, deaths))
        if i not in self._probes.values():
            self._probes[self._actors[i].info.options(max_task_retries=-1).remote()] = i
        for job, deaths in again:
            self._assign(job, deaths)
        return out

    def _probe_answered(self, ray, ref) -> None:
        i = self._probes.pop(ref)
        try:
            ray.get(ref)
            log.warning("attacker actor %d restarted", i)
        except Exception as exc:  # past its restarts: a fresh actor takes its place
            log.warning("attacker actor %d is gone (%s); starting a new one", i, _first_line(exc))
            ray.kill(self._actors[i], no_restart=True)
            self._actors[i] = self._new_actor(ray)
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
                job, i = self._pending[ref][:2]
                try:
                    outcome = ray.get(ref)
                except RayActorError:  # the actor died under the job (OOM kill, crash, ray.kill)
                    out.extend(self._actor_died(ray, i))
                    continue
                except Exception as exc:
                    outcome = AttackOutcome.failed(job, _first_line(exc))
                del self._pending[ref]
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
            self._probes.clear()
