"""Figures of leakage and utility. Each function returns a matplotlib Figure.

Figures are built with matplotlib.figure.Figure directly (no pyplot), so they need no GUI
backend, hold no global state and are freed like any other object; PNG output uses Agg.
Empty data gives a figure saying so rather than an error.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from fl_attack.records import write_bytes_atomic

from .aggregate import (
    GROUP_KEYS,
    METHOD_ORDER,
    MIN_CI_N,
    final_accuracy,
    per_round,
    round_accuracy,
    run_labels,
    sorted_methods,
)
from .load import Run

_LINESTYLES = ("-", "--", ":", "-.")
_METHOD_COLORS = dict(zip(METHOD_ORDER, ("tab:red", "tab:blue", "tab:green", "tab:purple")))
_METHOD_COLORS["dimitrov"] = "tab:olive"  # its hash would share ginas' pink
_OTHER_COLORS = ("tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_METRIC_LABELS = {
    "recovered_fraction": "images recovered (fraction of k)",
    "reidentified": "singled out (fraction of k)",
    "psnr_margin": "PSNR over the guess (dB)",
    "psnr": "PSNR (dB)",
    "ssim": "SSIM",
    "fsim": "FSIM",
    "lpips": "LPIPS (lower = closer)",
    "lsim_honest": "LSIM (honest)",
    "label_accuracy": "label accuracy",
}


def method_color(method: str) -> str:
    """A fixed colour per attack method, the same in every figure."""
    if method in _METHOD_COLORS:
        return _METHOD_COLORS[method]
    # A stable pick (str hash changes between processes).
    return _OTHER_COLORS[sum(map(ord, method)) % len(_OTHER_COLORS)]


def _as_runs(runs: Run | Sequence[Run]) -> list[Run]:
    return [runs] if isinstance(runs, Run) else list(runs)


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


LEAKAGE_METRICS = ("psnr", "ssim", "lpips", "label_accuracy")
_ACCURACY_LABELS = {
    "global_accuracy": "global accuracy (server, held-out test pool)",
    "eval_accuracy": "eval accuracy (clients' federated evaluation)",
}


def plot_leakage(
    runs: Run | Sequence[Run],
    metrics: Sequence[str] = LEAKAGE_METRICS,
    x: str = "round",
    threshold: float | None = None,
) -> Figure:
    """Mean leakage per round, one panel per metric, one line per (run, method, defense, labels).

    x: "round", or "accuracy" (the model's accuracy that round, `round_accuracy`: global_accuracy,
    else eval_accuracy; the axis says which, the legend too when runs differ). The 95% interval of
    the mean is a band (x="round") or a bar (x="accuracy"), drawn where per_round gives one.
    Colour = method, line style = run/defense/labels. `threshold` (dB) draws a dashed line on PSNR.
    """
    if x not in ("round", "accuracy"):
        raise ValueError(f"x must be 'round' or 'accuracy', got {x!r}")
    runs = _as_runs(runs)
    tables = [per_round(run.attacks, run.rounds) for run in runs]
    sources = {s for table in tables for s in table["accuracy_source"].dropna()}
    columns = 2 if len(metrics) > 1 else 1
    fig = Figure(figsize=(10 if columns > 1 else 8, 3.6 * math.ceil(len(metrics) / columns)), layout="constrained")
    axes = fig.subplots(math.ceil(len(metrics) / columns), columns, squeeze=False).ravel()
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    # One source: the axis names it; several (old and new runs): the legend says which per line.
    x_label = "round" if x == "round" else "model accuracy (which one: see legend)"
    if x == "accuracy" and len(sources) == 1:
        x_label = _ACCURACY_LABELS[next(iter(sources))]
    legend = True
    varies = [key for key in ("defense", "labels") if len({v for table in tables for v in table[key].dropna()}) > 1]
    for ax, metric in zip(axes, metrics):
        styles: list = []
        for label, table in zip(run_labels(runs), tables):
            for keys, rows in table.groupby(GROUP_KEYS, sort=False, dropna=False):
                where = rows[x].notna() & rows[f"{metric}_mean"].notna()
                if not where.any():
                    continue
                rows = rows[where]
                group = dict(zip(GROUP_KEYS, keys))
                style = (label, *(group[key] for key in varies))
                if style not in styles:
                    styles.append(style)
                parts = [group["method"], *style[1:]]
                if len(runs) > 1:
                    parts.append(label)
                if x == "accuracy" and len(sources) > 1:
                    parts.append(rows["accuracy_source"].iloc[0])
                color = method_color(str(group["method"]))
                xs, low, high = (
                    rows[c].to_numpy(dtype=float) for c in (x, f"{metric}_ci95_low", f"{metric}_ci95_high")
                )
                ax.plot(
                    xs,
                    rows[f"{metric}_mean"].to_numpy(dtype=float),
                    marker="o",
                    ms=4,
                    color=color,
                    ls=_LINESTYLES[styles.index(style) % len(_LINESTYLES)],
                    label=" · ".join(map(str, parts)),
                )
                if x == "round":
                    ax.fill_between(xs, low, high, color=color, alpha=0.15, linewidth=0)
                else:
                    ax.vlines(xs, low, high, color=color, alpha=0.5)
        if not styles:
            _no_data(ax, f"no {metric} values yet" + (" with an accuracy" if x == "accuracy" else ""))
            continue
        if threshold is not None and metric == "psnr":
            ax.axhline(threshold, color="0.5", lw=0.8, ls="--")
        ax.set_xlabel(x_label)
        ax.set_ylabel(f"mean {_METRIC_LABELS.get(metric, metric)}")
        if x == "round":
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        if legend:  # on the first panel drawn only
            ax.legend(fontsize="x-small")
            legend = False
    what = "over rounds" if x == "round" else "against the model's accuracy, one point per round"
    fig.suptitle(
        f"Leakage {what} ({'band' if x == 'round' else 'bar'}: 95% interval of the mean, n ≥ {MIN_CI_N})",
        fontsize="medium",
    )
    return fig


def plot_verdict(runs: Run | Sequence[Run]) -> Figure:
    """The verdict against the round (fl_attack.evaluation.verdict): the mean fraction of a client's images
    recovered (left) and singled out (right) per (run, method, defense, labels), with the best guess
    without the update (grey dashed: its recovered fraction) and chance (grey dotted: 1/(k+D)) drawn."""
    runs = _as_runs(runs)
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    drawn = False
    for label, run in zip(run_labels(runs), runs):
        table = per_round(run.attacks, run.rounds)
        ok = run.attacks[(run.attacks["status"] == "ok") & run.attacks["recovered"].notna()]
        for ax, metric in zip(axes, ("recovered_fraction", "reidentified")):
            for keys, rows in table.groupby(GROUP_KEYS, sort=False, dropna=False):
                rows = rows[rows[f"{metric}_mean"].notna()]
                if rows.empty:
                    continue
                group = dict(zip(GROUP_KEYS, keys))
                name = " · ".join(map(str, [group["method"], *([label] if len(runs) > 1 else [])]))
                ax.plot(
                    rows["round"],
                    rows[f"{metric}_mean"],
                    marker="o",
                    ms=4,
                    color=method_color(str(group["method"])),
                    label=name,
                )
                drawn = True
            if not ok.empty:
                floor = ok.groupby("round")[
                    "guess_recovered_fraction" if metric == "recovered_fraction" else "reid_chance"
                ].mean()
                chance = ok.groupby("round")["reid_chance"].mean()
                if metric == "recovered_fraction":
                    ax.plot(floor.index, floor.values, color="0.5", ls="--", label="a guess without the update")
                ax.plot(chance.index, chance.values, color="0.5", ls=":", label="chance (update-free, same matching)")
    for ax, metric in zip(axes, ("recovered_fraction", "reidentified")):
        if not drawn:
            _no_data(ax, "no verdict in these runs (recorded before it existed?)")
            continue
        ax.set_xlabel("round")
        ax.set_ylabel(_METRIC_LABELS[metric])
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    if drawn:
        axes[0].legend(fontsize="x-small")
    fig.suptitle("Images recovered and singled out per round (mean over the attacked clients)", fontsize="medium")
    return fig


def plot_leakage_over_rounds(runs: Run | Sequence[Run], metric: str = "psnr", threshold: float | None = None) -> Figure:
    """One metric of `plot_leakage` against round."""
    return plot_leakage(runs, (metric,), "round", threshold)


def plot_training(runs: Run | Sequence[Run]) -> Figure:
    """Training curve: loss (train solid, eval dashed) and accuracy (eval solid, global dashed) per round, per run."""
    runs = _as_runs(runs)
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    loss_ax, accuracy_ax = fig.subplots(1, 2)
    drawn = False
    for i, (label, run) in enumerate(zip(run_labels(runs), runs)):
        rounds = run.rounds
        if rounds.empty:
            continue
        color = f"C{i % 10}"
        for ax, column, style, what in (
            (loss_ax, "train_loss", "-", "train"),
            (loss_ax, "eval_loss", "--", "eval"),
            (accuracy_ax, "eval_accuracy", "-", "eval"),
            (accuracy_ax, "global_accuracy", "--", "global"),
        ):
            if rounds[column].notna().any():
                ax.plot(
                    rounds["round"],
                    rounds[column],
                    ls=style,
                    marker="o",
                    ms=3,
                    color=color,
                    label=f"{what} · {label}" if len(runs) > 1 else what,
                )
                drawn = True
    if not drawn:
        _no_data(loss_ax, "no finished rounds yet")
        _no_data(accuracy_ax, "no finished rounds yet")
        return fig
    for ax, title in ((loss_ax, "loss"), (accuracy_ax, "accuracy")):
        ax.set_xlabel("round")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    return fig


def plot_utility_vs_leakage(runs: Sequence[Run]) -> Figure:
    """Final accuracy (y, `final_accuracy`: global, else eval) against mean PSNR over ok attacks (x),
    one labelled point per run."""
    runs = _as_runs(runs)
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    points = []
    for label, run in zip(run_labels(runs), runs):
        ok = run.attacks[run.attacks["status"] == "ok"]
        psnr = ok["psnr"].dropna().mean() if not ok.empty else np.nan
        accuracy, source = final_accuracy(run)
        if not (np.isnan(psnr) or np.isnan(accuracy)):
            points.append((psnr, accuracy, label, source))
    if not points:
        _no_data(ax, "no run has both attacks and eval accuracy")
        return fig
    sources = sorted({point[3] for point in points})
    for i, (x, y, label, source) in enumerate(points):
        label += f" ({source})" if len(sources) > 1 else ""
        ax.scatter([x], [y], color=f"C{i % 10}", s=40, zorder=3)
        ax.annotate(label, (x, y), xytext=(5, 5), textcoords="offset points", fontsize="small")
    ax.set_xlabel("mean PSNR of reconstructions (dB)  →  more leakage")
    ax.set_ylabel(f"final {' / '.join(s.replace('_', ' ') for s in sources)}  →  more utility")
    ax.set_title("Utility vs leakage (one point per run)")
    ax.grid(alpha=0.3)
    ax.margins(0.15)
    return fig


def has_epsilon(run: Run) -> bool:
    """True when the run recorded a finite DP budget spent (local-dp or central-dp, fl_attack.privacy.accountant)."""
    spent = pd.concat(
        [run.attacks.get("epsilon", pd.Series(dtype=float)), run.rounds.get("epsilon", pd.Series(dtype=float))]
    )
    return bool(np.isfinite(spent.to_numpy(dtype=float)).any())


def plot_leakage_vs_epsilon(
    runs: Run | Sequence[Run], metrics: Sequence[str] = ("psnr", "lpips", "label_accuracy")
) -> Figure:
    """Leakage and accuracy against the DP budget spent: one panel per metric (the mean over the ok
    attacks on updates sent with the same ε spent, i.e. after the same number of participations
    (local-dp) or rounds (central-dp); memoryless methods solid, "+memory" dashed) and a last
    panel with the model's accuracy against the ε spent by each round (rounds.csv). One colour per
    run; a run without DP is a grey line at its mean (accuracy: its final one). ε on a log axis;
    ε = inf is left out."""
    runs = _as_runs(runs)
    fig = Figure(figsize=(4.3 * (len(metrics) + 1), 3.8), layout="constrained")
    axes = fig.subplots(1, len(metrics) + 1, squeeze=False).ravel()
    labels = run_labels(runs)
    private = [(i, label, run) for i, (label, run) in enumerate(zip(labels, runs)) if has_epsilon(run)]
    for ax, metric in zip(axes, metrics):
        for i, label, run in private:
            ok = run.attacks[(run.attacks["status"] == "ok") & np.isfinite(run.attacks["epsilon"].astype(float))]
            for method in sorted_methods(ok):
                by_budget = ok[ok["method"] == method].groupby("epsilon")[metric].mean().sort_index()
                ls = "--" if str(method).endswith("+memory") else "-"
                ax.plot(
                    by_budget.index,
                    by_budget.to_numpy(),
                    marker="o",
                    ms=3,
                    ls=ls,
                    color=f"C{i % 10}",
                    label=f"{label}: {method}",
                )
        for label, run in zip(labels, runs):
            if not has_epsilon(run) and not run.attacks.empty:
                for method, rows in run.attacks[run.attacks["status"] == "ok"].groupby("method"):
                    ls = (0, (1, 3)) if not str(method).endswith("+memory") else (0, (4, 3))
                    ax.axhline(rows[metric].mean(), color="0.5", ls=ls, lw=1, label=f"{label} (no DP): {method}")
        ax.set_ylabel(_METRIC_LABELS.get(metric, metric))
    ax = axes[-1]
    for i, label, run in private:
        accuracy, _ = round_accuracy(run.rounds)
        spent = run.rounds.set_index("round")["epsilon"].astype(float).reindex(accuracy.index)
        keep = np.isfinite(spent.to_numpy())
        ax.plot(spent[keep], accuracy[keep], marker="o", ms=3, color=f"C{i % 10}", label=label)
    for label, run in zip(labels, runs):
        accuracy, _ = final_accuracy(run)
        if not has_epsilon(run) and not np.isnan(accuracy):
            ax.axhline(accuracy, color="0.5", ls=":", lw=1, label=f"{label} (no DP, final)")
    ax.set_ylabel("model accuracy (global, else eval)")
    for ax in axes:
        if not private:
            _no_data(ax, "no run recorded a DP budget (local-dp or central-dp)")
            continue
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ε spent (at the run's target δ)")
        ax.grid(alpha=0.3, which="both")
    if private:
        axes[0].legend(fontsize="xx-small")
        axes[-1].legend(fontsize="xx-small")
    fig.suptitle("Leakage and accuracy against the privacy budget spent", fontsize="medium")
    return fig


def plot_memory(run: Run, metric: str = "psnr", x: str = "round") -> Figure:
    """What a remembering server holds, per tracked client (one panel each): the ``METHOD+memory``
    rows (the estimate held after each round, dashed) beside each round's memoryless ``METHOD``
    rows (solid, the same colour), against the round or the model's accuracy that round
    (``round_accuracy``). ValueError for another x, or a run without "+memory" rows."""
    if x not in ("round", "accuracy"):
        raise ValueError(f"x must be 'round' or 'accuracy', got {x!r}")
    ok = run.attacks[run.attacks["status"] == "ok"] if not run.attacks.empty else run.attacks
    remembering = sorted({m for m in ok.get("method", []) if str(m).endswith("+memory")})
    if not remembering:
        raise ValueError(f"{run.path} has no '+memory' rows (attack-memory is 'none')")
    clients = sorted(ok[ok["method"].isin(remembering)]["partition_id"].dropna().unique())
    accuracy, source = round_accuracy(run.rounds) if not run.rounds.empty else (pd.Series(dtype="float64"), None)
    if x == "accuracy" and source is None:
        raise ValueError(f"{run.path} has no accuracy per round for x='accuracy'")
    columns = min(3, len(clients))
    fig = Figure(figsize=(max(6.5, 4.2 * columns), 3.4 * math.ceil(len(clients) / columns)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(math.ceil(len(clients) / columns), columns, squeeze=False).ravel())
    for ax in axes[len(clients) :]:
        ax.set_visible(False)
    for ax, client in zip(axes, clients):
        for twin in remembering:
            base = twin.removesuffix("+memory")
            color = method_color(base)
            for method, ls in ((base, "-"), (twin, "--")):
                rows = ok[(ok["method"] == method) & (ok["partition_id"] == client)].sort_values("round")
                if rows.empty:
                    continue
                xs = rows["round"].map(accuracy) if x == "accuracy" else rows["round"]
                mode = rows["memory"].dropna().iloc[0] if method == twin and "memory" in rows else ""
                label = f"{method} ({mode})" if mode else f"{method} (each round alone)"
                ax.plot(
                    xs.to_numpy(dtype=float),
                    rows[metric].to_numpy(dtype=float),
                    marker="o",
                    ms=3,
                    color=color,
                    ls=ls,
                    label=label,
                )
        ax.set_title(f"client {int(client)}", fontsize="medium")
        ax.set_xlabel("round" if x == "round" else _ACCURACY_LABELS[source])
        ax.set_ylabel(_METRIC_LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="x-small")
    fig.suptitle("The server's estimate with memory (dashed) and each round's attack alone (solid)", fontsize="medium")
    return fig


def plot_per_client(run: Run, metric: str = "psnr", annotate_up_to: int = 16) -> Figure:
    """Heat map of ok-attack `metric` per client (rows) and round (columns), one panel per method.

    Grey cells: not attacked, failed or no value. Values are written in the cells when the grid
    has at most `annotate_up_to` rows and columns.
    """
    attacks = run.attacks
    methods = sorted_methods(attacks)
    if not methods:
        fig = Figure(figsize=(6, 2.5), layout="constrained")
        _no_data(fig.add_subplot(), "no attacks yet")
        return fig
    ok = attacks[attacks["status"] == "ok"]
    rounds = sorted(attacks["round"].unique())
    clients = sorted(attacks["partition_id"].dropna().unique())
    values = ok[metric].dropna()
    vmin, vmax = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    height = min(2.0 + 0.28 * len(clients), 12)
    panel_width = min(2.5 + 0.45 * len(rounds), 7.0)
    fig = Figure(figsize=(min(panel_width * len(methods) + 1.2, 16.0), height), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(methods), squeeze=False)[0])
    cmap = _grey_nan_cmap()
    image = None
    for ax, method in zip(axes, methods):
        grid = (
            ok[ok["method"] == method]
            .groupby(["partition_id", "round"])[metric]
            .mean()
            .unstack("round")
            .reindex(index=clients, columns=rounds)
        )
        data = np.ma.masked_invalid(grid.to_numpy(dtype=float))
        image = ax.imshow(data, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(method)
        ax.set_xticks(range(len(rounds)), [str(int(r)) for r in rounds])
        ax.set_yticks(range(len(clients)), [str(int(c)) for c in clients])
        ax.set_xlabel("round")
        if len(rounds) <= annotate_up_to and len(clients) <= annotate_up_to:
            middle = (vmin + vmax) / 2
            for (r, c), value in np.ndenumerate(grid.to_numpy(dtype=float)):
                if not np.isnan(value):
                    ax.text(
                        c,
                        r,
                        f"{value:.1f}" if metric == "psnr" else f"{value:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if value < middle else "black",
                    )
    axes[0].set_ylabel("client (partition id)")
    fig.colorbar(image, ax=list(axes), label=_METRIC_LABELS.get(metric, metric), shrink=0.9)
    fig.suptitle(f"{_METRIC_LABELS.get(metric, metric)} per client and round — {run.name}", fontsize="medium")
    return fig


def _grey_nan_cmap():
    import matplotlib

    return matplotlib.colormaps["viridis"].with_extremes(bad="0.85")


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def save_figure(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Write the figure as a PNG at `path` (folders created); returns the path."""
    return write_bytes_atomic(path, figure_png(fig, dpi=dpi))


__all__ = [
    "plot_leakage",
    "plot_leakage_over_rounds",
    "plot_training",
    "plot_utility_vs_leakage",
    "plot_per_client",
    "figure_png",
    "save_figure",
    "method_color",
    "plot_memory",
]
