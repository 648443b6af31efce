"""Pair the prior-option rows (docs/experiments/prior-option/*-prior) with table1-fair's rows of the
same victims without the prior; check that the ig runs reproduce table1's ig rows. Prints markdown.
python docs/experiments/prior-option/pair.py"""

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
table = {}
for r in csv.DictReader(open(HERE.parent / "table1-fair" / "table1.csv")):
    table[(r["dataset"], int(r["local_steps"]), int(r["client"]), r["method"])] = float(r["psnr"])
check, lines = [], []
for dataset in ("femnist", "cifar100"):
    for epochs in (50, 125):
        for r in csv.DictReader(open(HERE / f"{dataset}-E{epochs}-check" / "results.csv")):
            key = (dataset, int(r["local_steps"]), int(r["client"]), "ig")
            check.append(abs(float(r["psnr"]) - table[key]))
        diffs = {}
        for r in csv.DictReader(open(HERE / f"{dataset}-E{epochs}-prior" / "results.csv")):
            key = (dataset, int(r["local_steps"]), int(r["client"]), r["method"])
            diffs.setdefault(r["method"], []).append(float(r["psnr"]) - table[key])
            T = int(r["local_steps"])
        for method, d in sorted(diffs.items()):
            cells = " ".join(f"{x:+.2f}" for x in d)
            helped = f"{sum(x > 0 for x in d)}/{len(d)}"
            lines.append(f"| {dataset} | {T} | {method} | {sum(d) / len(d):+.2f} | {cells} | {helped} |")
print(f"ig check: largest |PSNR - table1's| = {max(check):.4f} dB over {len(check)} attacks")
print("| dataset | T | method | with prior - without (mean, dB) | per client 0, 1, 2 | clients helped |")
print("|---|---|---|---|---|---|")
print("\n".join(lines))
