"""Attack workers: where attacks run, off the caller's path. The public names, gathered from the
modules that hold them (import them from here):

- ``outcome``: ``AttackJob`` (one attack to run), ``AttackOutcome`` (what came back), and shipping
  results: ``outcomes``, ``remember``, ``memory_key``.
- ``run``: ``run_job``, one job run where it is called (the body of every worker); ``where_am_i``;
  ``GATE_ENV``, the tests' fault-injection hook.
- ``pool``: ``InlineWorkers`` (this process, at submit time: tests, debugging; it blocks the caller)
  and ``ProcessWorkers`` (spawned local processes, no Ray. A dead process breaks the pool; a fresh
  pool takes its place and the jobs it held are resubmitted once).
- ``actor``: ``RayWorkers`` and its actor ``AttackWorker``: Ray actors, on the Ray runtime this
  process already has (Flower's simulation, itself possibly attached to a cluster through
  ``RAY_ADDRESS``), or on a Ray cluster given by address, which it joins when this process has no
  Ray yet (Flower's deployment engine, the experiments, ``fl-attack replay``). Jobs go to the live
  actor with the fewest pending jobs; a dead actor is restarted by Ray and replaced once past its
  restarts; its job is resubmitted once.
- ``schedule``: ``make_workers`` chooses among them; ``Pipeline`` keeps jobs submitted ahead and
  batches: with ``batch`` > 1 it holds the jobs submitted together (one round's, in the federation)
  and sends those of one round, method, architecture, k and settings as one job whose worker runs
  them as one ``fl_attack.reconstruct_batch`` (``batch_key``; rows equal to the unbatched ones,
  ``batch`` column N); ``check_batch`` checks the attack-batch setting, ``resolve_batch`` reads it.

Every pool has one interface (``Workers``: ``submit``, ``poll``, ``drain``, ``in_flight``,
``shutdown``). Every outcome names where it ran (``worker_node``: the Ray node id or the host name;
``worker_id``: the Ray worker id or the process id), so a record shows which machine attacked.
Workers see only what the attacker sees (the update and public metadata), never the clients' data.
No Flower import here.
"""

from __future__ import annotations

from fl_attack.attacker.runtime.actor import MAX_RESTARTS, AttackWorker, RayWorkers
from fl_attack.attacker.runtime.outcome import RESUBMITS, AttackJob, AttackOutcome, memory_key, outcomes, remember
from fl_attack.attacker.runtime.pool import InlineWorkers, ProcessWorkers
from fl_attack.attacker.runtime.run import GATE_ENV, run_job, where_am_i
from fl_attack.attacker.runtime.schedule import (
    BATCH_ON_CUDA,
    HOLD_BATCHES,
    Pipeline,
    Workers,
    batch_key,
    check_batch,
    make_workers,
    resolve_batch,
)

__all__ = [
    "AttackJob",
    "AttackOutcome",
    "outcomes",
    "remember",
    "memory_key",
    "RESUBMITS",
    "run_job",
    "where_am_i",
    "GATE_ENV",
    "InlineWorkers",
    "ProcessWorkers",
    "AttackWorker",
    "RayWorkers",
    "MAX_RESTARTS",
    "Workers",
    "make_workers",
    "Pipeline",
    "batch_key",
    "check_batch",
    "resolve_batch",
    "BATCH_ON_CUDA",
    "HOLD_BATCHES",
]
