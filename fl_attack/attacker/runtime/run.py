"""Running one attack job where this is called: ``run_job``, the body of every worker
(``InlineWorkers``, a ``ProcessWorkers`` process, an ``AttackWorker`` actor).

It calls the attacker's entry points (``reconstruct``, ``reconstruct_batch``, ``attack_with_memory``)
and turns what they return, or raise, into an ``AttackOutcome`` that names where it ran. Tests that
make attacks fail patch ``reconstruct`` / ``reconstruct_batch`` here, where they are called.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import replace

import torch

from fl_attack.attacker.api import reconstruct, reconstruct_batch
from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.memory import MEMORY_SUFFIX, attack_with_memory
from fl_attack.attacker.precision import resolve_precision
from fl_attack.attacker.runtime.outcome import AttackJob, AttackOutcome
from fl_attack.federation.app_data import ensure_registered

log = logging.getLogger(__name__)

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
        if job.dataset_spec is not None:  # an app's own dataset: the server's process registered it, this one may not
            ensure_registered(job.dataset_spec)
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
        # the round's best candidate until the server's memory chooses (outcome.remember)
        chosen = replace(
            rec,
            method=job.method,
            images=best.images,
            labels=best.labels,
            label_source="recovered",
            lsim_honest=best.fit,
            lsim_calibrated=float("nan"),
            trace=[],
            lsim_per_update=[],
            snapshots={},
            start_images=None,
        )
        return AttackOutcome(
            job.job_id,
            job.method,
            job.target,
            "ok",
            reconstruction=chosen,
            label_source="recovered",
            attack_seconds=time.perf_counter() - start,
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
        outcome = AttackOutcome.failed(job, f"{type(exc).__name__}: {exc}", attack_seconds=time.perf_counter() - start)
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
        reconstruction=rec,
        label_source=rec.label_source,
        attack_seconds=rec.seconds,
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
