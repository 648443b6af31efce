"""An attack job and what comes back from it: the one unit the workers move (fl_attack.attacker.runtime.workers).

``AttackJob``: one attack to run, from the observed update and public metadata alone (no private data).
``AttackOutcome``: its reconstruction or its failure, with where and how it ran.
Result shipping: ``outcomes`` (the rows one job yields), ``remember`` (a "+memory" outcome into the
server's memory) and the failed outcomes the pools and actors settle jobs with (``_failed_like``,
``_died``). No worker here, and no Flower import.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from fl_attack.attacker.api import Reconstruction
from fl_attack.attacker.attacks import ATTACKS, AttackConfig, schedule_name
from fl_attack.attacker.labels import AuxiliaryData
from fl_attack.attacker.memory import MEMORY_SUFFIX, MemoryInputs
from fl_attack.attacker.rule import for_update
from fl_attack.federation.app_data import app_spec
from fl_attack.federation.pools import DatasetSpec
from fl_attack.federation.update import AttackTarget, ObservedUpdate

RESUBMITS = 1  # a job whose worker died under it is resubmitted this many times, then recorded as failed


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
    # an app's own dataset (fl_attack.federation.app_data), which a worker in another process registers first
    dataset_spec: DatasetSpec | None = None

    def __post_init__(self):
        if self.update is not None and self.dataset_spec is None:
            self.dataset_spec = app_spec(self.update.metadata.dataset)
        # the settings the audit's rule picks (config.auto) are chosen here, from the update's metadata, so
        # that every worker, batch key and row sees the attack that runs (fl_attack.attacker.rule)
        if self.update is not None:
            self.config = for_update(self.config, self.update.metadata)

    def described(self, trace: list | None = None) -> dict:
        """The outcome fields that describe the attack itself (T, gradient evaluations per iteration, K, the label
        estimator) and its problem (the update's size against the unknowns, the client's
        optimizer), the same whether it succeeded or not (None / "" for a job without an update)."""
        attack = ATTACKS.get(self.method.removesuffix(MEMORY_SUFFIX))
        u = self.update
        return dict(
            local_steps=u.metadata.local_steps if u is not None else None,
            gradients_per_iteration=attack.gradients_per_iteration(self.config, trace) if attack else None,
            iterations=self.config.iterations,
            lr_schedule=schedule_name(self.config),
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
        # the held estimate is not this attack's trajectory: no snapshots, no trend to judge
        outcome.reconstruction = replace(
            outcome.reconstruction, images=held.images, labels=held.labels, lsim_honest=held.fit, snapshots={}
        )
        outcome.candidates = None  # kept by the memory; not in unwritten-<n>.pt twice


def outcomes(job: AttackJob, outcome: AttackOutcome) -> list[AttackOutcome]:
    """The rows one job yields: its outcome, preceded, for a "+memory" job ``with_memoryless``, by
    the round's memoryless attack (the job ran it anyway; failed when the job failed)."""
    if not (job.with_memoryless and job.method.endswith(MEMORY_SUFFIX)):
        return [outcome]
    base = job.method.removesuffix(MEMORY_SUFFIX)
    memoryless = outcome.memoryless or AttackOutcome.failed(
        AttackJob(job.job_id, job.update, base, job.config, job.target, job.labels),
        outcome.error,
        outcome.attack_seconds,
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
    """What came back: status "ok" with its ``reconstruction`` (fl_attack.attacker.api.Reconstruction, held,
    not copied: ``images`` (k,C,H,W) in [0,1], ``labels`` (k,), the Lsims, the trace, the snapshots and the
    public start are read from it), or status "failed" with the error text and no reconstruction.
    worker_node / worker_id: where it ran.

    A field or property that fills an attacks.csv column carries that column's name (the audit's
    ``fl_attack.schema.ATTACK_SCHEMA`` names the attribute of each; tests/test_schema.py holds them
    together), but for ``label_source``, the ``labels`` column: ``labels`` here is the label tensor.
    label_source, attack_seconds, precision, compile describe the job's run, failed or not: the labels it
    used ("recovered" or "oracle"), its wall time (NaN when it never ran to the end), its arithmetic and how
    its steps ran (an ok job's are its reconstruction's; a "+memory" job's seconds include choosing).
    """

    job_id: int
    method: str
    target: AttackTarget
    status: str
    error: str = ""
    reconstruction: Reconstruction | None = None  # an ok job's; a "+memory" job's: the estimate the server holds
    label_source: str = ""
    attack_seconds: float = float("nan")
    device: str = ""
    precision: str = ""  # the arithmetic the attack ran with (fl_attack.attacker.precision: fp32, bf16, tf32)
    local_steps: int | None = None  # T of the attacked update
    gradients_per_iteration: int | float | None = None  # Attack.gradients_per_iteration (PI-SME: m)
    iterations: int | None = None  # K, the attack's iterations (its AttackConfig's)
    lr_schedule: str = ""  # X_hat's learning-rate schedule (fl_attack.attacker.attacks.schedule_name)
    label_estimator: str = ""  # the AttackConfig's (recorded even with oracle labels, where it is unused)
    parameters: int | None = None  # the update's floating-point entries (ObservedUpdate.num_parameters)
    unknowns: int | None = None  # the client's pixels k*C*H*W (ObservedUpdate.num_unknowns)
    optimizer: str = ""  # the client's optimizer (ClientOptimizer.describe)
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
    def failed(cls, job: AttackJob, error: str, attack_seconds: float = float("nan")) -> AttackOutcome:
        """A job that produced no reconstruction, with the cause."""
        return cls(
            job.job_id,
            job.method,
            job.target,
            "failed",
            error=error,
            attack_seconds=attack_seconds,
            label_source="oracle" if not isinstance(job.labels, str) else job.labels,
            memory=job.memory.mode if job.memory is not None else "",
            **job.described(),
        )

    def plain(self) -> dict:
        """The outcome as one plain dict: its reconstruction's fields (images, labels, ...) beside its own
        (target, method, status, ...), the outcome's winning where both have one (method)."""
        rec = self.reconstruction
        held = {f.name: getattr(rec, f.name) for f in fields(rec)} if rec is not None else {}
        return {**held, **{k: v for k, v in vars(self).items() if k != "reconstruction"}}

    # What the reconstruction holds, read from it (None / NaN / [] for a failed job).
    @property
    def images(self) -> torch.Tensor | None:
        return None if self.reconstruction is None else self.reconstruction.images

    @property
    def labels(self) -> torch.Tensor | None:
        return None if self.reconstruction is None else self.reconstruction.labels

    @property
    def lsim_honest(self) -> float:
        return float("nan") if self.reconstruction is None else self.reconstruction.lsim_honest

    @property
    def lsim_calibrated(self) -> float:
        return float("nan") if self.reconstruction is None else self.reconstruction.lsim_calibrated

    @property
    def trace(self) -> list:
        return [] if self.reconstruction is None else self.reconstruction.trace

    @property
    def snapshots(self) -> dict:
        return {} if self.reconstruction is None else self.reconstruction.snapshots

    @property
    def start_images(self) -> torch.Tensor | None:
        return None if self.reconstruction is None else self.reconstruction.start_images


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _failed_like(job: AttackJob, outcome: AttackOutcome) -> AttackOutcome:
    """``job``'s failed outcome when the batch it ran in failed as a whole with ``outcome``."""
    failed = AttackOutcome.failed(job, outcome.error, outcome.attack_seconds)
    failed.worker_node, failed.worker_id, failed.device = outcome.worker_node, outcome.worker_id, outcome.device
    failed.precision, failed.threads = outcome.precision, outcome.threads
    return failed


def _died(job: AttackJob, deaths: int, cause: str, error: str, worker: str) -> AttackOutcome:
    """A job whose worker died under it more than ``RESUBMITS`` times."""
    return AttackOutcome.failed(job, f"{error}: the {worker} died under this job {deaths} times; last cause: {cause}")
