"""Table 1 of the PI-SME paper: IG, GI-NAS, DGGI, SME, NL-SME and PI-SME on CIFAR-100 and FEMNIST at
T=100 and 250, and beside them Dimitrov et al.'s FedAvg attack (``dimitrov``, TMLR 2022; not in the paper's
table, which has no number for it).

Every attack gets only the observed update (w0, wT, public metadata), recovers the labels from it
and runs the scale's iterations (paper: 1000, m=7). GI-NAS and DGGI, the paper's prior-enhanced
single-step baselines, run on the multi-step update as is (``fl_attack.attacker.attacks.ginas``, ``dggi``; DGGI's
diffusion prior is the server's, trained on its public pool, ``fl_attack.attacker.diffusion``). Scores are on
Hungarian-matched pairs; the table gives PSNR as mean ± sample variance over (client, seed) attacks,
the means of SSIM, FSIM, LPIPS and the honest Lsim(G, delta_w), and the paper's number beside ours.
Resumable: a rerun skips the (dataset, T, client, seed, method) rows NAME.csv already holds, and a
stopped run has whole clients done in every cell (client-major order).
"""

from __future__ import annotations

import math

import numpy as np

from analysis.paper_values import PAPER_OTHER, PAPER_PSNR

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
    pm,
    run_tasks,
    save_figure,
    victims,
    write_markdown,
)

DATASETS = ("femnist", "cifar100")
METHODS = ("ig", "ginas", "dggi", "sme", "nlsme", "pisme", "dimitrov")  # the paper's row order, then dimitrov
SINGLE_STEP = ("ig", "ginas", "dggi")  # designed for one gradient (GI-NAS, DGGI: with an image prior)
SURROGATE = ("sme", "nlsme", "pisme")  # the surrogate line
LABELS = {
    "ig": "IG",
    "ginas": "GI-NAS",
    "dggi": "DGGI",
    "sme": "SME",
    "nlsme": "NL-SME",
    "pisme": "PI-SME",
    "pisme-adaptive": "PI-SME adaptive",
    "dimitrov": "Dimitrov et al.",
}
COLUMNS = ["dataset", "paper_T", *ATTACK_ROW_COLUMNS, "paper_psnr"]
GRID = ("dataset", "paper_T")  # the axes --grid may set
KEY = ("dataset", "paper_T", "partition_id", "seed", "method")  # what a rerun skips


def paper_psnr(dataset: str, paper_T: int, method: str) -> float:
    """The paper's Table 1 PSNR (dB) of a cell; NaN where the paper has none (FEMNIST GI-NAS, DGGI)."""
    return PAPER_PSNR[(dataset, paper_T)].get(method, math.nan)


def run(ctx: Context) -> None:
    datasets, steps = ctx.axis("dataset", DATASETS), ctx.axis("paper_T", tuple(t for t, _ in ctx.scale.epochs))
    tasks = []
    for client, seed, dataset, paper_T, victim in victims(ctx, datasets, steps):
        for method in METHODS:
            key = dict(dataset=dataset, paper_T=paper_T, partition_id=client, seed=seed, method=method)
            extra = {"paper_T": paper_T, "paper_psnr": paper_psnr(dataset, paper_T, method)}
            tasks.append(Task(key, victim, method, "recovered", {}, extra))
    _report(ctx, run_tasks(ctx, COLUMNS, KEY, tasks))


def _report(ctx: Context, rows: list[dict]) -> None:
    sc = ctx.scale
    # Each cell's methods in the paper's row order, whichever invocation recorded them (dimitrov came later).
    order = {d: i for i, d in enumerate(DATASETS)}
    rows = sorted(
        rows, key=lambda r: (order.get(r["dataset"], len(order)), int(r["paper_T"]), METHODS.index(r["method"]))
    )
    header = [
        "dataset",
        "T",
        "method",
        "PSNR ours (mean ± var)",
        "PSNR paper",
        "SSIM",
        "FSIM",
        "LPIPS",
        "honest Lsim",
        "label acc.",
        "n",
        "s/iter",
    ]
    lines, margins = [], []
    for (dataset, paper_T, T, method), cell in group(rows, "dataset", "paper_T", "local_steps", "method").items():
        other = PAPER_OTHER.get((dataset, paper_T, method), {})
        ssim = fmt(mean(cell, "ssim"), 3) + (f" (paper {other['ssim']})" if "ssim" in other else "")
        lpips = fmt(mean(cell, "lpips"), 3) + (f" (paper {other['lpips']})" if "lpips" in other else "")
        lines.append(
            [
                dataset,
                T,
                LABELS[method],
                pm(column(cell, "psnr")),
                fmt(paper_psnr(dataset, paper_T, method)),
                ssim,
                fmt(mean(cell, "fsim"), 3),
                lpips,
                fmt(mean(cell, "lsim_honest"), 4),
                fmt(mean(cell, "label_accuracy"), 2),
                len(cell),
                fmt(mean(cell, "seconds_per_iteration"), 3),
            ]
        )
    for (dataset, paper_T, T), cell in group(rows, "dataset", "paper_T", "local_steps").items():
        by = {m: mean(r, "psnr") for (m,), r in group(cell, "method").items()}
        paper = PAPER_PSNR[(dataset, paper_T)]
        single, surrogate = [m for m in SINGLE_STEP if m in by], [m for m in SURROGATE if m in by]
        if single and surrogate:
            best_single = max(single, key=lambda m: by[m])
            worst_surrogate = min(surrogate, key=lambda m: by[m])
            ours_gap = by[worst_surrogate] - by[best_single]
            paper_single = [m for m in single if m in paper]
            paper_gap = (
                f"{min(paper[m] for m in surrogate) - max(paper[m] for m in paper_single):+.2f}"
                if paper_single
                else "-"
            )
            if paper_single and paper_single != single:  # the paper has no row for some (FEMNIST GI-NAS, DGGI)
                paper_gap += f", {' and '.join(LABELS[m] for m in paper_single)} only"
            margins.append(
                f"{dataset} T={T}: weakest surrogate ({LABELS[worst_surrogate]}) - best single-step "
                f"({LABELS[best_single]}) = {ours_gap:+.2f} dB (paper {paper_gap})"
            )
        if {"dggi", "sme"} <= set(by):
            paper_dggi = f"{paper['dggi'] - paper['sme']:+.2f}" if "dggi" in paper else "-"
            margins.append(f"{dataset} T={T}: DGGI - SME = {by['dggi'] - by['sme']:+.2f} dB (paper {paper_dggi})")
        if {"dimitrov", "pisme"} <= set(by):
            margins.append(f"{dataset} T={T}: Dimitrov et al. - PI-SME = {by['dimitrov'] - by['pisme']:+.2f} dB")
        if {"pisme", "nlsme", "ig"} <= set(by):
            ours = sorted(by, key=lambda m: -by[m])
            margins.append(
                f"{dataset} T={T}: PI-SME - NL-SME = {by['pisme'] - by['nlsme']:+.2f} dB "
                f"(paper {paper['pisme'] - paper['nlsme']:+.2f}), PI-SME - IG = "
                f"{by['pisme'] - by['ig']:+.2f} dB (paper {paper['pisme'] - paper['ig']:+.2f}); "
                f"our order: {' > '.join(LABELS[m] for m in ours)}"
            )
    clients = ", ".join(f"{sc.clients_for(d)} {d} client(s)" for d in DATASETS)
    caption = "Table 1. " + sc.caption(
        "FEMNIST and CIFAR-100 (bundled real samples)",
        clients=clients,
        extra="PSNR in dB on Hungarian-matched pairs; labels recovered from the "
        "update; variance over (client, seed) attacks; paper: 1000 iterations, "
        "k=50",
    )
    notes = ["Margins: " + m for m in margins]
    title = "Table 1: " + ", ".join(LABELS[m] for m in METHODS if any(r["method"] == m for r in rows))
    scale_note = None
    if "clients" in ctx.explicit:  # the preset's note counts its own clients; --clients set them here
        scale_note = f"{sc.note} Here --clients {sc.clients} sets the clients of both datasets."
    write_markdown(ctx, title, caption, markdown_table(header, lines), notes, scale_note=scale_note, rows=rows)
    _plot(ctx, rows)


def _plot(ctx: Context, rows: list[dict]) -> None:
    cells = group(rows, "dataset", "paper_T", "local_steps")
    fig = figure(3.2 * max(1, len(cells)), 3.6)
    for i, ((dataset, paper_T, T), cell) in enumerate(cells.items()):
        ax = fig.add_subplot(1, len(cells), i + 1)
        by = group(cell, "method")
        methods = [m for m in METHODS if (m,) in by]
        x = np.arange(len(methods))
        means = [mean(by[(m,)], "psnr") for m in methods]
        spread = [math.sqrt(v) if math.isfinite(v := mean_var(column(by[(m,)], "psnr"))[1]) else 0 for m in methods]
        ax.bar(x, means, yerr=spread, color="tab:blue", alpha=0.7, label="ours")
        ax.scatter(
            x,
            [paper_psnr(dataset, paper_T, m) for m in methods],
            color="tab:red",
            marker="_",
            s=300,
            zorder=3,
            label="paper",
        )
        ax.set_xticks(x, [LABELS[m] for m in methods], fontsize=8)
        ax.set_title(f"{dataset}, T={T}", fontsize=9)
        ax.set_ylabel("PSNR (dB)")
        if i == 0:
            ax.legend(fontsize=7)
    save_figure(fig, ctx.out / f"{ctx.name}.png")
