"""Attack workers: where attacks run, off the caller's path.

One interface (``Workers``: ``submit``, ``poll``, ``drain``, ``in_flight``, ``shutdown``), three
places to run an ``AttackJob``:

- ``RayWorkers``: Ray actors, on the Ray runtime this process already has (Flower's simulation,
  itself possibly attached to a cluster through ``RAY_ADDRESS``), or on a Ray cluster given by
  address, which it joins when this process has no Ray yet (Flower's deployment engine, the
  experiments, ``fl-attack replay``). Jobs go to the live actor with the fewest pending jobs; a
  dead actor is restarted by Ray and replaced once past its restarts; its job is resubmitted once.
- ``ProcessWorkers``: spawned local processes (no Ray). A dead process breaks the pool; a fresh
  pool takes its place and the jobs it held are resubmitted once.
- ``InlineWorkers``: this process, at submit time (tests, debugging; it blocks the caller).

``make_workers`` chooses. ``Pipeline`` batches: with ``batch`` > 1 it holds the jobs submitted
together (one round's, in the federation) and sends those of one round, method, architecture, k
and settings as one job whose worker runs them as one ``fl_attack.reconstruct_batch`` (``batch_key``;
rows equal to the unbatched ones, ``batch`` column N).

Every outcome names where it ran (``worker_node``: the Ray node id or the host name;
``worker_id``: the Ray worker id or the process id), so a record shows which machine attacked.
Workers see only what the attacker sees (the update and public metadata), never the clients' data.
No Flower import here.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from fl_attack.attacker.api import reconstruct, reconstruct_batch
from fl_attack.attacker.attacks import ATTACKS, AttackConfig
from fl_attack.attacker.labels import AuxiliaryData
from fl_attack.attacker.memory import MEMORY_SUFFIX, MemoryInputs, attack_with_memory
from fl_attack.attacker.precision import resolve_precision
from fl_attack.federation.update import AttackTarget, ObservedUpdate, layout

log = logging.getLogger(__name__)

MAX_RESTARTS = 2  # Ray restarts a dead attacker actor this many times, then it is replaced
RESUBMITS = 1  # a job whose worker died under it is resubmitted this many times, then recorded as failed
# Fault-injection hook (tests): with this set to a path, every attack waits until that file exists,
# so a test decides when attacks may end (e.g. only after round 2 has started). An attack that
# waits first creates "<path>.waiting-<pid>", so a test also knows which process holds one there.
GATE_ENV = "FL_ATTACK_ATTACKS_WAIT_FOR"


def _wait_for_gate() -> None:
    gate = os.environ.get(GATE_ENV)
    if not gate or os.path.exists(gate):
        return
    try:
        open(f"{gate}.waiting-{os.getpid()}", "a").close()
    except OSError:  # the gate's folder may be read-only: the wait is what counts
        pass
    while not os.path.exists(gate):
        time.sleep(0.05)


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
    threads: int | None = None  # torch threads on the worker for this job (None = the worker's own)
    model: str = (
        ""  # the victims' architecture as a spec (fl_attack.federation.models.resolve_model), rebuilt on the worker
    )
    memory: MemoryInputs | None = (
        None  # a "+memory" method's snapshot of the server's memory (fl_attack.attacker.memory)
    )
    label_aux: AuxiliaryData | None = None  # the server's public labelled data, for label_estimator "aux"
    with_memoryless: bool = False  # a "+memory" job that also yields its METHOD's memoryless row (``outcomes``)
    # the other jobs run with this one as one reconstruct_batch (Pipeline, ``batch_key``); () alone
    batch: tuple = ()

    def described(self, trace: list | None = None) -> dict:
        """The outcome fields that describe the attack itself (T, nodes per iteration, K, the label
        estimator) and its problem (the update's size against the unknowns, the client's
        optimizer), the same whether it succeeded or not (None / "" for a job without an update)."""
        attack = ATTACKS.get(self.method.removesuffix(MEMORY_SUFFIX))
        u = self.update
        return dict(
            local_steps=u.metadata.local_steps if u is not None else None,
            nodes=attack.nodes_per_iteration(self.config, trace) if attack else None,
            iterations=self.config.iterations,
            label_estimator=self.config.label_estimator,
            parameters=u.num_parameters if u is not None else None,
            unknowns=u.num_unknowns if u is not None else None,
            optimizer=u.metadata.optimizer.describe() if u is not None else "",
        )


def memory_key(target: AttackTarget, method: str) -> tuple:
    """The server's memory's key for one tracked client and "+memory" method."""
    return (target.partition_id, method)


def remember(memory, outcome: AttackOutcome) -> None:
    """Hand a "+memory" outcome's candidates to the server's memory (fl_attack.attacker.memory.AttackMemory);
    the outcome then carries the estimate the server holds after it, which its row scores. A failed
    outcome (no candidates) leaves the memory as it was."""
    if outcome.candidates:
        held = memory.remember(memory_key(outcome.target, outcome.method), outcome.candidates)
        outcome.images, outcome.labels, outcome.lsim_honest = held.images, held.labels, held.fit
        outcome.candidates = None  # kept by the memory; not in unwritten-<n>.pt twice


def outcomes(job: AttackJob, outcome: AttackOutcome) -> list[AttackOutcome]:
    """The rows one job yields: its outcome, preceded, for a "+memory" job ``with_memoryless``, by
    the round's memoryless attack (the job ran it anyway; failed when the job failed)."""
    if not (job.with_memoryless and job.method.endswith(MEMORY_SUFFIX)):
        return [outcome]
    base = job.method.removesuffix(MEMORY_SUFFIX)
    memoryless = outcome.memoryless or AttackOutcome.failed(
        AttackJob(job.job_id, job.update, base, job.config, job.target, job.labels), outcome.error, outcome.seconds
    )
    if outcome.memoryless is None:
        memoryless.worker_node, memoryless.worker_id, memoryless.device, memoryless.precision = (
            outcome.worker_node,
            outcome.worker_id,
            outcome.device,
            outcome.precision,
        )
    outcome.memoryless = None
    return [memoryless, outcome]


@dataclass
class AttackOutcome:
    """What came back: a reconstruction (images (k,C,H,W) in [0,1], labels (k,)), or status
    "failed" with the error text. worker_node / worker_id: where it ran."""

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
    precision: str = ""  # the arithmetic the attack ran with (fl_attack.attacker.precision: fp32, bf16, tf32)
    local_steps: int | None = None  # T of the attacked update
    nodes: int | float | None = None  # gradient evaluations per iteration (Attack.nodes_per_iteration)
    iterations: int | None = None  # K, the attack's iterations (its AttackConfig's)
    label_estimator: str = ""  # the AttackConfig's (recorded even with oracle labels, where it is unused)
    parameters: int | None = None  # the update's floating-point entries (ObservedUpdate.num_parameters)
    unknowns: int | None = None  # the client's pixels k*C*H*W (ObservedUpdate.num_unknowns)
    optimizer: str = ""  # the client's optimizer (ClientOptimizer.describe)
    trace: list | None = None  # the attack's trace (Reconstruction.trace)
    worker_node: str = ""
    worker_id: str = ""
    threads: int | None = None  # torch threads the attack ran with
    candidates: list | None = None  # a "+memory" job's fl_attack.attacker.memory.Candidates, for the server's memory
    memory: str = ""  # a "+memory" job's attack memory mode
    memoryless: AttackOutcome | None = None  # a "+memory" job's memoryless attack of the round (its METHOD row)
    compile: str = ""  # how its steps ran (Reconstruction.compile: compiled, eager, "eager (<why>)")
    batch: int | None = None  # the attacks of the reconstruct_batch it ran in (1: alone); None: no attack ran
    batched: list | None = None  # a batch job's outcomes of its other jobs, in ``AttackJob.batch``'s order

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
            memory=job.memory.mode if job.memory is not None else "",
            **job.described(),
        )


def where_am_i() -> tuple[str, str]:
    """(node, worker) of this process: Ray's node and worker ids inside a Ray worker, else the
    host name and ``pid<N>``."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            context = ray.get_runtime_context()
            return context.get_node_id(), context.get_worker_id()
    return socket.gethostname(), f"pid{os.getpid()}"


def run_job(job: AttackJob, device: str = "auto", callback=None) -> AttackOutcome:
    """Run one attack where this is called; never raises (an exception becomes status "failed").
    callback: ``reconstruct``'s (in-process callers only, e.g. the evaluator's ``psnr_trace``)."""
    _wait_for_gate()
    start = time.perf_counter()
    node, worker = where_am_i()
    try:
        options = dict(
            config=job.config,
            device=device,
            time_limit=job.time_limit,
            model=job.model,
            callback=callback,
            label_aux=job.label_aux,
        )
        where = dict(device=_device_name(device), threads=torch.get_num_threads(), worker_node=node, worker_id=worker)
        if job.batch:
            return _run_batch(job, device, where)
        if job.memory is None:
            rec = reconstruct(job.update, job.method, labels=job.labels, **options)
            return _succeeded(job, job.method, rec, **where)
        # the server chooses its estimate from the candidates when the outcome is back
        base = job.method.removesuffix(MEMORY_SUFFIX)
        candidates, rec = attack_with_memory(job.update, base, job.memory, **options)
        best = min(candidates, key=lambda c: c.fit)
        return AttackOutcome(
            job.job_id,
            job.method,
            job.target,
            "ok",
            images=best.images,
            labels=best.labels,
            label_source="recovered",
            lsim_honest=best.fit,
            seconds=time.perf_counter() - start,
            candidates=candidates,
            memory=job.memory.mode,
            memoryless=_succeeded(job, base, rec, **where),
            precision=rec.precision,
            compile=rec.compile,
            batch=1,
            **job.described(),
            **where,
        )
    except Exception as exc:  # one failed attack must never kill the caller
        log.warning("attack %s on %s failed: %s", job.method, job.target.describe(), exc)
        outcome = AttackOutcome.failed(job, f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - start)
        outcome.worker_node, outcome.worker_id, outcome.device = node, worker, _device_name(device)
        outcome.precision = _precision_name(job.config, outcome.device)
        return outcome


def _run_batch(job: AttackJob, device: str, where: dict) -> AttackOutcome:
    """``job`` and its ``batch`` as one ``reconstruct_batch`` (they share the method, settings,
    architecture, k and mode: ``batch_key``); returns ``job``'s outcome with the others' in ``batched``.
    Time limit: the sum of theirs (none if one has none). A batch that fails for another reason than
    its time (e.g. one client's update the model refuses) is attacked one by one, so each job gets the
    row it would get alone; a timeout fails them all (``Pipeline`` expands the failure)."""
    members = [replace(job, batch=()), *job.batch]
    limits = [m.time_limit for m in members]
    labels = [m.labels for m in members]
    try:
        recs = reconstruct_batch(
            [m.update for m in members],
            job.method,
            labels="recovered" if all(isinstance(y, str) for y in labels) else labels,
            config=job.config,
            device=device,
            time_limit=None if None in limits else sum(limits),
            model=job.model,
            label_aux=job.label_aux,
        )
    except TimeoutError:
        raise
    except Exception as exc:
        log.warning("a batch of %d %s attacks failed (%s); attacking them one by one", len(members), job.method, exc)
        done = [run_job(m, device) for m in members]
    else:
        done = [_succeeded(m, m.method, rec, batch=len(members), **where) for m, rec in zip(members, recs)]
    done[0].batched = done[1:]
    return done[0]


def _succeeded(job: AttackJob, method: str, rec, batch: int = 1, **where) -> AttackOutcome:
    """The outcome of ``job``'s reconstruction ``rec`` (fl_attack.Reconstruction) by ``method``, run in a
    ``reconstruct_batch`` of ``batch`` attacks (1: alone)."""
    return AttackOutcome(
        job.job_id,
        method,
        job.target,
        "ok",
        images=rec.images,
        labels=rec.labels,
        label_source=rec.label_source,
        lsim_honest=rec.lsim_honest,
        lsim_calibrated=rec.lsim_calibrated,
        seconds=rec.seconds,
        trace=rec.trace,
        precision=rec.precision,
        compile=rec.compile,
        batch=batch,
        **job.described(rec.trace),
        **where,
    )


def _device_name(device: str) -> str:
    return str(torch.device(device) if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))


def _precision_name(config: AttackConfig | None, device: str) -> str:
    """The precision a failed job would have run with on ``device`` ("auto" resolved), its config's
    own value where that does not resolve there (tf32 off CUDA), "" without a config."""
    if config is None:
        return ""
    try:
        return resolve_precision(config.precision, device)
    except ValueError:
        return config.precision


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _failed_like(job: AttackJob, outcome: AttackOutcome) -> AttackOutcome:
    """``job``'s failed outcome when the batch it ran in failed as a whole with ``outcome``."""
    failed = AttackOutcome.failed(job, outcome.error, outcome.seconds)
    failed.worker_node, failed.worker_id, failed.device = outcome.worker_node, outcome.worker_id, outcome.device
    failed.precision, failed.threads = outcome.precision, outcome.threads
    return failed


def _died(job: AttackJob, deaths: int, cause: str, error: str, worker: str) -> AttackOutcome:
    """A job whose worker died under it more than ``RESUBMITS`` times."""
    return AttackOutcome.failed(job, f"{error}: the {worker} died under this job {deaths} times; last cause: {cause}")


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


# ------------------------------------------------------------------------------------- Ray


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


def resolve_batch(setting: int | str, device: str | torch.device = "auto") -> int:
    """The attacks a worker runs as one ``reconstruct_batch``: ``setting`` N >= 1 (an int or its text),
    or "auto": ``BATCH_ON_CUDA`` when the attacks run on CUDA (``device`` "cuda", or "auto" with a
    GPU here), else 1. ValueError for anything else."""
    text = str(setting).strip()
    if text == "auto":
        return BATCH_ON_CUDA if _device_name(str(device)).startswith("cuda") else 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"attack batch must be an integer >= 1 or 'auto', got {setting!r}")
    return int(text)


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
