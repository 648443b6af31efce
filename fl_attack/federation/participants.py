"""Who trains (and evaluates) in a round: drawn from the run's seed and the round, by partition id.

Flower's strategies sample a round's nodes with Python's unseeded ``random.sample`` over node ids
that are themselves random per run (``flwr/serverapp/strategy/strategy_utils.py``), so with
``fraction-train`` below 1 two runs of one seed train different clients. Here the draw is over the
federation's sorted partition ids, with ``numpy.random.default_rng([seed, round, stage])``: the same
seed gives the same participants in every round, on the simulation and the deployment engine alike
(each SuperNode's ``partition-id`` names it), and a resumed run draws what the uninterrupted one did.
How many: Flower's own count, ``max(int(n * fraction), minimum)``, capped at n. Flower-free.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# The third entry of the seed sequence, apart from the attack schedule's [seed, round] draw
# (RunSettings.select_clients), so that who trains and who is attacked are independent draws.
STAGES = {"train": 1, "evaluate": 2}


def sample_size(num_nodes: int, fraction: float, minimum: int) -> int:
    """Flower's number of nodes sampled for a round: ``max(int(num_nodes * fraction), minimum)``,
    at most ``num_nodes``; 0 when ``fraction`` is 0 (the stage is off). ValueError for a fraction
    outside [0, 1]."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], not {fraction}")
    if fraction == 0:
        return 0
    return min(num_nodes, max(int(num_nodes * fraction), minimum))


def sample_participants(
    partition_ids: Iterable[int], size: int, seed: int, server_round: int, stage: str = "train"
) -> list[int]:
    """``size`` of ``partition_ids`` that take part in ``stage`` ("train" or "evaluate") of
    ``server_round`` (the run's round, counted from 1 across resumes), sorted. All of them when
    ``size`` >= their number (no draw).

    partition_ids: the federation's partitions (any order). size >= 0: how many (``sample_size``).
    ValueError for an unknown stage, a negative size or repeated partition ids.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {sorted(STAGES)}, not {stage!r}")
    if size < 0:
        raise ValueError(f"size must be >= 0, not {size}")
    pool = sorted(int(p) for p in partition_ids)
    if len(set(pool)) != len(pool):
        raise ValueError(f"partition ids repeat: {pool}")
    if size >= len(pool):
        return pool
    rng = np.random.default_rng([int(seed), int(server_round), STAGES[stage]])
    return sorted(int(p) for p in rng.choice(pool, size=size, replace=False))
