"""The attacker: fl_attack reconstructions run on Ray actors, off the training path.

Facts this relies on (../shared/FLOWER.md): Flower's simulation process is the Ray driver and
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
    def failed(cls, job: "AttackJob", error: str, seconds: float = float("nan")) -> "AttackOutcome":
        """A job that produced no reconstruction, with the cause."""
        return cls(job.job_id, job.method, job.target, "failed", error=error, seconds=seconds,
                   label_source="oracle" if not isinstance(job.labels, str) else job.labels,
                   local_steps=job.update.metadata.local_steps)


def run_job(job: AttackJob, device: str = "auto") -> AttackOutcome:
    """Run one attack; never raises (an exception becomes status "failed" with its message)."""
    start = time.perf_counter()
    try:
        rec = reconstruct(job.update, job.method, labels=job.labels, config=job.config, device=device,
                          time_limit=job.time_limit)
        return AttackOutcome(job.job_id, job.method, job.target, "ok", images=rec.images, labels=rec.labels,
                             label_source=rec.label_source, lsim_honest=rec.lsim_honest,
                             lsim_calibrated=rec.lsim_calibrated, seconds=rec.seconds,
                             device=str(torch.device(device) if device != "auto" else
                                        ("cuda" if torch.cuda.is_available() else "cpu")),
                             local_steps=job.update.metadata.local_steps,
                             nodes=nodes_per_iteration(job.method, rec.config, rec.trace))
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


class AttackDispatcher:
    """Submits attack jobs without blocking the rounds and hands back the finished outcomes.

    With Ray initialised (inside a Flower simulation) it starts ``num_actors`` actors lazily, with
    num_cpus=0 and ``num_gpus`` each, and assigns jobs round-robin. Without Ray it runs each job
    in-process at submit time (the outcome is then ready at the next poll).
    """

    def __init__(self, num_actors: int = 1, num_gpus: float = 0.0, threads: int = 1, device: str = "auto",
                 use_ray: bool | None = None):
        self.num_actors, self.num_gpus, self.threads, self.device = num_actors, num_gpus, threads, device
        self.use_ray = use_ray
        self._actors: list = []
        self._pending: dict = {}  # ray ObjectRef -> AttackJob
        self._ready: list[AttackOutcome] = []
        self._next = 0

    def _ray(self):
        if self.use_ray is False:
            return None
        import ray

        if not ray.is_initialized():  # never ray.init() here: Flower owns the Ray runtime
            if self.use_ray:
                raise RuntimeError("Ray is not initialised; the attacker must run inside a Flower simulation")
            return None
        if not self._actors:
            cls = ray.remote(AttackerActor)
            for _ in range(self.num_actors):
                self._actors.append(cls.options(num_cpus=0, num_gpus=self.num_gpus)
                                    .remote(self.threads, self.device))
            log.info("started %d attacker actor(s): num_cpus=0, num_gpus=%s, torch threads=%d",
                     self.num_actors, self.num_gpus, self.threads)
        return ray

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, job: AttackJob) -> None:
        ray = self._ray()
        if ray is None:
            self._ready.append(run_job(job, self.device))
            return
        actor = self._actors[self._next % len(self._actors)]
        self._next += 1
        self._pending[actor.run.remote(job)] = job

    def poll(self) -> list[AttackOutcome]:
        """The outcomes finished so far (does not wait)."""
        return self._collect(timeout=0)

    def drain(self, timeout: float) -> list[AttackOutcome]:
        """Wait up to ``timeout`` seconds for every job; the ones still running are recorded as failed."""
        outcomes = self._collect(timeout=timeout)
        if self._pending:
            import ray

            for ref, job in list(self._pending.items()):
                ray.cancel(ref)
                outcomes.append(AttackOutcome.failed(
                    job, f"TimeoutError: still running after the {timeout:.0f} s drain"))
            self._pending.clear()
        return outcomes

    def _collect(self, timeout: float) -> list[AttackOutcome]:
        out, self._ready = self._ready, []
        if not self._pending:
            return out
        import ray

        deadline = time.monotonic() + timeout
        while self._pending:
            left = max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(self._pending), num_returns=1, timeout=left)
            if not done:
                break
            for ref in done:
                job = self._pending.pop(ref)
                try:
                    out.append(ray.get(ref))
                except Exception as exc:  # the actor died (e.g. out of memory)
                    out.append(AttackOutcome.failed(
                        job, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
        return out

    def shutdown(self) -> None:
        if self._actors:
            import ray

            for actor in self._actors:
                ray.kill(actor)
            self._actors.clear()
