"""Warm-started joint attacks of one tracked writer against its kept round-1 estimate (docs/attacker-memory.md).

PYTHONPATH=. python docs/attacker-memory/warm_start_variants.py PARTITION  (on results/memory-study/femnist-joint)
"""

import sys
from dataclasses import replace

import torch

from benchmarks.memory_cost import client_updates
from fl_attack import reconstruct
from fl_attack.evaluation.evaluator import score

torch.set_num_threads(1)
p = int(sys.argv[1])
updates, rounds, run, (ti, tl) = client_updates("results/memory-study/femnist-joint", p)
cfg = run.attack_config
colds = [reconstruct(u, "pisme", config=cfg, device="cpu") for u in updates[:3]]
kept = colds[0]


def psnr(rec):
    return score(rec.images, rec.labels, ti, tl, "femnist")["psnr"]


print("cold", [round(psnr(c), 2) for c in colds], [round(c.lsim_honest, 3) for c in colds], flush=True)
for sel in ([0, 1, 2], [0, 1], [0, 14]):
    us = [updates[i] for i in sel]
    fits = [colds[i].lsim_honest if i < 3 else 0.15 for i in sel]  # round 15's fit: about its own attack's
    for lr in (0.1, 0.01):
        for power in (1, 2):
            rec = reconstruct(
                us,
                "pisme",
                config=replace(cfg, iterations=67, lr_images=lr),
                labels=kept.labels,
                init=kept.images,
                weights=[1 / f**power for f in fits],
                device="cpu",
            )
            print(sel, lr, power, round(psnr(rec), 2), [round(x, 3) for x in rec.lsim_per_update], flush=True)
