"""``python -m benchmarks.verdict``: the verdict's measurements (docs/verdict.md).

For each dataset (FEMNIST and CIFAR-100, the bundled sample), ``--clients`` real victims (k =
``--samples``, B, E and lr as ``make demo``'s federation) are trained and attacked once with PI-SME
(``--iterations``, m = ``--nodes``), exactly as the federation's worker would; the matched
reconstructions are cached under ``--cache`` so a rerun (another D, another distance) needs no attack.
Then:

1. **distance and D**: the fraction singled out (rank 1 of the own original among k + D candidates)
   by pixel L2, 1 − SSIM and LPIPS-alex, for D in ``--distractors``, for the attack's
   reconstructions and the update-free outputs and control that must stay at chance, each
   Hungarian-matched to the client's originals exactly like the attack: every guess of the verdict
   (pool mean, class mean, class medoid, reader's pick), the attacks' noise start, and another
   client's reconstructions re-matched to this client's originals with that client's originals
   left out of the distractors (``Verdict.control``). ``chance`` is the matched null the verdict
   prints (the larger of k/(k+D) and the label-aware chance); ``chance_uniform`` the old 1/(k+D)
   (distance.csv).
2. **cost**: the verdict's extra seconds per attack (``Verdict.score``: guesses, re-identification,
   reader) against the attack's own seconds and the evaluator's other scoring (overhead.csv).

Rows are written as they come (resumable through the cache). Prints both tables.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.runtime.workers import run_job
from fl_attack.evaluation.evaluator import score
from fl_attack.evaluation.metrics import get_lpips, match_pairs
from fl_attack.evaluation.verdict import Verdict, pixel_l2, ssim_distance
from fl_attack.evaluation.victims import train_victim
from fl_attack.federation.data import DataSettings, load_bundled, run_writers, server_test_set

DATASETS = ("femnist", "cifar100")
HELD_OUT = 1000  # the federation's server-test-samples: the public pool


def attacked(dataset: str, partition: int, args) -> dict:
    """One victim attacked once, cached: matched reconstructions, truth, labels and seconds."""
    name = f"{dataset}-k{args.samples}-it{args.iterations}-m{args.nodes}-s{args.seed}-p{partition}.pt"
    path = Path(args.cache) / name
    if path.is_file():
        return torch.load(path, weights_only=True)
    victim = train_victim(
        dataset, partition, samples=args.samples, batch_size=8, local_epochs=5, lr=0.05, seed=args.seed
    )
    config = AttackConfig.from_overrides(None, iterations=args.iterations, nodes=args.nodes, seed=args.seed)
    outcome = run_job(victim.attack_job("pisme", config), "cpu")
    if outcome.status != "ok":
        raise RuntimeError(f"{dataset} client {partition}: {outcome.error}")
    started = time.perf_counter()
    scores = score(outcome.images, outcome.labels, victim.images, victim.labels, dataset)
    scoring = time.perf_counter() - started
    record = {
        "matched": scores["matched_recon"].float(),
        "labels": outcome.labels.long(),
        "truth": victim.images,
        "truth_labels": victim.labels,
        "psnr": float(scores["psnr"]),
        "attack_seconds": float(outcome.seconds),
        "scoring_seconds": scoring,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, path)
    return record


# ------------------------------------------------------------------------------ distances


def _ssim(recon: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """1 - SSIM exactly as the verdict ranks (``ssim_distance`` in float32; it equals piq.ssim pair by
    pair to 1e-10 in float64: tests/test_verdict.py)."""
    return ssim_distance(recon.float(), candidates.float()).double()


def _lpips_features(images: torch.Tensor) -> list[torch.Tensor]:
    """LPIPS-alex's unit-normalised features of each layer (fl_attack.evaluation.metrics.LPIPS's input handling)."""
    import lpips

    metric = get_lpips("cpu")
    x = metric._to_network_input(images.clamp(0, 1)) * 2 - 1  # normalize=True
    net = metric._net
    with torch.no_grad():
        outs = net.net.forward(net.scaling_layer(x))
    return [lpips.normalize_tensor(o) for o in outs]


def _lpips(recon: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    net = get_lpips("cpu")._net
    fr, fc = _lpips_features(recon), _lpips_features(candidates)
    rows = []
    with torch.no_grad():
        for i in range(len(recon)):
            total = 0
            for layer, (a, b) in enumerate(zip(fr, fc)):
                total = total + net.lins[layer]((a[i : i + 1] - b) ** 2).mean(dim=(1, 2, 3))
            rows.append(total)
    return torch.stack(rows).double()


DISTANCES = {"pixel L2": lambda a, b: pixel_l2(a.double(), b.double()), "1 - SSIM": _ssim, "LPIPS": _lpips}


def matched(outputs: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``outputs`` (k,C,H,W) Hungarian-matched to ``truth`` as the evaluator matches an attack."""
    order, _ = match_pairs(outputs, truth)
    return outputs[torch.as_tensor(order)]


def rank1(distances: torch.Tensor) -> float:
    """The fraction of rows whose own column (i, i) is the nearest (a tie counts for the image)."""
    k = distances.shape[0]
    own = distances[torch.arange(k), torch.arange(k)]
    return float(((distances < own[:, None]).sum(1) == 0).double().mean())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.verdict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/verdict", help="folder of distance.csv and overhead.csv")
    parser.add_argument("--cache", default="results/verdict-cache", help="the attacked victims (resumable)")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--samples", type=int, default=32, help="k")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distractors", default="250,2000", help="the values of D")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument(
        "--overhead-only", action="store_true", help="only the cost (overhead.csv); distance.csv is left as it is"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"k={args.samples}, {args.iterations} iterations, m={args.nodes}, seed {args.seed}"
    distance_rows, overhead_rows = [], []
    for dataset in args.datasets.split(","):
        pool = load_bundled(dataset)
        public = server_test_set(pool, HELD_OUT, seed=args.seed)
        d_max = max(int(d) for d in args.distractors.split(","))
        started = time.perf_counter()
        clients = DataSettings(dataset, args.samples, seed=args.seed, num_partitions=args.clients)
        verdict = Verdict.from_data(
            dataset,
            seed=args.seed,
            public=(public.images, public.labels),
            num_distractors=d_max,
            exclude_writers=run_writers(clients, pool),  # femnist: none of the attacked writers' samples
        )
        verdict._read(public.images[:1])  # load the reader once
        setup = time.perf_counter() - started
        records = [attacked(dataset, p, args) for p in range(args.clients)]
        started = time.perf_counter()
        v = Verdict(dataset, verdict.public_images, verdict.public_labels, verdict.distractors)
        v.reader, v.distractor_labels = verdict.reader, verdict.distractor_labels
        v.guesses(records[0]["labels"])  # the per-class sharp guesses: once per run
        setup += time.perf_counter() - started
        for p, rec in enumerate(records):
            started = time.perf_counter()
            row = v.score(
                rec["matched"],
                rec["labels"],
                rec["truth"],
                rec["truth_labels"],
                psnr=rec["psnr"],
                lpips=get_lpips("cpu"),
            )
            extra = time.perf_counter() - started
            overhead_rows.append(
                {
                    "dataset": dataset,
                    "client": p,
                    "config": tag,
                    "attack_seconds": round(rec["attack_seconds"], 2),
                    "scoring_seconds": round(rec["scoring_seconds"], 3),
                    "verdict_seconds": round(extra, 3),
                    "verdict_share": round(extra / rec["attack_seconds"], 4),
                    "verdict_setup_seconds": round(setup, 2),
                    "recovered": row["recovered"],
                    "recovered_low": row["recovered_low"],
                    "recovered_high": row["recovered_high"],
                    "k": row["k"],
                    "guess_recovered": row["guess_recovered"],
                    "guess_reidentified": round(row["guess_reidentified"], 3),
                    "reid_chance": round(row["reid_chance"], 4),
                    "reidentified": round(row["reidentified"], 3),
                    "psnr": round(rec["psnr"], 2),
                    "psnr_margin": round(row["psnr_margin"], 2),
                }
            )
        for d in (int(x) for x in args.distractors.split(",")) if not args.overhead_only else ():
            v = Verdict(dataset, verdict.public_images, verdict.public_labels, verdict.distractors, d)
            v.reader, v.distractor_labels = verdict.reader, verdict.distractor_labels
            for name, distance in DISTANCES.items():
                rates, chances = {}, []
                for p, rec in enumerate(records):
                    candidates = v.candidates(rec["truth"])
                    other = records[(p + 1) % len(records)]
                    outputs = {"attack": rec["matched"]}
                    for guess, images in v.guesses(rec["labels"], rec["truth"]).items():
                        outputs[guess] = matched(images, rec["truth"])
                    outputs["noise start"] = matched(v.noise(args.samples, 0), rec["truth"])
                    for what, images in outputs.items():
                        rates.setdefault(what, []).append(rank1(distance(images, candidates)))
                    # the control: the other client's reconstructions re-matched, its originals left out
                    theirs = matched(other["matched"], rec["truth"])
                    without = v.candidates(rec["truth"], exclude=other["truth"])
                    rates.setdefault("another client's, re-matched", []).append(rank1(distance(theirs, without)))
                    label_chance = v.label_chance(rec["labels"], rec["truth_labels"], rec["truth"])
                    chances.append(max(args.samples / len(candidates), label_chance))
                for what, values in rates.items():
                    distance_rows.append(
                        {
                            "dataset": dataset,
                            "config": tag,
                            "distance": name,
                            "D": d,
                            "images": what,
                            "singled_out": round(sum(values) / len(values), 4),
                            "per_client": " ".join(f"{x:.3f}" for x in values),
                            "chance": round(sum(chances) / len(chances), 5),
                            "chance_uniform": round(1 / (args.samples + d), 5),
                        }
                    )
                print(distance_rows[-len(rates) :], file=sys.stderr, flush=True)
    for name, rows in (("distance", distance_rows), ("overhead", overhead_rows)):
        if not rows:
            continue
        path = out / f"{name}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"\n{name} ({path}):")
        for row in rows:
            print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
