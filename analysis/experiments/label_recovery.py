"""Beyond the paper: label recovery when the global model has learned (issue 12, item 2).

A plain-Python FedAvg federation (no Flower): FEMNIST writers = partitions 0..N-1 of the bundled
sample, k=16, B=8, E=5, lr 0.05 (T=10 steps), all clients every round, w0 = build_model(seed 0),
the new global = the mean of the clients' wT (equal k). Each round it records the global model's
accuracy on the clients' held-out samples and, for every tracked client's update, the label-count
accuracy (fl_attack.evaluation.metrics.label_count_accuracy) of each estimator:

- paper, support, aux: fl_attack.attacker.labels.recover_counts (the attacker's view: w0, wT, metadata and,
  for aux, a public pool);
- oracle: n = k * p_bar_true + r with p_bar_true the softmax of the victim's real batches along its
  real trajectory (the evaluator's ceiling; the attacker never has it);
- paper+refine (first ``REFINE_CLIENTS`` tracked clients only): SME for ``iterations`` with
  label_refine=0.25, the opt-in re-estimate on the reconstruction (docs/attack-core.md).

The public pool of "aux" is the server's held-out pool: every sample of the writers that are NOT
in the federation (both LEAF splits), at most 50 per class, so it is disjoint from every client's
data. The study also records why the paper's estimator fails: the total-variation distance from
p_bar_true of p_bar on dummy inputs (paper) and of M n / k (aux's endpoint confusion with the true
counts), and the victim's mean softmax on its own labels along its trajectory.

Resumable: rows already in NAME.csv are kept and their (round, client, estimator) skipped (the
federation itself is retrained up to the last round: it is deterministic and cheap).
"""

from __future__ import annotations

import csv
import math
import time
from collections import OrderedDict

import numpy as np
import torch
from torch.func import functional_call

from fl_attack.attacker.api import reconstruct
from fl_attack.attacker.labels import (
    AuxiliaryData,
    endpoint_confusion,
    estimate_class_counts,
    output_bias_residual,
    recover_counts,
    round_counts,
)
from fl_attack.evaluation.metrics import label_count_accuracy
from fl_attack.federation.data import (
    client_partition,
    get_spec,
    load_pool,
    num_partitions,
    partition_writers,  # the writer of each partition, to keep aux disjoint
)
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local

from .common import Context, CsvTable, fmt, group, markdown_table, save_figure, write_markdown

DATASET = "femnist"
ESTIMATORS = ("paper", "support", "aux", "oracle")
REFINE = "paper+refine"
REFINE_CLIENTS = 3
AUX_PER_CLASS = 50
# The federation of issue 12 per scale (tiny: a smoke test with the tiny scale's k and B).
ISSUE_12 = dict(
    federation=20, rounds=15, tracked=20, refine_iterations=200, samples=16, batch_size=8, epochs=5, lr=0.05
)
PROTOCOL = {
    "paper": ISSUE_12,
    "cpu": ISSUE_12,
    "tiny": dict(ISSUE_12, federation=4, rounds=2, tracked=3, refine_iterations=3, samples=4, batch_size=2),
}
COLUMNS = [
    "round",
    "client",
    "estimator",
    "label_accuracy",
    "test_accuracy",
    "support_size",
    "pbar_tv_dummy",
    "pbar_tv_aux",
    "self_confidence",
    "seconds",
]


def _aux_pool(pool, federation: int, samples: int, seed: int = 0) -> AuxiliaryData:
    """Samples of the writers outside the federation, at most AUX_PER_CLASS per class."""
    writers = partition_writers(pool, samples)
    outside = ~np.isin(pool.writers, writers[:federation])
    rng = np.random.default_rng(seed)
    idx = []
    for c in range(get_spec(DATASET).num_classes):
        members = np.flatnonzero(outside & (pool.labels == c))
        idx.append(rng.choice(members, size=min(AUX_PER_CLASS, members.size), replace=False))
    idx = np.sort(np.concatenate(idx))
    images = torch.from_numpy(pool.images[idx][:, None].astype(np.float32) / 255.0)
    return AuxiliaryData(images, torch.from_numpy(pool.labels[idx].astype(np.int64)))


def _trajectory_softmax(model, result, images) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per local step: the victim's softmax (B, C) on its real batch at the weights before that step,
    and the batch's indices (B,)."""
    x = get_spec(DATASET).normalize(images)
    with torch.no_grad():
        return [
            (torch.softmax(functional_call(model, w, (x[b],)), dim=1), b)
            for w, b in zip(result.states[:-1], result.batches)
        ]


def _accuracy(counts, truth) -> float:
    return label_count_accuracy(np.repeat(np.arange(len(counts)), counts), truth, len(counts))


def _load_rows(path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for row in rows:  # back to numbers, as the rows of this run are
        for key, value in row.items():
            if key != "estimator":
                row[key] = int(value) if key in ("round", "client", "support_size") else float(value or "nan")
    return rows


def run(ctx: Context) -> None:
    proto = PROTOCOL[ctx.scale.name]
    federation, rounds, k, batch, epochs, lr = (
        proto[key] for key in ("federation", "rounds", "samples", "batch_size", "epochs", "lr")
    )
    tracked = min(ctx.scale.clients, federation) if "clients" in ctx.explicit else proto["tracked"]
    iterations = ctx.scale.iterations if "iterations" in ctx.explicit else proto["refine_iterations"]
    pool = load_pool(DATASET, ctx.data_dir)
    if num_partitions(pool, k) < federation:
        raise ValueError(f"{federation} {DATASET} writers of k={k} needed, the data has {num_partitions(pool, k)}")
    path = ctx.out / f"{ctx.name}.csv"
    old = _load_rows(path)
    done = {(int(r["round"]), int(r["client"]), r["estimator"]) for r in old}
    recorder = CsvTable(path, COLUMNS)
    for row in old:
        recorder.add(row)
    splits = [client_partition(pool, p, k) for p in range(federation)]
    aux = _aux_pool(pool, federation, k)
    spec = get_spec(DATASET)
    test_x = spec.normalize(torch.cat([s.test.images for s in splits]))
    test_y = torch.cat([s.test.labels for s in splits])
    model = build_model(DATASET, seed=0)
    global_w = OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items())
    ctx.log(
        f"{federation} clients, {rounds} rounds, k={k}, B={batch}, E={epochs}, lr={lr}; "
        f"{tracked} tracked; aux pool {len(aux.labels)} images of writers outside the federation"
    )
    for rnd in range(1, rounds + 1):
        with torch.no_grad():
            test_acc = float((functional_call(model, global_w, (test_x,)).argmax(1) == test_y).float().mean())
        client_w = []
        for p, split in enumerate(splits):
            model.load_state_dict(global_w)
            record = p < tracked
            result = train_local(
                model,
                split.train.images,
                split.train.labels,
                dataset=DATASET,
                lr=lr,
                batch_size=batch,
                local_epochs=epochs,
                seed=1000 * rnd + p,
                record_states=record,
                client={"partition_id": p},
            )
            client_w.append(result.update.wT)
            if record:
                _score_client(ctx, recorder, done, rnd, p, result, split, aux, test_acc, iterations)
        global_w = OrderedDict((k, torch.stack([w[k] for w in client_w]).mean(0)) for k in global_w)
        rows = [r for r in recorder.rows if int(r["round"]) == rnd]
        ctx.log(
            f"round {rnd}: test accuracy {test_acc:.3f}; label accuracy "
            + ", ".join(
                f"{e} {np.mean([float(r['label_accuracy']) for r in rs]):.3f}"
                for (e,), rs in group(rows, "estimator").items()
            )
        )
    _report(ctx, recorder.rows, proto, tracked, iterations)


def _score_client(ctx, recorder, done, rnd, p, result, split, aux, test_acc, iterations) -> None:
    update, truth = result.update, split.train.labels
    k = update.metadata.num_samples
    base = dict(round=rnd, client=p, test_accuracy=test_acc, support_size=int((truth.bincount(minlength=62) > 0).sum()))
    todo = [e for e in ESTIMATORS if (rnd, p, e) not in done]
    if p < REFINE_CLIENTS and (rnd, p, REFINE) not in done:
        todo.append(REFINE)
    if not todo:
        return
    model = build_model(DATASET)
    steps = _trajectory_softmax(model, result, split.train.images)
    p_true = torch.cat([probs for probs, _ in steps]).double().mean(0)  # (C,) along the real trajectory
    residual = output_bias_residual(update)
    n_true = np.bincount(truth.numpy(), minlength=len(residual)).astype(np.float64)
    p_dummy = (estimate_class_counts(update, model) - residual) / k
    p_aux = endpoint_confusion(update, aux, model) @ n_true / k
    diag = dict(
        pbar_tv_dummy=0.5 * float(np.abs(p_dummy - p_true.numpy()).sum()),
        pbar_tv_aux=0.5 * float(np.abs(p_aux - p_true.numpy()).sum()),
    )
    own = [probs[torch.arange(len(b)), truth[b]] for probs, b in steps]
    diag["self_confidence"] = float(torch.cat(own).mean())
    for estimator in todo:
        start = time.perf_counter()
        if estimator == "oracle":
            counts = round_counts(k * p_true.numpy() + residual, k)
        elif estimator == REFINE:
            rec = reconstruct(update, "sme", iterations=iterations, label_refine=0.25, device="cpu", seed=0)
            counts = np.bincount(rec.labels.numpy(), minlength=len(residual))
        else:
            counts = recover_counts(update, estimator, aux=aux)
        recorder.add(
            {
                **base,
                **diag,
                "estimator": estimator,
                "label_accuracy": _accuracy(counts, truth),
                "seconds": time.perf_counter() - start,
            }
        )


def _report(ctx, rows, proto, tracked, iterations) -> None:
    federation, rounds = proto["federation"], proto["rounds"]
    names = [e for e in (*ESTIMATORS, REFINE) if any(r["estimator"] == e for r in rows)]
    by = group(rows, "round", "estimator")
    table, curves = [], {e: [] for e in names}
    for rnd in range(1, rounds + 1):
        cells = []
        for e in names:
            vals = [float(r["label_accuracy"]) for r in by.get((rnd, e), [])]
            curves[e].append(np.mean(vals) if vals else math.nan)
            cells.append(f"{fmt(np.mean(vals) if vals else None)} ({len(vals)})")
        first = by.get((rnd, names[0]), [{}])[0]
        diag = by.get((rnd, "paper"), [])
        tv = lambda key, diag=diag: fmt(np.mean([float(r[key]) for r in diag])) if diag else "-"  # noqa: E731
        table.append(
            [
                rnd,
                fmt(float(first.get("test_accuracy", math.nan))),
                *cells,
                tv("pbar_tv_dummy"),
                tv("pbar_tv_aux"),
                tv("self_confidence"),
            ]
        )
    table.append([f"mean 1-{rounds}", "", *[fmt(float(np.nanmean(curves[e]))) for e in names], "", "", ""])
    header = [
        "round",
        "test acc.",
        *[f"{e} (n)" for e in names],
        "TV(p_bar dummy, true)",
        "TV(M n/k aux, true)",
        "own-label softmax",
    ]
    body = markdown_table(header, table)
    k, batch, epochs = proto["samples"], proto["batch_size"], proto["epochs"]
    caption = (
        f"Scale `{ctx.scale.name}`; FedAvg over {federation} FEMNIST writers (plain Python, no Flower), "
        f"k={k}, B={batch}, E={epochs}, lr={proto['lr']} (T={epochs * math.ceil(k / batch)}), {rounds} rounds, "
        f"1 seed(s); label-count accuracy per estimator, mean over {tracked} tracked client(s) (n in brackets; "
        f"{REFINE}: {min(REFINE_CLIENTS, tracked)} clients, SME {iterations} iterations)"
    )
    notes = [
        "test acc.: the global model sent in that round (w0), on the clients' held-out samples.",
        "TV columns: total-variation distance to the true p_bar (the victim's softmax on its real batches "
        "along its real trajectory), of the paper's p_bar on dummy inputs and of aux's endpoint model M n/k "
        "with the true counts; own-label softmax: the victim's mean p(y_i) along that trajectory.",
    ]
    write_markdown(
        ctx,
        "Label recovery in a learning federation",
        caption,
        body,
        notes,
        scale_note="the federation of issue 12 at every scale but tiny (4 clients, 2 rounds).",
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = np.arange(1, rounds + 1)
    for e in names:
        ax.plot(xs, curves[e], marker="o", ms=3, label=e)
    ax.set_xlabel("round")
    ax.set_ylabel("label-count accuracy")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, ctx.out / f"{ctx.name}.png")
