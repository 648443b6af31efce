"""The leakage-over-rounds study's tables and figure, from its study.csv alone (analysis/leakage_study.py).

- ``read_study(path)``: study.csv as a DataFrame (ValueError when it is not one of this study);
- ``rounds_markdown(table)``: per run, one line per round: the global model's accuracy and, for each
  attack (``SERIES``), the images recovered of those attacked; the best update-free guess and the
  matched chance beside them; then each attack's total over the rounds;
- ``plot_rounds_study(table)``: one panel per run: the fraction recovered against the round, one line
  per attack (the default attack's with its exact 95% interval), the best guess and the chance as
  lines, the global model's accuracy on a second axis.

matplotlib Figures built without pyplot (PNG through Agg), as analysis/plots.py does.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .leakage_study import TABLE_COLUMNS

# (title, method, labels): the attacks in the study's order; the first is the audit's default.
SERIES = (
    ("PI-SME", "pisme", "recovered"),
    ("remembering server", "pisme+memory", "recovered"),
    ("SME", "sme", "recovered"),
    ("IG", "ig", "recovered"),
    ("PI-SME, true labels", "pisme", "oracle"),
)
_STYLE = {  # title: (color, line style)
    "PI-SME": ("tab:red", "-"),
    "remembering server": ("tab:red", "--"),
    "SME": ("tab:blue", "-"),
    "IG": ("tab:green", "-"),
    "PI-SME, true labels": ("tab:purple", ":"),
}


def read_study(path) -> pd.DataFrame:
    """study.csv as a DataFrame: the text columns as text, the rest as numbers. ValueError naming the
    file when it lacks a column of TABLE_COLUMNS (the 2026-12-01 study's study.csv has no verdict)."""
    table = pd.read_csv(path)
    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path} is not a leakage study's study.csv of today's code: no {', '.join(missing)}")
    for column in ("run", "method", "labels", "label_estimator"):
        table[column] = table[column].astype(object).fillna("").astype(str)
    return table


def runs(table: pd.DataFrame) -> list[str]:
    """The federations of the table (a replay's rows, run "RUN/REPLAY", belong to RUN), in order."""
    return list(dict.fromkeys(name.split("/")[0] for name in table["run"]))


def series(table: pd.DataFrame, run: str) -> dict[str, pd.DataFrame]:
    """{title: its rows by round} of ``run``'s attacks (``SERIES``) that the table holds."""
    mine = table[table["run"].str.split("/").str[0] == run]
    out = {}
    for title, method, labels in SERIES:
        rows = mine[(mine["method"] == method) & (mine["labels"] == labels)].sort_values("round")
        if len(rows):
            out[title] = rows.set_index("round")
    return out


def _cell(row, interval: bool = False) -> str:
    if row is None or not math.isfinite(float(row.recovered)):
        return "-"
    text = f"{int(row.recovered)} of {int(row.images)}"
    if interval and math.isfinite(float(row.fraction_low)):
        text += f" ({100 * row.fraction_low:.0f}–{100 * row.fraction_high:.0f}%)"
    return text


def _pct(value) -> str:
    return "-" if not math.isfinite(float(value)) else f"{100 * float(value):.1f}%"


def rounds_markdown(table: pd.DataFrame) -> str:
    """The study's tables in Markdown (module docstring), one section per run."""
    parts = []
    for run in runs(table):
        made = series(table, run)
        if not made:
            continue
        titles = list(made)
        first = made[titles[0]]
        rounds = sorted(set().union(*(set(rows.index) for rows in made.values())))
        lines = [
            f"**{run}**: images recovered of those attacked, each round (the tracked clients' sum; the first "
            "two with their exact 95% interval)",
            "",
            "| round | test acc. | " + " | ".join(titles) + " | best guess | chance |",
            "|---|---|" + "---|" * len(titles) + "---|---|",
        ]
        for r in rounds:
            base = first.loc[r] if r in first.index else None
            cells = [
                _cell(made[t].loc[r] if r in made[t].index else None, interval=i < 2) for i, t in enumerate(titles)
            ]
            guess = (
                "-"
                if base is None or not math.isfinite(float(base.guess_recovered))
                else f"{int(base.guess_recovered)}"
            )
            accuracy = _pct(base.global_accuracy) if base is not None else "-"
            chance = _pct(base.chance) if base is not None else "-"
            lines.append(f"| {r} | {accuracy} | " + " | ".join(cells) + f" | {guess} | {chance} |")
        totals = []
        for t in titles:
            rows = made[t]
            if rows["recovered"].notna().all():
                rounds_n = f"{len(rows)} round" + ("" if len(rows) == 1 else "s")
                totals.append(f"{t} {int(rows['recovered'].sum())} of {int(rows['images'].sum())} ({rounds_n})")
        guess = first["guess_recovered"]
        if guess.notna().all():
            totals.append(f"the best guess {int(guess.sum())} of {int(first['images'].sum())}")
        lines += [
            "",
            "Summed over the rounds (each round attacks the same clients' images again): " + "; ".join(totals) + ".",
        ]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def plot_rounds_study(table: pd.DataFrame) -> Figure:
    """The study's figure (module docstring): one panel per run."""
    from matplotlib.ticker import MaxNLocator

    names = runs(table)
    fig = Figure(figsize=(6 * max(1, len(names)), 4), layout="constrained")
    axes = fig.subplots(1, max(1, len(names)), squeeze=False)[0]
    for ax, run in zip(axes, names):
        made = series(table, run)
        for i, (title, rows) in enumerate(made.items()):
            color, dashes = _STYLE.get(title, ("0.3", "-"))
            x, y = rows.index.to_numpy(float), rows["fraction"].to_numpy(float)
            if i == 0:
                err = np.vstack([y - rows["fraction_low"].to_numpy(float), rows["fraction_high"].to_numpy(float) - y])
                ax.errorbar(
                    x, y, yerr=np.nan_to_num(err), color=color, linestyle=dashes, marker="o", capsize=3, label=title
                )
            else:
                ax.plot(x, y, color=color, linestyle=dashes, marker="s", markersize=4, label=title)
        if made:
            first = next(iter(made.values()))
            x = first.index.to_numpy(float)
            guess = (first["guess_recovered"] / first["images"]).to_numpy(float)
            ax.step(x, guess, where="mid", color="0.4", linestyle="--", linewidth=1, label="best update-free guess")
            ax.plot(
                x,
                first["chance"].to_numpy(float),
                color="0.6",
                linestyle=":",
                linewidth=1,
                label="matched chance of singling out an image",
            )
            twin = ax.twinx()
            twin.plot(x, first["global_accuracy"].to_numpy(float), color="black", linewidth=0.8, alpha=0.5)
            twin.set_ylabel("test accuracy (thin black)")
            twin.set_ylim(0, 1)
        ax.set_title(run, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("fraction of the attacked images recovered")
        ax.set_ylim(bottom=-0.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Leakage over rounds, in images recovered (the verdict's count)", fontsize=10)
    return fig
