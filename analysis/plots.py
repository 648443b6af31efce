"""Figures of leakage and utility. Each function returns a matplotlib Figure.

Figures are built with matplotlib.figure.Figure directly (no pyplot), so they need no GUI
backend, hold no global state and are freed like any other object; PNG output uses Agg.
Empty data gives a figure saying so rather than an error.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fl_attack.records import write_bytes_atomic

from .aggregate import METHOD_ORDER, final_eval_accuracy, per_round, run_labels, sorted_methods
from .load import Run

_LINESTYLES = ("-", "--", ":", "-.")
_METHOD_COLORS = dict(zip(METHOD_ORDER, ("tab:red", "tab:blue", "tab:green", "tab:purple")))
_OTHER_COLORS = ("tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_METRIC_LABELS = {"psnr": "PSNR (dB)", "ssim": "SSIM", "fsim": "FSIM", "lpips": "LPIPS (lower = closer)",
                  "lsim_honest": "LSIM (honest)", "label_accuracy": "label accuracy"}


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


def plot_leakage_over_rounds(runs: Run | Sequence[Run], metric: str = "psnr",
                             threshold: float | None = None) -> Figure:
    """Mean `metric` per round, one line per (run, method), with its 95% interval as a band.

    Colour = method, line style = run. `threshold` (dB) draws a dashed reference line.
    """
    runs = _as_runs(runs)
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for i, (label, run) in enumerate(zip(run_labels(runs), runs)):
        table = per_round(run.attacks)
        for method in sorted_methods(run.attacks):
            rows = table[table["method"] == method]
            x = rows["round"].to_numpy(dtype=float)
            mean = rows[f"{metric}_mean"].to_numpy(dtype=float)
            if np.isnan(mean).all():
                continue
            name = method if len(runs) == 1 else f"{method} · {label}"
            color = method_color(method)
            ax.plot(x, mean, marker="o", ms=4, color=color, ls=_LINESTYLES[i % len(_LINESTYLES)], label=name)
            ax.fill_between(x, rows[f"{metric}_ci95_low"].to_numpy(dtype=float),
                            rows[f"{metric}_ci95_high"].to_numpy(dtype=float), color=color, alpha=0.15,
                            linewidth=0)
            drawn = True
    if not drawn:
        _no_data(ax, f"no {metric} values yet (no attacks, or all failed)")
        return fig
    if threshold is not None and metric == "psnr":
        ax.axhline(threshold, color="0.5", lw=0.8, ls="--")
    ax.set_xlabel("round")
    ax.set_ylabel(f"mean {_METRIC_LABELS.get(metric, metric)}")
    ax.set_title(f"{_METRIC_LABELS.get(metric, metric)} over rounds (band: 95% interval of the mean)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def plot_training(runs: Run | Sequence[Run]) -> Figure:
    """Training curve: loss (train solid, eval dashed) and eval accuracy per round, per run."""
    runs = _as_runs(runs)
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    loss_ax, accuracy_ax = fig.subplots(1, 2)
    drawn = False
    for i, (label, run) in enumerate(zip(run_labels(runs), runs)):
        rounds = run.rounds
        if rounds.empty:
            continue
        color = f"C{i % 10}"
        for column, style, what in (("train_loss", "-", "train"), ("eval_loss", "--", "eval")):
            if rounds[column].notna().any():
                loss_ax.plot(rounds["round"], rounds[column], ls=style, marker="o", ms=3, color=color,
                             label=f"{what} · {label}" if len(runs) > 1 else what)
                drawn = True
        if rounds["eval_accuracy"].notna().any():
            accuracy_ax.plot(rounds["round"], rounds["eval_accuracy"], marker="o", ms=3, color=color,
                             label=label)
            drawn = True
    if not drawn:
        _no_data(loss_ax, "no finished rounds yet")
        _no_data(accuracy_ax, "no finished rounds yet")
        return fig
    for ax, title in ((loss_ax, "loss"), (accuracy_ax, "eval accuracy")):
        ax.set_xlabel("round")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0] and (ax is loss_ax or len(runs) > 1):
            ax.legend(fontsize="small")
    return fig


def plot_utility_vs_leakage(runs: Sequence[Run]) -> Figure:
    """Final eval accuracy (y) against mean PSNR over ok attacks (x), one labelled point per run."""
    runs = _as_runs(runs)
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    points = []
    for label, run in zip(run_labels(runs), runs):
        ok = run.attacks[run.attacks["status"] == "ok"]
        psnr = ok["psnr"].dropna().mean() if not ok.empty else np.nan
        accuracy = final_eval_accuracy(run)
        if not (np.isnan(psnr) or np.isnan(accuracy)):
            points.append((psnr, accuracy, label))
    if not points:
        _no_data(ax, "no run has both attacks and eval accuracy")
        return fig
    for i, (x, y, label) in enumerate(points):
        ax.scatter([x], [y], color=f"C{i % 10}", s=40, zorder=3)
        ax.annotate(label, (x, y), xytext=(5, 5), textcoords="offset points", fontsize="small")
    ax.set_xlabel("mean PSNR of reconstructions (dB)  →  more leakage")
    ax.set_ylabel("final eval accuracy  →  more utility")
    ax.set_title("Utility vs leakage (one point per run)")
    ax.grid(alpha=0.3)
    ax.margins(0.15)
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
        grid = (ok[ok["method"] == method].groupby(["partition_id", "round"])[metric].mean()
                .unstack("round").reindex(index=clients, columns=rounds))
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
                    ax.text(c, r, f"{value:.1f}" if metric == "psnr" else f"{value:.2f}", ha="center",
                            va="center", fontsize=7, color="white" if value < middle else "black")
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


__all__ = ["plot_leakage_over_rounds", "plot_training", "plot_utility_vs_leakage", "plot_per_client",
           "figure_png", "save_figure", "method_color"]
