"""Attack workers without Ray: this process (``InlineWorkers``) or spawned local processes
(``ProcessWorkers``), behind the interface every worker pool has (``submit``, ``poll``, ``drain``,
``in_flight``, ``shutdown``; fl_attack.attacker.runtime.workers). Each runs ``run_job``.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

import torch

from fl_attack.attacker.runtime.outcome import RESUBMITS, AttackJob, AttackOutcome, _died, _first_line
from fl_attack.attacker.runtime.run import run_job

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------ inline


class InlineWorkers:
    """Runs each job in this process at submit time (blocks the caller); the outcome is ready at the
    next poll. For tests, debugging and one-process command lines."""

    def __init__(self, device: str = "auto", threads: int | None = None):
        self.device, self.threads = device, threads
        self._ready: list[AttackOutcome] = []

    @property
    def in_flight(self) -> int:
        return 0

    def submit(self, job: AttackJob) -> None:
        threads = job.threads or self.threads
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(max(1, int(threads)))
        try:
            self._ready.append(run_job(job, self.device))
        finally:
            torch.set_num_threads(before)

    def poll(self) -> list[AttackOutcome]:
        out, self._ready = self._ready, []
        return out

    def drain(self, timeout: float) -> list[AttackOutcome]:
        return self.poll()

    def shutdown(self) -> None:
        self._ready.clear()


# ------------------------------------------------------------------------- local processes


def _process_init(threads: int) -> None:
    torch.set_num_threads(max(1, int(threads)))


def _process_run(job: AttackJob, device: str, threads: int) -> AttackOutcome:
    torch.set_num_threads(max(1, int(job.threads or threads)))
    return run_job(job, device)


class ProcessWorkers:
    """``num_workers`` spawned local processes, each running one job at a time with ``threads``
    torch threads (a job's own ``threads`` wins). A free process takes the next job, which is
    least-loaded scheduling for equal processes.

    A process that dies (OOM kill, segfault, SIGKILL) breaks the whole pool: every job it held fails
    with BrokenProcessPool. A fresh pool then takes its place, and each of those jobs counts one
    death and is resubmitted while its deaths are at most ``RESUBMITS``; past that it is recorded
    as failed with the cause. (Which of them was running is not known, so a queued job counts the
    death too.)
    """

    def __init__(self, num_workers: int = 1, threads: int = 1, device: str = "auto"):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers, self.threads, self.device = int(num_workers), max(1, int(threads)), device
        self._executor: ProcessPoolExecutor | None = None
        self._pending: dict[Future, tuple[AttackJob, int]] = {}  # future -> (job, deaths so far)
        self.restarts = 0

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            import multiprocessing

            self._executor = ProcessPoolExecutor(
                self.num_workers,
                mp_context=multiprocessing.get_context("spawn"),  # no fork of a threaded parent
                initializer=_process_init,
                initargs=(self.threads,),
            )
        return self._executor

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def pids(self) -> list[int]:
        """The pool's live process ids (for tests and monitoring)."""
        return list(getattr(self._executor, "_processes", None) or {})

    def submit(self, job: AttackJob, deaths: int = 0) -> None:
        self._pending[self._pool().submit(_process_run, job, self.device, self.threads)] = (job, deaths)

    def poll(self) -> list[AttackOutcome]:
        """The outcomes finished so far (does not wait)."""
        return self._collect(timeout=0)

    def drain(self, timeout: float) -> list[AttackOutcome]:
        """Wait up to ``timeout`` seconds for every job; the ones still running are recorded as failed
        (and their processes stopped)."""
        out = self._collect(timeout)
        if self._pending:
            for job, _ in self._pending.values():
                out.append(AttackOutcome.failed(job, f"TimeoutError: still running after the {timeout:.0f} s drain"))
            self._pending.clear()
            self._stop(kill=True)
        return out

    def _collect(self, timeout: float) -> list[AttackOutcome]:
        out: list[AttackOutcome] = []
        deadline = time.monotonic() + timeout
        while self._pending:
            done, _ = wait(
                list(self._pending), timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED
            )
            if not done:
                break
            broken = []
            for future in done:
                job, deaths = self._pending.pop(future)
                try:
                    out.append(future.result())
                except BrokenProcessPool as exc:
                    broken.append((job, deaths, _first_line(exc)))
                except Exception as exc:  # e.g. the job could not be pickled
                    out.append(AttackOutcome.failed(job, _first_line(exc)))
            if broken:
                out += self._restart(broken)
        return out

    def _restart(self, broken: list) -> list[AttackOutcome]:
        """The pool broke: settle every job it held, start a fresh pool, resubmit."""
        for future, (job, deaths) in list(self._pending.items()):  # they fail with the pool
            broken.append((job, deaths, "BrokenProcessPool"))
            del self._pending[future]
        self._stop(kill=True)
        self.restarts += 1
        out = []
        for job, deaths, cause in broken:
            if deaths + 1 > RESUBMITS:
                out.append(_died(job, deaths + 1, cause, "BrokenProcessPool", "attack process"))
            else:
                log.warning(
                    "an attack process died under %s on %s (%s); resubmitting it",
                    job.method,
                    job.target.describe(),
                    cause,
                )
                self.submit(job, deaths + 1)
        return out

    def _stop(self, kill: bool) -> None:
        if self._executor is None:
            return
        if kill:
            for pid in self.pids:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        self._executor.shutdown(wait=not kill, cancel_futures=True)
        self._executor = None

    def shutdown(self) -> None:
        self._pending.clear()
        self._stop(kill=False)
