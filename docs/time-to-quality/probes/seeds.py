# The honest Lsim along the way for several seeds at one regime (constant 0.3): does an early value rank the seeds
# as the final one does? (docs/time-to-quality.md, "The third measurement")
#   PYTHONPATH=. python docs/time-to-quality/probes/seeds.py RUN_DIR ROUND PARTITION 0,1,2,3
import json
import sys

import torch

from fl_attack.attacker.api import reconstruct
from fl_attack.attacker.attacks.base import AttackConfig
from fl_attack.attacker.labels import AuxiliaryData
from fl_attack.audit.replay import open_run
from fl_attack.federation.update import load_update, read_update_index

torch.set_num_threads(1)
run_dir, rnd, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
seeds = [int(s) for s in sys.argv[4].split(",")]
run = open_run(run_dir)
cfg = json.load(open(f"{run_dir}/config.json"))["attack_config"]
cfg.update(iterations=200, trace_every=5, snapshots=[], lr_images=0.3, lr_decay=False)
ts = run.settings.server_test_set()
aux = AuxiliaryData(ts.images, ts.labels) if ts is not None else None
rows = [r for r in read_update_index(f"{run_dir}/updates") if int(r["round"]) == rnd and r["partition_ids"] == pid]
update, target = load_update(f"{run_dir}/updates", rows[0])
for s in seeds:
    rec = reconstruct(update, "pisme", config=AttackConfig(**dict(cfg, seed=s)), label_aux=aux, device="cpu")
    out = {t["iteration"]: round(t["lsim_honest"], 4) for t in rec.trace}
    print(
        s,
        " ".join(f"{k}:{out[k]}" for k in (10, 20, 30, 50, 100, 150) if k in out),
        "final",
        round(rec.lsim_honest, 4),
        flush=True,
    )
