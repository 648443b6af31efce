# The honest Lsim and loss along two constant rates on one recorded update: does the objective pick the rate
# that recovers more? (docs/time-to-quality.md, "The third measurement")
#   PYTHONPATH=. python docs/time-to-quality/probes/rates.py RUN_DIR ROUND PARTITION 0.3,1.0 [ITERATIONS]
# Prints, per rate, "iteration:loss/honest Lsim" every 20 iterations.
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
rates = [float(r) for r in sys.argv[4].split(",")]
iters = int(sys.argv[5]) if len(sys.argv) > 5 else 200
run = open_run(run_dir)
cfg = json.load(open(f"{run_dir}/config.json"))["attack_config"]
cfg.update(iterations=iters, trace_every=10, snapshots=[])
ts = run.settings.server_test_set()
aux = AuxiliaryData(ts.images, ts.labels) if ts is not None else None
rows = [r for r in read_update_index(f"{run_dir}/updates") if int(r["round"]) == rnd and r["partition_ids"] == pid]
update, target = load_update(f"{run_dir}/updates", rows[0])
for lr in rates:
    c = dict(cfg, lr_images=lr, lr_decay=False)
    rec = reconstruct(update, "pisme", config=AttackConfig(**c), label_aux=aux, device="cpu")
    out = {t["iteration"]: (round(t["loss"], 4), round(t["lsim_honest"], 4)) for t in rec.trace}
    print(lr, " ".join(f"{k}:{v[0]}/{v[1]}" for k, v in out.items() if k % 20 == 0 or k == iters - 1), flush=True)
