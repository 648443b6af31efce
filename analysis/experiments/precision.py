"""Beyond the paper: what lowering the attacks' arithmetic costs in fidelity, per method.

Each victim (FEMNIST writers and CIFAR-100 clients, the scale's protocol at the paper's T = 100) is
attacked by IG, SME, NL-SME and PI-SME on the same update, from the same X_hat, once in fp32 and
once in each lowered precision of the grid's ``precision`` axis (default bf16; tf32 on a CUDA
device; ``fl_attack.attacker.precision``). Labels are recovered from the update, in float32 in every arm, and
every score is float32: PSNR, SSIM and LPIPS on Hungarian-matched pairs and the honest
Lsim(G, delta_w) of the final X_hat. The table gives each precision's means and the paired
difference lowered - fp32 over the victims (client, seed): the fidelity side of issue 26, the speed
side being ``python -m benchmarks.attack_step --precisions fp32,bf16`` (docs/performance.md,
"Mixed precision"). The issue's protocol: ``--scale paper --clients 3`` (k=50, T=100, m=7; 1000
iterations, or ``--iterations 300``) on a device with native bf16.

``--grid dataset=femnist --grid precision=bf16,tf32`` chooses the cells; a rerun resumes.
"""

from __future__ import annotations

from fl_attack.attacker.precision import resolve_precision

from .common import (
    ATTACK_ROW_COLUMNS,
    Context,
    Task,
    column,
    figure,
    fmt,
    group,
    markdown_table,
    mean,
    mean_var,
    paired_differences,
    pm,
    recorded_clients,
    run_tasks,
    save_figure,
    spread,
    victims,
    write_markdown,
)
from .table1 import LABELS, METHODS

DATASETS = ("femnist", "cifar100")
LOWERED = ("bf16",)  # the arms compared with fp32 by default (tf32 needs CUDA: --grid precision=bf16,tf32)
PAPER_T = 100
COLUMNS = ["dataset", "paper_T", "precision", *ATTACK_ROW_COLUMNS]
GRID = ("dataset", "precision")
KEY = ("dataset", "partition_id", "seed", "method", "precision")


def run(ctx: Context) -> None:
    datasets, lowered = ctx.axis("dataset", DATASETS), ctx.axis("precision", LOWERED)
    for arm in lowered:
        resolve_precision(arm, ctx.device)  # tf32 off CUDA: ValueError before any work
    tasks = []
    for client, seed, dataset, paper_T, victim in victims(ctx, datasets, (PAPER_T,)):
        for method in METHODS:
            for arm in ("fp32", *lowered):
                key = dict(dataset=dataset, partition_id=client, seed=seed, method=method, precision=arm)
                extra = {"dataset": dataset, "paper_T": paper_T, "precision": arm}
                tasks.append(Task(key, victim, method, "recovered", {"precision": arm}, extra))
    _report(ctx, run_tasks(ctx, COLUMNS, KEY, tasks))


def _report(ctx: Context, rows: list[dict]) -> None:
    sc = ctx.scale
    arms = [a for a in ("bf16", "tf32") if any(r["precision"] == a for r in rows)]
    header = [
        "dataset",
        "T",
        "method",
        "precision",
        "PSNR (mean ± var)",
        "PSNR - fp32 (dB)",
        "spread",
        "SSIM",
        "LPIPS",
        "honest Lsim",
        "s/iter",
        "n",
    ]
    lines = []
    for (dataset, T, method), cell in group(rows, "dataset", "local_steps", "method").items():
        for arm in ("fp32", *arms):
            mine = [r for r in cell if r["precision"] == arm]
            if not mine:
                continue
            diff = paired_differences(cell, arm, "fp32", "psnr", key="precision") if arm != "fp32" else []
            lines.append(
                [
                    dataset,
                    T,
                    LABELS.get(method, method),
                    arm,
                    pm(column(mine, "psnr")),
                    fmt(mean_var(diff)[0]) if diff else "-",
                    spread(diff) if diff else "-",
                    fmt(mean(mine, "ssim"), 3),
                    fmt(mean(mine, "lpips"), 3),
                    fmt(mean(mine, "lsim_honest"), 4),
                    fmt(mean(mine, "seconds_per_iteration"), 3),
                    len(mine),
                ]
            )
    clients = recorded_clients(rows)
    caption = "Mixed precision: each lowered precision against fp32 on the same updates. " + sc.caption(
        "FEMNIST and CIFAR-100 (bundled real samples)",
        clients=clients,
        epochs=((PAPER_T, sc.local_epochs(PAPER_T)),),
        extra="labels recovered in float32; every score in float32; the same X_hat initialisation in every arm",
    )
    notes = [
        "PSNR - fp32: the mean over victims (client, seed) of the PSNR difference on the same update and "
        "method; spread: its min .. max.",
        "s/iter: this machine's seconds per iteration; a CPU without native bf16 emulates it (slower than fp32), "
        "so speed is read from benchmarks/attack_step.py on the hardware in question, not from this table.",
    ]
    write_markdown(
        ctx, "Mixed precision: the fidelity of bf16 and TF32 attacks", caption, markdown_table(header, lines), notes
    )
    _plot(ctx, rows, arms)


def _plot(ctx: Context, rows: list[dict], arms: list[str]) -> None:
    cells = group(rows, "dataset")
    fig = figure(4.2 * max(1, len(cells)), 3.4)
    for i, ((dataset,), cell) in enumerate(cells.items()):
        ax = fig.add_subplot(1, len(cells), i + 1)
        methods = [m for m in METHODS if any(r["method"] == m for r in cell)]
        width = 0.8 / max(1, len(arms))
        for j, arm in enumerate(arms):
            for k, method in enumerate(methods):
                diff = paired_differences(
                    [r for r in cell if r["method"] == method], arm, "fp32", "psnr", key="precision"
                )
                x = k + (j - (len(arms) - 1) / 2) * width
                height = mean_var(diff)[0] if diff else 0
                ax.bar(x, height, width, color=f"C{j}", alpha=0.35, label=arm if k == 0 else None)
                ax.scatter([x] * len(diff), diff, color=f"C{j}", s=12)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(methods)), [LABELS[m] for m in methods], fontsize=8)
        ax.set_ylabel("PSNR - fp32 (dB)")
        ax.set_title(f"{dataset}, T={cell[0]['local_steps']}", fontsize=9)
        if arms:
            ax.legend(fontsize=7)
    fig.suptitle("Lowered precision against fp32, per victim (dots) and mean (bars)", fontsize=9)
    save_figure(fig, ctx.out / f"{ctx.name}.png")
