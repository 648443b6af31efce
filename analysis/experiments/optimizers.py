"""Beyond the paper: clients that train as Flower apps do, and what knowing the optimizer is worth.

Each victim trains its k private images with one of the ``REGIMES`` (plain SGD, the paper's; heavy
ball and Nesterov momentum 0.9, as Flower's quickstart-pytorch; weight decay 5e-4; Adam and AdamW).
The optimizer is public metadata in the update (the server prescribes it), so PI-SME weights each
path node's gradient by the optimizer's step weight and adds the known weight-decay term
(``AttackConfig.optimizer_aware``, docs/PISME.md "Optimizers"). The naive arm is the same attack on
the same update with ``optimizer_aware=False`` (plain-SGD model of the update). Plain SGD is run
with the aware arm only: the two are identical there, bit for bit (tests/test_optimizers.py).

``--grid regime=momentum,adam --grid local_steps=10,100`` chooses the cells; T = E * ceil(k/B).
"""

from __future__ import annotations

from functools import partial

from .common import (
    ATTACK_ROW_COLUMNS,
    REGIMES,
    Context,
    Lazy,
    Task,
    check_clients,
    column,
    figure,
    fmt,
    group,
    markdown_table,
    mean,
    mean_var,
    paired_differences,
    pm,
    run_tasks,
    save_figure,
    spread,
    train_victim,
    write_markdown,
)

# name: (the clients' optimizer, its learning rate). SGD-family at the paper's lr; Adam at torch's default.
LOCAL_STEPS = (10, 100)
COLUMNS = ["regime", "optimizer", "client_lr", "optimizer_aware", *ATTACK_ROW_COLUMNS]
GRID = ("regime", "local_steps")
KEY = ("regime", "local_steps", "partition_id", "seed", "method", "optimizer_aware")


def run(ctx: Context) -> None:
    sc = ctx.scale
    regimes, steps = ctx.axis("regime", tuple(REGIMES)), ctx.axis("local_steps", LOCAL_STEPS)
    per_epoch = -(-sc.samples // sc.batch_size)
    for T in steps:
        if T % per_epoch:
            raise ValueError(f"local_steps {T} is not a multiple of ceil(k/B) = {per_epoch} at this scale")
    clients = sc.clients_for("femnist")
    check_clients(ctx, "femnist", clients, sc.samples)
    tasks = []
    for client in range(clients):  # client-major: a stopped run has whole clients done
        for seed in range(sc.seeds):
            for T in steps:
                for regime in regimes:
                    optimizer, lr = REGIMES[regime]
                    victim = Lazy(
                        partial(train_victim, ctx, "femnist", client, seed, T // per_epoch, lr=lr, optimizer=optimizer)
                    )
                    for aware in (True,) if optimizer.plain else (True, False):
                        key = dict(regime=regime, local_steps=T, partition_id=client, seed=seed, method="pisme")
                        key["optimizer_aware"] = aware
                        extra = {"regime": regime, "optimizer": optimizer.describe(), "client_lr": lr or sc.lr}
                        extra["optimizer_aware"] = aware
                        tasks.append(Task(key, victim, "pisme", "recovered", {"optimizer_aware": aware}, extra))
    _report(ctx, run_tasks(ctx, COLUMNS, KEY, tasks))


def _aware_minus_naive(cell: list[dict], metric: str) -> list[float]:
    return paired_differences([{**r, "aware": _is_aware(r)} for r in cell], True, False, metric, key="aware")


def _is_aware(row: dict) -> bool:
    return str(row["optimizer_aware"]) in ("True", "true", "1")


def _report(ctx: Context, rows: list[dict]) -> None:
    sc = ctx.scale
    header = [
        "regime",
        "client optimizer",
        "lr",
        "T",
        "PSNR aware (mean ± var)",
        "PSNR naive",
        "aware - naive (dB)",
        "spread",
        "aware wins",
        "SSIM aware / naive",
        "honest Lsim aware / naive",
        "n",
    ]
    lines = []
    for (regime, T), cell in group(rows, "regime", "local_steps").items():
        aware, naive = [r for r in cell if _is_aware(r)], [r for r in cell if not _is_aware(r)]
        diff = _aware_minus_naive(cell, "psnr")
        wins = f"{sum(d > 0 for d in diff)}/{len(diff)}" if diff else "-"

        def both(metric, digits, aware=aware, naive=naive):
            a = fmt(mean(aware, metric), digits)
            return f"{a} / {fmt(mean(naive, metric), digits)}" if naive else a

        lines.append(
            [
                regime,
                cell[0]["optimizer"],
                cell[0]["client_lr"],
                T,
                pm(column(aware, "psnr")),
                pm(column(naive, "psnr")) if naive else "= aware",
                fmt(mean_var(diff)[0]) if diff else "-",
                spread(diff),
                wins,
                both("ssim", 3),
                both("lsim_honest", 4),
                len(aware),
            ]
        )
    per_epoch = -(-sc.samples // sc.batch_size)
    epochs = sorted({(None, int(r["local_steps"]) // per_epoch) for r in rows})
    caption = "Client optimizers: optimizer-aware against naive PI-SME on the same updates. " + sc.caption(
        "femnist",
        clients=f"{len({r['partition_id'] for r in rows})} femnist client(s)",
        epochs=epochs,
        extra="lr: the SGD family at the scale's, Adam and AdamW at 1e-3 (the lr column); recovered labels",
    )
    notes = [
        "aware - naive: the mean over victims (client, seed) of the PSNR difference on the same update; "
        "spread: its min .. max; aware wins: victims where the aware attack scores the higher PSNR.",
        "Plain SGD has one arm: every optimizer-aware term is 1 or 0 there, the attacks are the same bit for bit.",
        "Adam and AdamW have uniform step weights (docs/PISME.md, Optimizers), so their aware arm is the naive "
        "one (AdamW's decoupled decay is not modelled): differences there come from torch threads only.",
    ]
    write_markdown(
        ctx,
        "Client optimizers: what knowing the optimizer is worth",
        caption,
        markdown_table(header, lines),
        notes,
        scale_note=f"k={sc.samples}, B={sc.batch_size}, {sc.iterations} attack iterations, m={sc.nodes}, FEMNIST "
        "only, at the T of each row (E = T / ceil(k/B)); --clients and --seeds set the victims.",
        rows=rows,
    )

    fig = figure(8, 3.4)
    ax = fig.add_subplot(1, 1, 1)
    cells = [(k, c) for k, c in group(rows, "regime", "local_steps").items() if _aware_minus_naive(c, "psnr")]
    for i, (_, cell) in enumerate(cells):
        diff = _aware_minus_naive(cell, "psnr")
        ax.scatter([i] * len(diff), diff, color="tab:blue", s=14)
        ax.bar(i, mean_var(diff)[0], color="tab:blue", alpha=0.3)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cells)), [f"{r}\nT={T}" for (r, T), _ in cells], fontsize=8)
    ax.set_ylabel("PSNR aware - naive (dB)")
    ax.set_title("Optimizer-aware PI-SME against naive, per victim (dots) and mean (bars)", fontsize=9)
    save_figure(fig, ctx.out / f"{ctx.name}.png")
