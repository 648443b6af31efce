"""The privacy-utility frontier's table and figures, from frontier.csv alone (analysis/frontier.py).

- ``pareto(table)``: the settings no other one beats on both axes (higher accuracy, fewer images);
- ``frontier_markdown(table)``: one line per setting, the Pareto front marked;
- ``plot_frontier(table)``: x = final test accuracy, y = the fraction of the attacked images the
  server recovered (the remembering server at the end) with its exact 95% interval, one line per
  family through its strengths, each setting's best update-free guess (its floor) and matched chance
  marked at its accuracy, the Pareto front ringed and joined; beside it the same zoomed on the settings
  within ZOOM_POINTS accuracy points of ``none``;
- ``plot_rounds(table)``: leakage over rounds, one panel per family: the memoryless attacks'
  fraction recovered in each attacked round, one line per strength, the remembering server's dashed.

matplotlib Figures built without pyplot (PNG through Agg), as analysis/plots.py does.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

FAMILY_ORDER = (
    "none",
    "local-dp",
    "central-dp (server clipping)",
    "central-dp (client clipping)",
    "topk",
    "low-rank",
    "quantize",
    "secagg",
    "local-dp+secagg (5)",
)
_COLORS = (
    "black",
    "tab:red",
    "tab:blue",
    "tab:cyan",
    "tab:green",
    "tab:purple",
    "tab:orange",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:gray",
)


def families(table: pd.DataFrame) -> list[str]:
    """The table's families, FAMILY_ORDER first, then any other in order of appearance."""
    present = list(dict.fromkeys(table["family"]))
    return [f for f in FAMILY_ORDER if f in present] + [f for f in present if f not in FAMILY_ORDER]


def _color(family: str, order: list[str]) -> str:
    known = list(FAMILY_ORDER) + [f for f in order if f not in FAMILY_ORDER]
    return _COLORS[known.index(family) % len(_COLORS)]


def pareto(table: pd.DataFrame) -> pd.Series:
    """True for each setting on the Pareto front of (final_accuracy: higher is better, fraction:
    lower is better): no other setting has accuracy >= and fraction <= with one of them strictly.
    Settings without both numbers are never on it."""
    acc, frac = table["final_accuracy"].to_numpy(float), table["fraction"].to_numpy(float)
    known = np.isfinite(acc) & np.isfinite(frac)
    front = []
    for i in range(len(table)):
        beaten = known & (acc >= acc[i]) & (frac <= frac[i]) & ((acc > acc[i]) | (frac < frac[i]))
        front.append(bool(known[i] and not beaten.any()))
    return pd.Series(front, index=table.index, name="pareto")


def _pct(value, digits: int = 1) -> str:
    return "n/a" if value is None or not math.isfinite(float(value)) else f"{100 * float(value):.{digits}f}%"


def _count(recovered, images) -> str:
    if not (math.isfinite(float(recovered)) and math.isfinite(float(images))):
        return "n/a"
    return f"{int(recovered)} of {int(images)}"


def _interval(low, high) -> str:
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        return ""
    return f" ({100 * float(low):.0f}–{100 * float(high):.0f}%)"


def _strength(row) -> str:
    if not math.isfinite(float(row.strength)):
        return "-"
    return f"{row.strength_name} {float(row.strength):g}"


def _number(value, fmt: str = ".3g") -> str:
    return "-" if value is None or not math.isfinite(float(value)) else format(float(value), fmt)


def frontier_markdown(table: pd.DataFrame) -> str:
    """The frontier table in Markdown: per setting its strength, final test accuracy, what the
    remembering server recovered at the end (count, fraction, exact 95% interval; the round, when the
    attacks after it failed, and how many failed), the best round's,
    the best guess and the matched chance, the ε spent and the ReRo bound; **bold** setting names are
    on the Pareto front."""
    front = pareto(table)
    lines = [
        "| setting | strength | final test acc. | recovered at the end | best round | best guess | chance "
        "| ε spent | DP's bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, row in zip(table.index, table.itertuples()):
        name = f"**{row.setting}**" if front[i] else row.setting
        end = (
            f"{_count(row.recovered, row.images)}: {_pct(row.fraction)}{_interval(row.fraction_low, row.fraction_high)}"
        )
        if math.isfinite(float(row.end_round)) and float(row.end_round) < float(row.rounds):
            end += f", at round {int(row.end_round)}"  # the later attacks failed: the end is the last scored
        if float(row.attacks_ok) < float(row.attacks):
            end += f" ({int(row.attacks - row.attacks_ok)} of {int(row.attacks)} attacks failed)"
        best = (
            f"round {int(row.best_round)}: {_count(row.best_recovered, row.best_images)}"
            if math.isfinite(float(row.best_round))
            else "n/a"
        )
        if math.isfinite(float(row.dp_bound)):
            bound = "1 (vacuous)" if row.dp_bound >= 1 else f"{_pct(row.dp_bound)} ({row.dp_bound_name})"
            bound += " **above the bound: accounting bug?**" if row.dp_alarm else ""
        else:
            bound = "not a promise against this server" if "central-dp" in row.defense else "-"
        lines.append(
            f"| {name} | {_strength(row)} | {_pct(row.final_accuracy)} | {end} | {best} | "
            f"{_count(row.guess_recovered, row.images)} | {_pct(row.chance)} | {_number(row.epsilon)} | {bound} |"
        )
    return "\n".join(lines) + "\n"


ZOOM_POINTS = 6.0  # the right panel: the settings within this many accuracy points of none's


def plot_frontier(table: pd.DataFrame) -> Figure:
    """The frontier (module docstring): accuracy against the fraction recovered; left every setting, right
    (when ``none`` has an accuracy) the same drawing zoomed on the settings within ZOOM_POINTS of it, where
    the settings that keep the model crowd together."""
    none = table.loc[table["setting"] == "none", "final_accuracy"].astype(float)
    base = float(none.iloc[0]) if len(none) and math.isfinite(float(none.iloc[0])) else math.nan
    zoom = math.isfinite(base)
    fig = Figure(figsize=(13.0 if zoom else 8.5, 5.5), layout="constrained")
    axes = fig.subplots(1, 2 if zoom else 1, squeeze=False)[0]
    for ax in axes:
        _draw_frontier(ax, table)
    axes[0].legend(fontsize=7, loc="upper left")
    axes[0].set_title("Privacy-utility frontier: each defense through its strengths (labels: the strength)", fontsize=9)
    if zoom:
        acc = table["final_accuracy"].astype(float)
        near = acc[acc >= base - ZOOM_POINTS / 100]
        axes[1].set_xlim(near.min() - 0.005, near.max() + 0.005)
        axes[1].set_title(
            f"The same, zoomed: the settings within {ZOOM_POINTS:g} points of none's accuracy", fontsize=9
        )
    return fig


def _draw_frontier(ax, table: pd.DataFrame) -> None:
    """One frontier panel: each family's line through its strengths with interval bars, each setting's floor
    and chance, the Pareto front."""
    order = families(table)
    for family in order:
        rows = table[table["family"] == family].sort_values("strength", na_position="first")
        rows = rows[np.isfinite(rows["final_accuracy"].astype(float)) & np.isfinite(rows["fraction"].astype(float))]
        if rows.empty:
            continue
        x, y = rows["final_accuracy"].to_numpy(float), rows["fraction"].to_numpy(float)
        err = np.vstack([y - rows["fraction_low"].to_numpy(float), rows["fraction_high"].to_numpy(float) - y])
        color = _color(family, order)
        ax.errorbar(x, y, yerr=np.nan_to_num(err), color=color, marker="o", capsize=3, label=family, linewidth=1.2)
        for xi, yi, s in zip(x, y, rows["strength"].to_numpy(float)):
            if math.isfinite(s):
                ax.annotate(f"{s:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    # each setting's own floor and chance (its images, its guesses): a mark at its accuracy, not one line for all
    x = table["final_accuracy"].astype(float).to_numpy()
    # the y axis fits what was recovered and the floors; a chance above it is drawn at the top edge, labelled
    fitted = np.concatenate([table[c].astype(float).to_numpy() for c in ("fraction_high", "guess_fraction")])
    top = 1.15 * np.nanmax(fitted) + 0.01 if np.isfinite(fitted).any() else 1.0
    for column, marker, color, label in (
        ("guess_fraction", "_", "0.3", "best update-free guess (the setting's floor)"),
        ("chance", "x", "0.6", "matched chance of singling out an image (the setting's; ^: above the axis)"),
    ):
        y = table[column].astype(float).to_numpy()
        if (np.isfinite(x) & np.isfinite(y)).any():
            shown = np.minimum(y, top)
            ax.scatter(
                x, shown, marker=marker, s=120 if marker == "_" else 25, color=color, linewidths=1.5, label=label
            )
            for xi, yi in zip(x, y):
                if np.isfinite(xi) and yi > top:
                    ax.annotate(
                        f"^ {yi:.0%}", (xi, top), textcoords="offset points", xytext=(-6, -10), fontsize=7, color=color
                    )
    front = table[pareto(table)].sort_values("final_accuracy")
    if not front.empty:
        ax.plot(front["final_accuracy"], front["fraction"], color="gold", linewidth=4, alpha=0.5, zorder=0)
        ax.scatter(
            front["final_accuracy"], front["fraction"], s=160, facecolors="none", edgecolors="goldenrod", zorder=3
        )
        ax.plot([], [], color="gold", linewidth=4, alpha=0.5, label="Pareto front")
    ax.set_xlabel("final test accuracy (the server's held-out samples)")
    ax.set_ylabel("fraction of the attacked images recovered\n(the remembering server at the end; 95% exact)")
    ax.set_ylim(-0.04 * top, top)
    ax.grid(alpha=0.3)


def plot_rounds(table: pd.DataFrame) -> Figure:
    """Leakage over rounds, one panel per family (module docstring); ``none``'s memoryless curve, grey,
    in every other panel for reference."""
    from matplotlib.ticker import MaxNLocator

    order = families(table)
    cols = min(3, max(1, len(order)))
    rows_n = math.ceil(len(order) / cols)
    fig = Figure(figsize=(4 * cols, 2.8 * rows_n), layout="constrained")
    axes = fig.subplots(rows_n, cols, squeeze=False, sharey=True)
    reference = table[table["family"] == "none"]
    for ax, family in zip(axes.flat, order):
        rows = table[table["family"] == family].sort_values("strength", na_position="first")
        if family != "none" and len(reference):
            x, y = _curve(reference["recovered_by_round"].iloc[0])
            ax.plot(x, y, color="0.7", linewidth=2, label="none", zorder=0)
        for j, row in enumerate(rows.itertuples()):
            label = "none" if not math.isfinite(float(row.strength)) else f"{float(row.strength):g}"
            color = _COLORS[(j + 1) % len(_COLORS)]
            for key, dashes in (("recovered_by_round", "-"), ("memory_by_round", "--")):
                x, y = _curve(getattr(row, key))
                if x:
                    ax.plot(x, y, marker="o", linestyle=dashes, color=color, label=label if dashes == "-" else None)
        ax.set_title(family, fontsize=9)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        title = (rows["strength_name"].iloc[0] or None) if len(rows) else None
        ax.legend(fontsize=7, title=title, title_fontsize=7)
    for ax in list(axes.flat)[len(order) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("fraction recovered")
    fig.suptitle(
        "Leakage over rounds:\nmemoryless attacks (solid),\nthe remembering server (dashed)"
        if cols == 1
        else "Leakage over rounds: memoryless attacks (solid), the remembering server (dashed)",
        fontsize=9,
    )
    return fig


def _curve(counts_json: str) -> tuple[list[int], list[float]]:
    """(rounds, fractions recovered) of a {round: [recovered, images]} JSON cell."""
    counts = json.loads(counts_json or "{}")
    return [int(r) for r in counts], [c[0] / c[1] if c[1] else math.nan for c in counts.values()]


# --- the findings, checked on a second configuration --------------------------------------------------------


def at_floor(row) -> bool | None:
    """Whether the setting held this server at its floor: neither the remembering server's count at the end
    nor the best round's memoryless count is above the best update-free guess's count on the same images
    (None when a count is missing)."""
    counts = [float(row.recovered), float(row.best_recovered), float(row.guess_recovered)]
    if not all(math.isfinite(c) for c in counts):
        return None
    return counts[0] <= counts[2] and counts[1] <= counts[2]


def accuracy_cost(table: pd.DataFrame) -> pd.Series:
    """Each setting's final test accuracy below ``none``'s of the same table, in points (NaN without none)."""
    none = table[table["setting"] == "none"]["final_accuracy"]
    base = float(none.iloc[0]) if len(none) else math.nan
    return 100 * (base - table["final_accuracy"].astype(float))


def _words(names: list[str]) -> str:
    return ", ".join(names) if names else "no setting"


def seed_findings_markdown(table: pd.DataFrame, seed: int) -> str:
    """The frontier's findings at one seed, in words, before any second configuration has checked them: the
    settings that held the server at its floor (``at_floor``), cheapest first with their accuracy cost against
    ``none``, those above it, those without a count, and how far ``none`` itself is above its floor (a defense
    can show no more than that margin)."""
    cost = accuracy_cost(table).set_axis(table["setting"])
    held, above, unknown = [], [], []
    for row in table.itertuples():
        if row.setting == "none":
            continue
        floor = at_floor(row)
        if floor is None:
            unknown.append(row.setting)
        elif floor:
            held.append((float(cost[row.setting]), row.setting))
        else:
            above.append(row.setting)
    held.sort(key=lambda pair: (not math.isfinite(pair[0]), pair[0]))
    costs = [f"{name} ({_number(points, '.1f')} points)" for points, name in held]
    lines = [
        f"- **At the floor at seed {seed}** (neither the count at the end nor the best round's above the best "
        f"guess's), cheapest first, with the accuracy each cost against `none`: {_words(costs)}.",
        f"- **Above the floor at seed {seed}**: {_words(above)}.",
    ]
    if unknown:
        lines.append(f"- **No count to judge**: {_words(unknown)}.")
    none = table[table["setting"] == "none"]
    if len(none):
        n = none.iloc[0]
        lines.append(
            f"- **The margin a defense can show**: without a defense the server recovers "
            f"{_count(n.recovered, n.images)} at the end and {_count(n.best_recovered, n.best_images)} in its best "
            f"round, against a best guess of {_count(n.guess_recovered, n.images)}; a setting at the floor removed "
            "that margin, no more. Differences of a few images are inside the intervals: these labels sort the "
            "settings at one seed, they do not separate them."
        )
    return "\n".join(lines) + "\n"


def findings_markdown(first: pd.DataFrame, second: pd.DataFrame, seeds: tuple[int, int]) -> str:
    """The frontier's findings, each checked on the second configuration (``second``, the regime at another
    seed): per setting the two seeds' accuracy cost, counts and whether each held the server at its floor
    (``at_floor``), then the findings in words: the settings at the floor at both seeds with their costs, those
    above it at both, those whose seeds disagree (no finding), ``none``'s margin at both seeds, and the settings
    not run at the second seed yet with the first seed's reading of them (labelled as that seed's only)."""
    a, b = (t.set_index("setting") for t in (first, second))
    cost_a, cost_b = (accuracy_cost(t).set_axis(t["setting"]) for t in (first, second))
    s0, s1 = seeds
    lines = [
        f"| setting | accuracy cost, seed {s0} / {s1} | recovered at the end | best round | best guess "
        f"| at the floor, seed {s0} / {s1} |",
        "|---|---|---|---|---|---|",
    ]
    both, above, differ = [], [], []

    def floor_word(value) -> str:
        return "n/a" if value is None else "yes" if value else "no"

    for name in [n for n in a.index if n in b.index]:
        x, y = a.loc[name], b.loc[name]
        fx, fy = at_floor(x), at_floor(y)
        costs = f"{_number(cost_a[name], '.1f')} / {_number(cost_b[name], '.1f')} points"
        if name == "none":
            costs = f"- (accuracy {_pct(x.final_accuracy)} / {_pct(y.final_accuracy)})"
        lines.append(
            f"| {name} | {costs} | {_count(x.recovered, x.images)} / {_count(y.recovered, y.images)} | "
            f"{_count(x.best_recovered, x.best_images)} / {_count(y.best_recovered, y.best_images)} | "
            f"{_count(x.guess_recovered, x.images)} / {_count(y.guess_recovered, y.images)} | "
            f"{floor_word(fx)} / {floor_word(fy)} |"
        )
        if name == "none":
            continue  # the baseline: its margin is said below, it is no finding
        if fx is None or fy is None or fx != fy:
            differ.append(name)
        elif fx:
            both.append(f"{name} ({_number(cost_a[name], '.1f')} / {_number(cost_b[name], '.1f')} points)")
        else:
            above.append(name)
    missing = [n for n in a.index if n not in b.index]
    lines += [
        "",
        f"- **At the floor at both seeds** (no attacked round beat the best update-free guess), with the accuracy "
        f"each cost (seed {s0} / {s1}): {_words(both)}.",
        f"- **Above the floor at both seeds**: {_words(above)}.",
        f"- **The seeds disagree** (no finding): {_words(differ)}.",
    ]
    if "none" in a.index and "none" in b.index:
        x, y = a.loc["none"], b.loc["none"]
        lines.append(
            f"- **The margin a defense can show** (seed {s0} / {s1}): without a defense the server recovers "
            f"{_count(x.recovered, x.images)} / {_count(y.recovered, y.images)} at the end and "
            f"{_count(x.best_recovered, x.best_images)} / {_count(y.best_recovered, y.best_images)} in its best "
            f"round, against a best guess of {_count(x.guess_recovered, x.images)} / "
            f"{_count(y.guess_recovered, y.images)}; a setting at the floor removed that margin, no more."
        )
    if missing:
        held = sorted((n for n in missing if n != "none" and at_floor(a.loc[n])), key=lambda n: (cost_a[n], n))
        held_words = [f"{n} ({_number(cost_a[n], '.1f')} points)" for n in held]
        rest = [n for n in missing if n not in held and n != "none"]
        lines.append(
            f"- **Not run at seed {s1} yet**, seed {s0}'s reading only: at its floor, cheapest first: "
            f"{_words(held_words)}; above it or without a count: {_words(rest)}."
        )
    else:
        lines.append(f"- **Not run at seed {s1} yet**: no setting.")
    return "\n".join(lines) + "\n"
