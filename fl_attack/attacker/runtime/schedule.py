"""Which workers a driver gets, and how jobs reach them: ``make_workers``, ``check_batch``, ``resolve_batch``,
``batch_key`` and ``Pipeline``, the one submit-ahead / poll / drain loop of the federation,
``fl-attack replay`` and the experiments (fl_attack.attacker.runtime.workers says where each piece lives).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace

import torch

from fl_attack.attacker.attacks import ATTACKS
from fl_attack.attacker.runtime.actor import RayWorkers
from fl_attack.attacker.runtime.outcome import AttackJob, AttackOutcome, _failed_like
from fl_attack.attacker.runtime.pool import InlineWorkers, ProcessWorkers
from fl_attack.attacker.runtime.run import _device_name
from fl_attack.federation.update import layout

# ---------------------------------------------------------------------------------- choice


Workers = InlineWorkers | ProcessWorkers | RayWorkers


def make_workers(
    num_workers: int = 0,
    *,
    address: str | None = None,
    threads: int = 1,
    device: str = "auto",
    num_gpus: float = 0.0,
    ray_runtime: bool = False,
) -> Workers:
    """The workers of a driver. ``ray_runtime``: actors on the Ray runtime this process already has
    (Flower's simulation), asking no CPUs; else ``address`` set: ``num_workers`` (at least 1) actors
    on that Ray cluster, each asking ``threads`` CPUs; else ``num_workers`` 0: this process
    (``InlineWorkers``), N: that many local processes. Every actor asks ``num_gpus``.
    ValueError for a negative count, threads < 1 or a negative num_gpus."""
    if isinstance(num_workers, bool) or int(num_workers) < 0:
        raise ValueError(f"the number of workers must be >= 0, got {num_workers}")
    if int(threads) < 1:
        raise ValueError(f"threads per worker must be >= 1, got {threads}")
    if not math.isfinite(num_gpus) or num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0, got {num_gpus}")
    if ray_runtime:
        return RayWorkers(max(1, int(num_workers)), num_gpus, threads, device)
    if address:
        return RayWorkers(max(1, int(num_workers)), num_gpus, threads, device, address=address, num_cpus=threads)
    if int(num_workers) == 0:
        return InlineWorkers(device, threads)
    return ProcessWorkers(int(num_workers), threads, device)


# -------------------------------------------------------------------------------- pipeline


HOLD_BATCHES = 8  # Pipeline.run holds at most this many batches' worth of jobs while their groups form
BATCH_ON_CUDA = 16  # attack-batch "auto" on CUDA: 4.42x the throughput of single attacks at N=16 on an H200
# (CIFAR-100, k=50, m=7; docs/gpu-check/); on a CPU 1: N sequential attacks were faster there
# (docs/performance.md, "Batched attacks")


def check_batch(setting: int | str) -> int | str:
    """``setting`` as N >= 1 (an int or its text) or "auto"; ValueError for anything else. The one
    check of attack-batch (the run config's, replay's --batch, the experiments'); probes no device."""
    text = str(setting).strip()
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"attack batch must be an integer >= 1 or 'auto', got {setting!r}")
    return int(text)


def resolve_batch(setting: int | str, device: str | torch.device = "auto") -> int:
    """The attacks a worker runs as one ``reconstruct_batch``: ``setting`` N >= 1 (an int or its text),
    or "auto": ``BATCH_ON_CUDA`` when the attacks run on CUDA (``device`` "cuda", or "auto" with a
    GPU here), else 1. ValueError for anything else (``check_batch``)."""
    batch = check_batch(setting)
    if batch == "auto":
        return BATCH_ON_CUDA if _device_name(str(device)).startswith("cuda") else 1
    return batch


def batch_key(job: AttackJob) -> tuple | None:
    """What jobs must share to run as one ``reconstruct_batch``: the round, method, settings,
    architecture, the update's training metadata (dataset, k, T, optimizer, mode: the batch's attack
    reads its optimizer weights from the first update's) and state-dict layout, the threads, the
    public auxiliary data. None for a job that runs alone: a "+memory" job (its attacks start from the
    server's remembered estimates (``init``) and may fit several updates of the client at once, which
    ``reconstruct_batch`` does not take; and each waits for its client's previous one), a method that
    cannot be batched (pisme-adaptive, ginas: ``Attack.batchable``), an attack with the diffusion prior
    (its noise is drawn per attack, so a batch would not reproduce the single rows), a job without an
    update (it failed before), or one that is already a batch."""
    attack = ATTACKS.get(job.method)
    if (
        job.update is None
        or job.batch
        or job.memory is not None
        or attack is None
        or not attack.batchable
        or attack.uses_prior
        or job.config.image_prior != "none"
    ):
        return None
    meta = job.update.metadata
    shapes = tuple((k, tuple(s)) for k, s in layout(job.update.w0))
    settings = tuple(sorted(asdict(job.config).items()))
    where = (job.target.round, job.threads, id(job.label_aux))
    return (*where, job.method, job.model, settings, repr(meta), shapes)


class Pipeline:
    """Attack jobs kept submitted ahead to workers and collected as they finish: the one
    submit-ahead / poll / drain loop of the federation, ``fl-attack replay`` and the experiments.
    (A worker's death and the job's resubmission are the workers' own, above.)

    workers: a ``Workers``, or a function that makes one at the first submit (the federation picks
    its workers once Flower's runtime is up). Job ids must be unique among the jobs in flight.
    batch: N >= 1 (``resolve_batch``). With N > 1, submitted jobs are held until the next ``poll``,
    ``drain`` or ``run`` step (the federation submits a round's jobs, then polls), and the held jobs
    of one ``batch_key`` go to a worker in groups of at most N as one job (``AttackJob.batch``), which
    runs them as one ``reconstruct_batch``; each comes back as its own (job, outcome) pair, in the
    rows it would have alone but for ``batch`` and the timings. A job ``batch_key`` refuses goes alone.
    """

    def __init__(self, workers, batch: int = 1):
        if isinstance(batch, bool) or int(batch) < 1:
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        self._make = workers if callable(workers) and not hasattr(workers, "submit") else None
        self.workers: Workers | None = None if self._make else workers
        self.batch = int(batch)
        self.jobs: dict[int, AttackJob] = {}  # in flight, by job id (a batch under its first job's id)
        self._held: list[AttackJob] = []  # submitted, not yet sent (batch > 1)

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet collected (each job of a batch counts)."""
        return sum(1 + len(job.batch) for job in self.jobs.values()) + len(self._held)

    def rounds_in_flight(self) -> list[int]:
        """The rounds of the jobs in flight, oldest first (one entry per job)."""
        jobs = [j for job in self.jobs.values() for j in (job, *job.batch)] + self._held
        return sorted(job.target.round for job in jobs)

    def submit(self, job: AttackJob) -> None:
        if self.batch > 1 and batch_key(job) is not None:
            self._held.append(job)
            return
        self._send(job)

    def _send(self, job: AttackJob) -> None:
        if self.workers is None:
            self.workers = self._make()
        self.jobs[job.job_id] = job
        self.workers.submit(job)

    def flush(self, full_only: bool = False) -> None:
        """Send the held jobs: those of one ``batch_key`` in groups of at most ``batch``, in the order
        they were submitted (a group of one goes as a plain job). full_only: send only whole groups of
        ``batch`` and keep the rest held (``run``, while more jobs may come)."""
        groups: dict[tuple, list[AttackJob]] = {}
        for job in self._held:
            groups.setdefault(batch_key(job), []).append(job)
        self._held = []
        for jobs in groups.values():
            for i in range(0, len(jobs), self.batch):
                first, *rest = chunk = jobs[i : i + self.batch]
                if full_only and len(chunk) < self.batch:
                    self._held += chunk
                    continue
                self._send(replace(first, batch=tuple(rest)) if rest else first)

    def _sent(self) -> int:
        return sum(1 + len(job.batch) for job in self.jobs.values())

    def _whole_group_held(self) -> bool:
        keys = [batch_key(job) for job in self._held]
        return any(keys.count(k) >= self.batch for k in set(keys))

    def poll(self) -> list[tuple[AttackJob, AttackOutcome]]:
        """(job, outcome) of every job finished since the last call (does not wait)."""
        self.flush()
        return self._paired(self.workers.poll() if self.workers else [])

    def _paired(self, outcomes: list[AttackOutcome]) -> list[tuple[AttackJob, AttackOutcome]]:
        """(job, outcome) pairs; a batch's outcome becomes one pair per job (a failed batch: each of its
        jobs failed with its error)."""
        pairs = []
        for outcome in outcomes:
            job = self.jobs.pop(outcome.job_id)
            if not job.batch:
                pairs.append((job, outcome))
                continue
            others = outcome.batched or [_failed_like(j, outcome) for j in job.batch]
            outcome.batched = None
            pairs += [(replace(job, batch=()), outcome), *zip(job.batch, others)]
        return pairs

    def drain(self, timeout: float, on_done=None) -> list[tuple[AttackJob, AttackOutcome]]:
        """Wait up to ``timeout`` seconds for every job in flight, calling ``on_done(pairs)`` after each
        look (pairs may be empty: a chance to report progress); the jobs still running then come back
        as failed (their workers stop them). Returns every (job, outcome) pair."""
        self.flush()
        out, deadline = [], time.monotonic() + timeout
        while self.jobs:
            late = time.monotonic() >= deadline
            done = self._paired(self.workers.drain(0)) if late else self.poll()
            if on_done:
                on_done(done)
            out += done
            if late:
                break
            if not done:
                time.sleep(0.1)
        return out

    def run(self, jobs, ahead: int = 1):
        """Yield (job, outcome) for every job of the iterable ``jobs``, kept at most ``ahead`` in
        flight (``ahead`` batches of ``batch`` when batching, each group formed from the jobs taken
        until one is whole, at most ``HOLD_BATCHES`` x ``ahead`` x ``batch`` of them held, then sent in
        the groups they form); jobs are made only when submitted. An interrupt or a closed generator
        stops the jobs in flight (no outcome for them)."""
        jobs, more, limit = iter(jobs), True, max(1, ahead) * self.batch
        held_at_most = HOLD_BATCHES * limit  # with batch > 1: jobs held while their groups form
        try:
            while more or self.jobs or self._held:
                # with batch > 1, jobs are taken until one group is whole (or ``limit`` are sent): the
                # jobs of one batch need not follow each other (a replay lists each update's methods)
                while (
                    more
                    and self._sent() < limit
                    and len(self._held) < held_at_most
                    and not (self._held and self._whole_group_held())
                ):
                    job = next(jobs, None)
                    if job is None:
                        more = False
                    else:
                        self.submit(job)
                # partial groups go once no job is left to come, or when the held jobs reach their bound
                self.flush(full_only=more and len(self._held) < held_at_most)
                done = self._paired(self.workers.poll() if self.workers else [])
                if not done and self.jobs:
                    time.sleep(0.05)
                yield from done
        finally:
            self._held.clear()
            if self.jobs:
                self._paired(self.workers.drain(0))

    def shutdown(self) -> None:
        """Stop the jobs still in flight or held (no outcome for them) and the workers."""
        self._held.clear()
        if self.workers is not None:
            if self.jobs:
                self._paired(self.workers.drain(0))
            self.workers.shutdown()
