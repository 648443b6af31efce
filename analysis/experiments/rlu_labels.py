"""RLU against the other label estimators (issue 50, item 3; docs/label-recovery.md, "RLU").

    PYTHONPATH=. OMP_NUM_THREADS=1 python -m analysis.experiments.rlu_labels [--out DIR] [--table]

One process, CPU, a few minutes. Every update is scored by each of ``ESTIMATORS`` (prior: the
update-free null, the public pool's class frequencies scaled to k; paper, support, aux, rlu:
``fl_attack.attacker.labels.recover_counts``) with instance accuracy sum_c min(n_hat_c, n_c) / k and
class accuracy (the share of the C classes whose presence is right, as RLU's code scores it).

Settings (each a few configurations; all seeds fixed):

- ``federation``: the learning federation of docs/label-recovery.md (``label_recovery.ISSUE_12``: 20
  FEMNIST writers, k=16, B=8, E=5, lr 0.05, plain SGD, w0 = build_model(seed 0), 15 rounds), replayed
  deterministically (its updates were never stored); rounds ``ROUNDS``, its first ``FED_CLIENTS``
  clients. Public pool: its own (writers outside the federation, at most 50 a class).
- ``femnist``: momentum 0.9 (lr 0.05) and Adam (lr 1e-3) clients, the federation's first
  ``OPT_CLIENTS`` writers (k=16, B=8, E=5), from w0 = the untrained model and from the federation's
  global model of round ``LEARNED_ROUND``; the same public pool.
- ``cifar100``: momentum 0.9 (lr ``CIFAR_MOMENTUM_LR``) and Adam (lr 1e-3) clients, partitions of the
  bundled sample with the server's 1,000 images held out (k=32, B=8, E=3, T=12), from w0 = the untrained
  model and from a model pretrained on half the server's images; the public pool is the other half.

Writes DIR/rlu_labels.csv (one row per update and estimator) and DIR/rlu_labels.md (the table, from
the CSV). ``--table`` only rewrites the table from an existing CSV.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from fl_attack.attacker.labels import AuxiliaryData, recover_counts, round_counts
from fl_attack.evaluation.metrics import label_count_accuracy
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.data import client_partition, load_pool, server_test_set
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local

from .common import fmt, group, markdown_table
from .label_recovery import ISSUE_12, _aux_pool

ESTIMATORS = ("prior", "paper", "support", "aux", "rlu")
ROUNDS = (1, 8, 15)
FED_CLIENTS = 8
LEARNED_ROUND = 10
OPT_CLIENTS = 5
CIFAR_CLIENTS = 3
CIFAR_K, CIFAR_B, CIFAR_E, CIFAR_HELD_OUT = 32, 8, 3, 1000
CIFAR_MOMENTUM_LR = 0.01
OPTIMIZERS = {
    "momentum": (ClientOptimizer("momentum", momentum=0.9), 0.05),
    "adam": (ClientOptimizer("adam"), 1e-3),
}
COLUMNS = [
    "setting",
    "dataset",
    "optimizer",
    "w0",
    "round",
    "client",
    "k",
    "local_steps",
    "estimator",
    "instance_accuracy",
    "class_accuracy",
    "seconds",
]
NAME = "rlu_labels"


def _score(rows, base: dict, update, truth: torch.Tensor, aux: AuxiliaryData, num_classes: int) -> None:
    """One row per estimator for this update (``rows`` is appended to)."""
    k = update.metadata.num_samples
    true = np.bincount(truth.numpy(), minlength=num_classes)
    for estimator in ESTIMATORS:
        start = time.perf_counter()
        if estimator == "prior":
            counts = round_counts(np.bincount(aux.labels.numpy(), minlength=num_classes), k)
        else:
            counts = recover_counts(update, estimator, aux=aux)
        seconds = time.perf_counter() - start
        rows.append(
            {
                **base,
                "k": k,
                "local_steps": update.metadata.local_steps,
                "estimator": estimator,
                "instance_accuracy": label_count_accuracy(
                    np.repeat(np.arange(num_classes), counts), truth, num_classes
                ),
                "class_accuracy": float(np.mean((counts > 0) == (true > 0))),
                "seconds": seconds,
            }
        )


def _femnist(rows, log) -> None:
    """The learning federation's rounds, then momentum and Adam clients from its w0s."""
    proto = ISSUE_12
    federation, k, batch, epochs, lr = (proto[key] for key in ("federation", "samples", "batch_size", "epochs", "lr"))
    pool = load_pool("femnist")
    splits = [client_partition(pool, p, k) for p in range(federation)]
    aux = _aux_pool(pool, federation, k)
    model = build_model("femnist", seed=0)
    global_w = OrderedDict((n, v.detach().clone()) for n, v in model.state_dict().items())
    start_points = {"untrained": OrderedDict((n, v.clone()) for n, v in global_w.items())}
    for rnd in range(1, max(max(ROUNDS), LEARNED_ROUND) + 1):
        if rnd == LEARNED_ROUND:
            start_points[f"round {rnd}"] = OrderedDict((n, v.clone()) for n, v in global_w.items())
        client_w = []
        for p, split in enumerate(splits):
            model.load_state_dict(global_w)
            result = train_local(
                model,
                split.train.images,
                split.train.labels,
                dataset="femnist",
                lr=lr,
                batch_size=batch,
                local_epochs=epochs,
                seed=1000 * rnd + p,  # label_recovery's federation, exactly
            )
            client_w.append(result.update.wT)
            if rnd in ROUNDS and p < FED_CLIENTS:
                base = dict(setting="federation", dataset="femnist", optimizer="sgd", w0=f"round {rnd}", round=rnd)
                _score(rows, {**base, "client": p}, result.update, split.train.labels, aux, 62)
        global_w = OrderedDict((n, torch.stack([w[n] for w in client_w]).mean(0)) for n in global_w)
        if rnd in ROUNDS:
            log(f"federation round {rnd} scored")
    for name, (opt, opt_lr) in OPTIMIZERS.items():
        for w0_name, w0 in start_points.items():
            for p in range(OPT_CLIENTS):
                model.load_state_dict(w0)
                result = train_local(
                    model,
                    splits[p].train.images,
                    splits[p].train.labels,
                    dataset="femnist",
                    lr=opt_lr,
                    batch_size=batch,
                    local_epochs=epochs,
                    seed=7 + p,
                    optimizer=opt,
                )
                base = dict(setting="optimizers", dataset="femnist", optimizer=name, w0=w0_name, round=0, client=p)
                _score(rows, base, result.update, splits[p].train.labels, aux, 62)
            log(f"femnist {name} from {w0_name} scored")


def _cifar(rows, log) -> None:
    """Momentum and Adam CIFAR-100 clients, from an untrained and from a pretrained w0."""
    pool = load_pool("cifar100")
    server = server_test_set(pool, CIFAR_HELD_OUT, seed=0)
    order = np.random.default_rng(0).permutation(len(server.labels))
    half = len(order) // 2
    aux = AuxiliaryData(server.images[order[:half]], server.labels[order[:half]])
    pre = order[half:]
    model = build_model("cifar100", seed=0)
    untrained = OrderedDict((n, v.clone()) for n, v in model.state_dict().items())
    train_local(
        model,
        server.images[pre],
        server.labels[pre],
        dataset="cifar100",
        lr=0.05,
        batch_size=32,
        local_epochs=10,
        seed=0,
    )
    start_points = {
        "untrained": untrained,
        "pretrained": OrderedDict((n, v.clone()) for n, v in model.state_dict().items()),
    }
    log("cifar100 w0 pretrained")
    splits = [client_partition(pool, p, CIFAR_K, held_out=CIFAR_HELD_OUT) for p in range(CIFAR_CLIENTS)]
    for name, (opt, opt_lr) in OPTIMIZERS.items():
        opt_lr = CIFAR_MOMENTUM_LR if name == "momentum" else opt_lr
        for w0_name, w0 in start_points.items():
            for p, split in enumerate(splits):
                model.load_state_dict(w0)
                result = train_local(
                    model,
                    split.train.images,
                    split.train.labels,
                    dataset="cifar100",
                    lr=opt_lr,
                    batch_size=CIFAR_B,
                    local_epochs=CIFAR_E,
                    seed=7 + p,
                    optimizer=opt,
                )
                base = dict(setting="optimizers", dataset="cifar100", optimizer=name, w0=w0_name, round=0, client=p)
                _score(rows, base, result.update, split.train.labels, aux, 100)
            log(f"cifar100 {name} from {w0_name} scored")


def table(rows: list[dict]) -> str:
    """The markdown table: per (dataset, optimizer, w0), each estimator's mean instance accuracy with its
    class accuracy in brackets (the row's best in bold), and on how many updates rlu is above / below the
    best of the other update-based estimators."""
    names = [e for e in ESTIMATORS if any(r["estimator"] == e for r in rows)]
    body = []
    for (setting, dataset, optimizer, w0), cell in group(rows, "setting", "dataset", "optimizer", "w0").items():
        by = group(cell, "estimator")
        updates = len(by[(names[0],)])
        means = {e: np.mean([float(r["instance_accuracy"]) for r in by[(e,)]]) for e in names}
        classes = {e: np.mean([float(r["class_accuracy"]) for r in by[(e,)]]) for e in names}
        top = max(means[e] for e in names if e != "prior")  # bold: the best estimator(s) of the row
        per_update = group(cell, "client")
        wins = losses = 0
        for items in per_update.values():
            acc = {r["estimator"]: float(r["instance_accuracy"]) for r in items}
            other = max(v for e, v in acc.items() if e not in ("rlu", "prior"))
            wins += acc["rlu"] > other + 1e-9
            losses += acc["rlu"] < other - 1e-9
        where = f"{setting}: {dataset}, {optimizer}, w0 {w0}"
        body.append(
            [
                where,
                updates,
                *[
                    f"**{fmt(means[e])}** ({fmt(classes[e])})"
                    if e != "prior" and fmt(means[e]) == fmt(top)
                    else f"{fmt(means[e])} ({fmt(classes[e])})"
                    for e in names
                ],
                f"{wins} / {losses}",
            ]
        )
    for label, keep in (
        ("mean, federation", lambda r: r["setting"] == "federation"),
        ("mean, momentum", lambda r: r["optimizer"] == "momentum"),
        ("mean, Adam", lambda r: r["optimizer"] == "adam"),
    ):
        sub = [r for r in rows if keep(r)]
        body.append(
            [
                label,
                len(sub) // len(names),
                *[fmt(np.mean([float(r["instance_accuracy"]) for r in sub if r["estimator"] == e])) for e in names],
                "",
            ]
        )
    header = ["updates", "n", *names, "rlu above / below the best of paper, support, aux (updates)"]

    def median_seconds(dataset, estimator):
        return float(
            np.median([float(r["seconds"]) for r in rows if (r["estimator"], r["dataset"]) == (estimator, dataset)])
        )

    cost = "; ".join(
        f"{d}: " + ", ".join(f"{e} {fmt(median_seconds(d, e))}" for e in names if e != "prior")
        for d in ("femnist", "cifar100")
    )
    return markdown_table(header, body) + f"\n\nMedian seconds per update, {cost}."


def _read(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/label-recovery-rlu")
    parser.add_argument("--table", action="store_true", help="only rewrite the table from DIR/rlu_labels.csv")
    args = parser.parse_args(argv)
    out = Path(args.out)
    path = out / f"{NAME}.csv"
    if not args.table:
        out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        start = time.perf_counter()
        rows: list[dict] = []

        def log(msg):
            print(f"[{time.perf_counter() - start:7.1f} s] {msg}", flush=True)

        _femnist(rows, log)
        _cifar(rows, log)
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        log(f"wrote {path} ({len(rows)} rows); wall time {math.ceil(time.perf_counter() - start)} s")
    text = table(_read(path))
    (out / f"{NAME}.md").write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
