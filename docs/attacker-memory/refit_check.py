"""Would a refit make `keep`'s fits comparable across rounds? (docs/attacker-memory.md, "Comparing fits across rounds")

For each tracked writer of a frontier setting and each attacked round after the first: the estimate the
remembering server held before that round (memory.pt), its images and labels fixed, its path refitted on
the round's update alone (lr_images = 0, 50 iterations, the run's attack otherwise), against that round's
own memoryless attack (attacks.csv's honest Lsim). Lower fits the round's update better. No ground truth.

    PYTHONPATH=. python docs/attacker-memory/refit_check.py OUT SETTING ...   (OUT: the frontier study's --out)
"""

import csv
import sys
from dataclasses import replace

import torch

from fl_attack.attacker.api import reconstruct
from fl_attack.attacker.memory import AttackMemory
from fl_attack.audit.replay import open_run
from fl_attack.federation.update import load_update

torch.set_num_threads(1)
print("setting round writer kept_from kept_own_fit kept_refit_now memoryless_fit kept_recovered memoryless_recovered")
for setting in sys.argv[2:]:
    run = open_run(f"{sys.argv[1]}/runs/{setting}")
    memory = AttackMemory.load(run.path / "memory.pt")
    with open(run.path / "attacks.csv", newline="") as f:
        rows = {(int(r["round"]), r["partition_id"], r["method"]): r for r in csv.DictReader(f)}
    config = replace(run.attack_config, lr_images=0.0, iterations=50, auto=())  # the path alone
    for entry in run.index:
        round_, writer = int(entry["round"]), entry["partition_ids"]
        if round_ == 1:
            continue
        kept = memory.clients[(int(writer), "pisme+memory")].best_until(round_ - 1)
        update, _ = load_update(run.updates, entry)
        refit = reconstruct(update, "pisme", labels=kept.labels, init=kept.images, config=config, device="cpu")
        assert torch.allclose(refit.images, kept.images, atol=1e-6)  # the images did not move
        own = rows[(round_, writer, "pisme")]
        held_before = rows[(max(kept.rounds), writer, "pisme+memory")]
        print(
            setting,
            round_,
            writer,
            max(kept.rounds),
            f"{kept.fit:.3f}",
            f"{refit.lsim_honest:.3f}",
            f"{float(own['lsim_honest']):.3f}",
            held_before["recovered"],
            own["recovered"],
            flush=True,
        )
