"""Offline: the label estimator on every recorded round of a memory run, per tracked writer,
and simple fusions across rounds, scored against the truth (analysis only)."""
import sys, json
import numpy as np, torch
from fl_attack.update import read_update_index, load_update
from fl_attack.labels import recover_counts, estimate_class_counts, class_support, round_counts_on_support
from fl_attack.run_config import RunSettings
from fl_attack.victims import ground_truth

run = sys.argv[1]
cfg = json.load(open(f"{run}/config.json"))
settings = RunSettings.from_run_config(cfg["run_config"])
rows = read_update_index(f"{run}/updates")
by_p = {}
for row in rows:
    upd, target = load_update(f"{run}/updates", row)
    by_p.setdefault(target.partition_id, []).append((target.round, upd))
for p, items in sorted(by_p.items()):
    items.sort(key=lambda t: t[0])
    _, y = ground_truth(settings.data, [p])
    truth = np.bincount(y.numpy(), minlength=62)
    k = int(truth.sum())
    acc = lambda c: int(np.minimum(c, truth).sum()) / k
    raws, supports = [], []
    line = []
    for r, u in items:
        raw = estimate_class_counts(u, None, seed=0)
        sup = class_support(u)
        c = round_counts_on_support(raw, sup, k)
        raws.append(raw); supports.append(sup)
        line.append(f"{r}:{acc(c):.2f}")
    print(p, "per round", " ".join(line))
    for n in (1, 2, 3, 5, 15):
        sup = np.logical_and.reduce(supports[:n]) if n > 1 else supports[0]
        union = np.logical_or.reduce(supports[:n])
        mean = np.mean(raws[:n], axis=0)
        med = np.median(raws[:n], axis=0)
        print(f"  first {n}: mean-raw/sup1 {acc(round_counts_on_support(mean, supports[0], k)):.2f}"
              f"  median/sup1 {acc(round_counts_on_support(med, supports[0], k)):.2f}"
              f"  raw1/intersect {acc(round_counts_on_support(raws[0], sup, k)):.2f}"
              f"  raw1/union {acc(round_counts_on_support(raws[0], union, k)):.2f}"
              f"  support sizes {int(supports[0].sum())},{int(sup.sum())},{int(union.sum())} true {int((truth>0).sum())}")

from fl_attack.labels import AuxiliaryData
ts = settings.server_test_set()
aux = AuxiliaryData(ts.images, ts.labels)
for p, items in sorted(by_p.items()):
    _, y = ground_truth(settings.data, [p])
    truth = np.bincount(y.numpy(), minlength=62); k = int(truth.sum())
    acc = lambda c: int(np.minimum(c, truth).sum()) / k
    out = []
    for r, u in items:
        if r in (1, 2, 5, 10, 15):
            out.append(f"{r}:{acc(recover_counts(u, 'aux', aux, None, seed=0)):.2f}")
    print(p, "aux", " ".join(out))
