"""``python -m benchmarks.memory_cost RUN_DIR``: what a remembering server's joint attack costs, on a
run's recorded updates (docs/attacker-memory.md, "Cost").

For one tracked client (``--partition``) of a run folder with updates/:
1. time: ``fl_attack.reconstruct`` on its first n recorded updates, n = 1..``--max-updates``, at
   ``--iterations`` each (the first n of them the same for every n), the fastest of ``--repeats``
   after a warm-up; seconds per attack and per update. The objective is one per update, so the
   time should grow at most linearly in n.
2. warm start: a cold attack on the first round's update (from noise, K = the run's iterations)
   gives the estimate a ``keep`` server holds; a joint attack on the client's first ``--warm-updates``
   updates started from it (weights 1 / each update's own fit, as fl_attack.attacker.memory does) is traced
   for PSNR against the truth (the evaluator's ``psnr_trace``; nothing goes back to the attack),
   and the figure is the first iteration where it reaches the kept estimate's PSNR, as a fraction
   of K. The fit of each update comes from its own cold attack.
Prints one JSON object (rows and the two figures); writes nothing unless ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from fl_attack import reconstruct
from fl_attack.audit.replay import open_run
from fl_attack.evaluation.evaluator import psnr_trace, score
from fl_attack.evaluation.victims import ground_truth
from fl_attack.federation.update import AttackTarget, load_update


def client_updates(run_dir, partition: int):
    """(the partition's ObservedUpdates in round order, their rounds, the run, its truth)."""
    run = open_run(run_dir)
    rows = [r for r in run.index if AttackTarget.from_row(r).partition_ids == (partition,)]
    if not rows:
        raise ValueError(f"{run_dir} recorded no update of partition {partition}")
    rows.sort(key=lambda r: int(r["round"]))
    updates = [load_update(run.updates, r)[0] for r in rows]
    return updates, [int(r["round"]) for r in rows], run, ground_truth(run.data, (partition,))


def run_bench(
    run_dir,
    partition: int = 0,
    max_updates: int = 5,
    iterations: int = 20,
    warm_updates: int = 3,
    method: str = "pisme",
    threads: int = 0,
    repeats: int = 3,
) -> dict:
    if threads:
        torch.set_num_threads(threads)
    updates, rounds, run, (truth_images, truth_labels) = client_updates(run_dir, partition)
    config = run.attack_config
    n_max = min(max_updates, len(updates))
    timing, timed = [], replace(config, iterations=iterations)
    reconstruct(updates[:1], method, config=timed, device="cpu")  # warm-up (allocator, model build)
    for n in range(1, n_max + 1):
        seconds = math.inf
        for _ in range(repeats):  # the fastest of a few: the least disturbed by other work
            start = time.perf_counter()
            reconstruct(updates[:n], method, config=timed, device="cpu")
            seconds = min(seconds, time.perf_counter() - start)
        timing.append({"updates": n, "seconds": round(seconds, 3), "seconds_per_update": round(seconds / n, 3)})
    base = timing[0]["seconds"]
    growth = max(t["seconds"] / (base * t["updates"]) for t in timing)

    k = config.iterations
    colds = [reconstruct(u, method, config=config, device="cpu") for u in updates[:warm_updates]]
    best = min(range(len(colds)), key=lambda i: colds[i].lsim_honest)
    kept = colds[best]
    kept_psnr = score(kept.images, kept.labels, truth_images, truth_labels, run.data.dataset)["psnr"]
    joint = reconstruct(
        updates[: len(colds)],
        method,
        config=replace(config, trace_every=1),
        labels=kept.labels,
        init=kept.images,
        weights=[1 / max(c.lsim_honest, 1e-6) for c in colds],
        device="cpu",
        callback=psnr_trace(truth_images),
    )
    reached = next((row["iteration"] + 1 for row in joint.trace if row["psnr"] >= kept_psnr), None)
    return {
        "run": str(run_dir),
        "partition": partition,
        "rounds": rounds[:n_max],
        "method": method,
        "threads": torch.get_num_threads(),
        "timing": timing,
        "time_growth_vs_linear": round(growth, 3),  # <= 1: at most linear in the number of updates
        "cold_iterations": k,
        "kept_round": rounds[best],
        "kept_psnr": round(float(kept_psnr), 3),
        "joint_updates": len(colds),
        "joint_final_psnr": round(float(joint.trace[-1]["psnr"]), 3),
        "warm_iterations_to_kept_psnr": reached,
        "warm_fraction_of_cold": None if reached is None else round(reached / k, 3),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory_cost", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", help="a run folder with recorded updates of a tracked client")
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--max-updates", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20, help="iterations of each timed attack")
    p.add_argument("--warm-updates", type=int, default=3, help="updates of the warm-started joint attack")
    p.add_argument("--method", default="pisme")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    try:
        result = run_bench(
            a.run_dir, a.partition, a.max_updates, a.iterations, a.warm_updates, a.method, a.threads, a.repeats
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"memory_cost: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
