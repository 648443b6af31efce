"""Tables and sentences from loaded runs: per round, per client, across runs.

Failed attacks (status "failed") are counted in n_attacks/n_failed and never averaged in.
Metric statistics use the ok rows whose value is a number (lpips may be NaN even when ok).
Leakage is grouped per method, defense and labels source (recovered/oracle), and set against the
model's accuracy of the same round (global_accuracy when the run has it, else eval_accuracy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from fl_attack.evaluation.stats import interval
from fl_attack.schema import percent, whose

from .load import Run

# The verdict first (fl_attack.evaluation.verdict: recovered / k, the fraction singled out, PSNR over the guess).
METRICS = ("recovered_fraction", "reidentified", "psnr_margin", "psnr", "ssim", "fsim", "lpips", "lsim_honest")
METRICS += ("label_accuracy",)
STATS = ("mean", "median", "ci95_low", "ci95_high")
# The range each metric can take (fl_attack/evaluation/metrics.py; lsim is a cosine dissimilarity, attacks/base.py).
# Intervals are clipped to it.
METRIC_RANGES = {
    "recovered_fraction": (0.0, 1.0),
    "reidentified": (0.0, 1.0),
    "psnr_margin": (-100.0, 100.0),
    "psnr": (0.0, 100.0),
    "ssim": (-1.0, 1.0),
    "fsim": (0.0, 1.0),
    "lpips": (0.0, math.inf),
    "lsim_honest": (0.0, 2.0),
    "lsim_calibrated": (0.0, 2.0),
    "label_accuracy": (0.0, 1.0),
}
# Fewer values than this give no interval.
MIN_CI_N = 3
# A run's leakage groups: one row of the summary table each, one line of each plot.
GROUP_KEYS = ["method", "defense", "labels"]
# The model accuracy a round's leakage is set against, in order of preference.
ACCURACY_COLUMNS = ("global_accuracy", "eval_accuracy")
# Known attacks first, in the paper's order; any other method follows alphabetically.
METHOD_ORDER = ("pisme", "nlsme", "sme", "dggi", "ginas", "ig")

# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (used without scipy).
_T975 = (
    12.706204736,
    4.30265273,
    3.182446305,
    2.776445105,
    2.570581836,
    2.446911851,
    2.364624252,
    2.306004135,
    2.262157163,
    2.228138852,
    2.20098516,
    2.17881283,
    2.160368656,
    2.144786688,
    2.131449546,
    2.119905299,
    2.109815578,
    2.10092204,
    2.093024054,
    2.085963447,
    2.079613845,
    2.073873068,
    2.06865761,
    2.063898562,
    2.059538553,
    2.055529439,
    2.051830516,
    2.048407142,
    2.045229642,
    2.042272456,
)


def t_quantile_975(dof: int) -> float:
    """Student's t 0.975 quantile for `dof` >= 1 degrees of freedom (scipy when importable)."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    try:
        from scipy.stats import t
    except ImportError:
        return _t975_fallback(dof)
    return float(t.ppf(0.975, dof))


def _t975_fallback(dof: int) -> float:
    if dof <= len(_T975):
        return _T975[dof - 1]
    # Cornish-Fisher expansion around the normal quantile; error < 1e-6 beyond 30 dof.
    z = 1.959963984540054
    return (
        z
        + (z**3 + z) / (4 * dof)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
    )


def mean_ci95(values, metric: str | None = None) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% t-interval of the mean: mean ± t(0.975, n-1)·sd/√n.

    NaNs are dropped first. mean is NaN for n=0; low and high are NaN for n < MIN_CI_N or when a
    value is infinite (the mean is then inf). With a `metric` of METRIC_RANGES, low and high are
    clipped to its range.
    """
    x = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce").dropna(), dtype="float64")
    n = x.size
    if n == 0:
        return math.nan, math.nan, math.nan
    with np.errstate(invalid="ignore"):
        mean = float(x.mean())
    # Too few values give no trustworthy spread; an infinite value (old runs' PSNR of an exact
    # reconstruction) has no interval.
    if n < MIN_CI_N or not np.isfinite(x).all():
        return mean, math.nan, math.nan
    half = t_quantile_975(n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    bottom, top = METRIC_RANGES.get(metric, (-math.inf, math.inf))
    return mean, min(max(mean - half, bottom), top), max(min(mean + half, top), bottom)


def method_sort_key(method: str) -> tuple[int, str]:
    """Sort key putting pisme, nlsme, sme, dggi, ginas, ig first, then other methods by name."""
    method = str(method)
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def sorted_methods(attacks: pd.DataFrame) -> list[str]:
    """The distinct methods in `attacks`, in METHOD_ORDER."""
    if attacks.empty:
        return []
    return sorted({str(m) for m in attacks["method"].dropna()}, key=method_sort_key)


def _ok(attacks: pd.DataFrame) -> pd.DataFrame:
    return attacks[attacks["status"] == "ok"]


def round_accuracy(rounds: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """(accuracy per round, its column): the first of ACCURACY_COLUMNS with a value; (empty, None) if none."""
    for column in ACCURACY_COLUMNS:
        if column in rounds.columns and rounds[column].notna().any():
            return rounds.dropna(subset=[column]).set_index("round")[column].sort_index(), column
    return pd.Series(dtype="float64"), None


def per_round_columns() -> list[str]:
    """Column names of `per_round`'s table."""
    return (
        ["round", *GROUP_KEYS, "n_attacks", "n_ok", "n_failed"]
        + [f"{metric}_{stat}" for metric in METRICS for stat in STATS]
        + ["accuracy", "accuracy_source"]
    )


def per_round(attacks: pd.DataFrame, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (round, method, defense, labels) leakage statistics, with the model's accuracy that round.

    Input: an attacks table (Run.attacks) and optionally the rounds table (Run.rounds). Output:
    one row per group, sorted, with n_attacks, n_ok, n_failed, for each metric in METRICS
    {metric}_mean, _median, _ci95_low, _ci95_high over ok rows (`mean_ci95`: no interval below
    MIN_CI_N values, clipped to METRIC_RANGES), then accuracy and accuracy_source (the rounds.csv
    column it comes from, see `round_accuracy`; NaN/None without rounds).
    """
    accuracy, source = round_accuracy(rounds) if rounds is not None else (pd.Series(dtype="float64"), None)
    rows = []
    if not attacks.empty:
        for (round_, *keys), group in attacks.groupby(["round", *GROUP_KEYS], sort=False, dropna=False):
            ok = _ok(group)
            row = {
                "round": round_,
                **dict(zip(GROUP_KEYS, keys)),
                "n_attacks": len(group),
                "n_ok": len(ok),
                "n_failed": int((group["status"] == "failed").sum()),
                "accuracy": accuracy.get(round_, math.nan),
                "accuracy_source": source,
            }
            for metric in METRICS:
                values = ok[metric].dropna()
                mean, low, high = mean_ci95(values, metric)
                row.update(
                    {
                        f"{metric}_mean": mean,
                        f"{metric}_median": float(values.median()) if len(values) else math.nan,
                        f"{metric}_ci95_low": low,
                        f"{metric}_ci95_high": high,
                    }
                )
            rows.append(row)
    table = pd.DataFrame(rows, columns=per_round_columns())
    return _sort_round_method(table)


def _sort_round_method(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table.astype({"n_attacks": "int64", "n_ok": "int64", "n_failed": "int64"})
    order = table["method"].map(method_sort_key)
    table = table.assign(_order=order).sort_values(["round", "_order", "defense", "labels"], kind="stable")
    return table.drop(columns="_order").reset_index(drop=True)


PER_CLIENT_COLUMNS = [
    "partition_id",
    "method",
    "rounds_attacked",
    "n_ok",
    "n_failed",
    "first_round",
    "last_round",
    "k",
    "recovered_first",
    "recovered_last",
    "recovered_max",
    "psnr_mean",
    "psnr_min",
    "psnr_max",
    "psnr_first",
    "psnr_last",
]


def per_client(attacks: pd.DataFrame) -> pd.DataFrame:
    """Per (partition_id, method) leakage over the run.

    Output columns PER_CLIENT_COLUMNS: rounds_attacked (distinct rounds with an attack row, failed
    included), n_ok, n_failed, first_round/last_round attacked, k and the images recovered in the
    first/last attacked round and at most (fl_attack.evaluation.verdict), psnr mean/min/max over ok rows,
    psnr_first/psnr_last: mean ok psnr in the first/last attacked round (NaN when that attack failed).
    """
    rows = []
    if not attacks.empty:
        for (partition, method), group in attacks.groupby(["partition_id", "method"], sort=False, dropna=False):
            ok = _ok(group)
            psnr = ok["psnr"].dropna()
            first, last = group["round"].min(), group["round"].max()
            rows.append(
                {
                    "partition_id": partition,
                    "method": method,
                    "rounds_attacked": group["round"].nunique(),
                    "n_ok": len(ok),
                    "n_failed": int((group["status"] == "failed").sum()),
                    "first_round": first,
                    "last_round": last,
                    "k": ok["k"].max() if ok["k"].notna().any() else math.nan,
                    "recovered_first": _mean_or_nan(ok.loc[ok["round"] == first, "recovered"]),
                    "recovered_last": _mean_or_nan(ok.loc[ok["round"] == last, "recovered"]),
                    "recovered_max": ok["recovered"].max() if ok["recovered"].notna().any() else math.nan,
                    "psnr_mean": psnr.mean() if len(psnr) else math.nan,
                    "psnr_min": psnr.min() if len(psnr) else math.nan,
                    "psnr_max": psnr.max() if len(psnr) else math.nan,
                    "psnr_first": _mean_or_nan(ok.loc[ok["round"] == first, "psnr"]),
                    "psnr_last": _mean_or_nan(ok.loc[ok["round"] == last, "psnr"]),
                }
            )
    table = pd.DataFrame(rows, columns=PER_CLIENT_COLUMNS)
    if table.empty:
        return table
    table = table.assign(_order=table["method"].map(method_sort_key))
    table = table.sort_values(["_order", "partition_id"], kind="stable", na_position="last")
    return table.drop(columns="_order").reset_index(drop=True)


def _mean_or_nan(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.mean()) if len(values) else math.nan


def _sum_or_nan(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.sum()) if len(values) else math.nan


def run_labels(runs: Sequence[Run]) -> list[str]:
    """One distinct label per run: its name, with " (folder)" added where names repeat."""
    names = [run.name for run in runs]
    labels = []
    for run in runs:
        label = run.name
        if names.count(run.name) > 1:
            label = f"{run.name} ({run.path})"
        labels.append(label)
    # Same name and same folder given twice: number them.
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label} #{seen[label]}"
    return labels


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing_keys(runs: Sequence[Run]) -> list[str]:
    """run_config keys whose value is not the same in every run (missing counts as a value)."""
    keys: list[str] = []
    for run in runs:
        keys += [key for key in run.run_config if key not in keys]
    differing = []
    for key in keys:
        values = {_canonical(run.run_config[key]) if key in run.run_config else "<missing>" for run in runs}
        if len(values) > 1:
            differing.append(key)
    return differing


COMPARE_COLUMNS = [
    "name",
    "dataset",
    "methods",
    "rounds",
    "n_attacks",
    "n_failed",
    "psnr_mean",
    "ssim_mean",
    "lpips_mean",
    "label_accuracy_mean",
    "final_accuracy",
    "accuracy_source",
]


def final_accuracy(run: Run) -> tuple[float, str | None]:
    """(accuracy of the last round that has one, its column): see `round_accuracy`; (NaN, None) when none."""
    accuracy, source = round_accuracy(run.rounds)
    return (float(accuracy.iloc[-1]), source) if source is not None else (math.nan, None)


def rounds_seen(run: Run) -> int:
    """The highest round number in rounds.csv or attacks.csv (0 when both are empty)."""
    rounds = [frame["round"].max() for frame in (run.rounds, run.attacks) if not frame.empty]
    return int(max(rounds)) if rounds else 0


def compare_runs(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per run: COMPARE_COLUMNS, then one column per differing run_config key.

    Means are over ok attacks. name is `run_labels` (distinct). dataset comes from the run
    config, else from attacks.csv. Keys equal in all runs get no column; a key that differs but
    is already a fixed column ("dataset") is not repeated. Raises ValueError for no runs.
    """
    if not runs:
        raise ValueError("compare_runs needs at least one run")
    keys = [key for key in differing_keys(runs) if key not in COMPARE_COLUMNS]
    rows = []
    for label, run in zip(run_labels(runs), runs):
        attacks = run.attacks
        ok = _ok(attacks)
        dataset = run.run_config.get("dataset")
        if dataset is None and not attacks.empty and attacks["dataset"].notna().any():
            dataset = ", ".join(sorted({str(d) for d in attacks["dataset"].dropna()}))
        row = {
            "name": label,
            "dataset": dataset,
            "methods": ", ".join(sorted_methods(attacks)),
            "rounds": rounds_seen(run),
            "n_attacks": len(attacks),
            "n_failed": int((attacks["status"] == "failed").sum()) if not attacks.empty else 0,
        }
        for metric in ("psnr", "ssim", "lpips", "label_accuracy"):
            row[f"{metric}_mean"] = _mean_or_nan(ok[metric]) if not ok.empty else math.nan
        row["final_accuracy"], row["accuracy_source"] = final_accuracy(run)
        for key in keys:
            value = run.run_config.get(key)
            row[key] = _canonical(value) if isinstance(value, (list, dict)) else value
        rows.append(row)
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS + keys)


def _fmt(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}"


def _accuracy_text(value: float) -> str:
    # Flower reports accuracy as a fraction; show it as a percentage then.
    return f"{value * 100:.1f}%" if 0.0 <= value <= 1.0 else f"{value:.3g}"


SUMMARY_COLUMNS = [
    *GROUP_KEYS,
    "rounds_attacked",
    "n_ok",
    "n_failed",
    "recovered",
    "images",
    "guess_recovered",
    "reidentified_mean",
    "reid_chance_mean",
    "psnr_margin_mean",
    "psnr_first",
    "psnr_last",
    "psnr_mean",
    "guess_psnr_mean",
    "psnr_best",
    "ssim_mean",
    "guess_ssim_mean",
    "lpips_mean",
    "guess_lpips_mean",
    "label_accuracy_mean",
    "accuracy_source",
    "psnr_accuracy_corr",
    "psnr_trend",
]


def summary_table(run: Run) -> pd.DataFrame:
    """One row per (method, defense, labels) group of the run's attacks: SUMMARY_COLUMNS.

    rounds_attacked: distinct rounds with an attack row (failed included); recovered / images /
    guess_recovered: the verdict's counts summed over the ok attacks that have one (fl_attack.evaluation.verdict),
    reidentified_mean, reid_chance_mean, psnr_margin_mean their means, guess_*_mean the floor's
    scores beside PSNR, SSIM and LPIPS; psnr_first/psnr_last:
    mean ok PSNR in the first/last attacked round (NaN when none was ok); psnr_mean/psnr_best:
    mean/max over ok attacks; psnr_accuracy_corr: Pearson correlation over rounds of the round's
    mean PSNR with the model's accuracy (column accuracy_source); psnr_trend: least-squares slope
    of the round's mean PSNR in dB per round. Both need MIN_CI_N rounds, else NaN.
    """
    rows = []
    for keys, attacks in run.attacks.groupby(GROUP_KEYS, sort=False, dropna=False):
        ok = _ok(attacks)
        psnr = ok["psnr"].dropna()
        by_round = per_round(attacks, run.rounds)
        rows.append(
            {
                **dict(zip(GROUP_KEYS, keys)),
                "rounds_attacked": attacks["round"].nunique(),
                "n_ok": len(ok),
                "n_failed": int((attacks["status"] == "failed").sum()),
                "recovered": _sum_or_nan(ok["recovered"]),
                "images": _sum_or_nan(ok["k"].where(ok["recovered"].notna())),
                "guess_recovered": _sum_or_nan(ok["guess_recovered"]),
                **{f"{m}_mean": _mean_or_nan(ok[m]) for m in ("reidentified", "reid_chance", "psnr_margin")},
                "psnr_first": by_round["psnr_mean"].iloc[0],
                "psnr_last": by_round["psnr_mean"].iloc[-1],
                "psnr_mean": _mean_or_nan(psnr),
                "psnr_best": psnr.max() if len(psnr) else math.nan,
                **{f"{m}_mean": _mean_or_nan(ok[m]) for m in ("ssim", "lpips", "label_accuracy")},
                **{f"guess_{m}_mean": _mean_or_nan(ok[f"guess_{m}"]) for m in ("psnr", "ssim", "lpips")},
                "accuracy_source": by_round["accuracy_source"].iloc[0],
                "psnr_accuracy_corr": _fit(by_round["accuracy"], by_round["psnr_mean"], "corr"),
                "psnr_trend": _fit(by_round["round"], by_round["psnr_mean"], "slope"),
            }
        )
    table = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    if table.empty:
        return table
    table = table.assign(_order=table["method"].map(method_sort_key))
    table = table.sort_values(["_order", "defense", "labels"], kind="stable", na_position="last")
    return table.drop(columns="_order").reset_index(drop=True)


def _fit(x: pd.Series, y: pd.Series, what: str) -> float:
    """Pearson correlation ("corr") or least-squares slope of y on x ("slope") over the finite
    pairs; NaN for fewer than MIN_CI_N pairs or no spread."""
    keep = np.isfinite(x.to_numpy(dtype=float)) & np.isfinite(y.to_numpy(dtype=float))
    x, y = x[keep].to_numpy(dtype=float), y[keep].to_numpy(dtype=float)
    if len(x) < MIN_CI_N or x.std() == 0 or (what == "corr" and y.std() == 0):
        return math.nan
    return float(np.corrcoef(x, y)[0, 1]) if what == "corr" else float(np.polyfit(x, y, 1)[0])


def summary_sentences(run: Run, threshold: float = 20.0) -> list[str]:
    """A few plain-language findings for one run (the numbers per group are in `summary_table`).

    First the verdict per method (``verdict_sentence``: images recovered against the guess without
    the update), then one PSNR sentence per method (or "No attacks yet: ..." for a run without
    attack rows), the model's final accuracy, and a note when fewer rounds finished than configured.
    threshold: the PSNR (dB) the PSNR sentence counts attacks above.
    """
    attacks = run.attacks
    sentences = verdict_sentences(attacks)
    limit = f"{threshold:g} dB"
    if attacks.empty:
        sentences.append("No attacks yet: attacks.csv has no rows.")
    for method in sorted_methods(attacks):
        group = attacks[attacks["method"] == method]
        ok = _ok(group)
        psnr = ok["psnr"].dropna()
        above = int((psnr > threshold).sum())
        n_rounds = group["round"].nunique()
        text = (
            f"Overall, {method} exceeded {limit} in {above} of {len(group)} attacks "
            f"over {n_rounds} round{'s' if n_rounds != 1 else ''}"
        )
        if len(psnr):
            by_round = ok.groupby("round")["psnr"].mean().dropna()
            best_round = int(by_round.idxmax())
            text += f"; mean PSNR {_fmt(psnr.mean())} dB, best round {best_round} (mean {_fmt(by_round.max())} dB)."
        else:
            text += "; no attack produced a PSNR."
        sentences.append(text)
    accuracy, source = round_accuracy(run.rounds)
    if source is not None:
        sentences.append(
            f"Model utility: {source.replace('_', ' ')} {_accuracy_text(accuracy.iloc[-1])} "
            f"after round {int(accuracy.index[-1])}."
        )
    planned = run.run_config.get("num-server-rounds")
    finished = int(run.rounds["round"].max()) if not run.rounds.empty else 0
    if isinstance(planned, (int, float)) and finished < planned:
        sentences.append(f"Incomplete run: {finished} of {int(planned)} configured rounds in rounds.csv.")
    return sentences


def verdict_sentence(attacks: pd.DataFrame, method: str) -> str | None:
    """The verdict of one method's ok attacks (fl_attack.evaluation.verdict) in a reader's words, None when no
    row has one (an older run). A remembering server's rows (METHOD+memory) say what it holds at the
    end for each tracked client; the others sum the images recovered over the attacks."""
    ok = _ok(attacks[attacks["method"] == method])
    ok = ok[ok["recovered"].notna() & ok["k"].notna()]
    if ok.empty:
        return None
    best = ok.loc[ok["recovered"].idxmax()]
    chance = percent(float(ok["reid_chance"].mean()))
    margin = float(ok["psnr_margin"].mean())
    tail = (
        f"singled out {percent(float(ok['reidentified'].mean()))} (chance {chance}); "
        f"PSNR {abs(margin):.1f} dB {'over' if margin >= 0 else 'under'} the guess on average"
    )
    if method.endswith("+memory"):
        last = ok.sort_values("round", kind="stable").groupby("client_id", sort=False, dropna=False).tail(1)
        held = ", ".join(
            f"{int(r['recovered'])} of {int(r['k'])} images of {whose(r)} after round {int(r['round'])}"
            for _, r in last.sort_values("partition_id", kind="stable").iterrows()
        )
        return f"{method}: the remembering server holds {held}; {tail}."
    recovered, images = int(ok["recovered"].sum()), int(ok["k"].sum())
    low, high = interval(recovered, images)
    return (
        f"{method}: {recovered} of {images} attacked images recovered (95%: {math.floor(low * images + 1e-9)}-"
        f"{math.ceil(high * images - 1e-9)}) over "
        f"{len(ok)} attack{'s' if len(ok) != 1 else ''} (a guess without the update: "
        f"{int(ok['guess_recovered'].sum())}); the most, {int(best['recovered'])} of {int(best['k'])}, "
        f"of {whose(best)} in round {int(best['round'])}; {tail}{_trend_sentence(ok)}."
    )


def _trend_sentence(ok: pd.DataFrame) -> str:
    """ "; a lower bound: the count was still rising at the end in 2 of 3 attacks" (or "; every count
    converged within its schedule") from the rows' count_trend; "" where no row has one (older runs)."""
    if "count_trend" not in ok:
        return ""
    trends = ok["count_trend"].fillna("").astype(str)
    judged = trends[trends != ""]
    if judged.empty:
        return ""
    rising = int((judged == "still rising").sum())
    if rising:
        return f"; a lower bound: the count was still rising at the end in {rising} of {len(judged)} attacks"
    return "; every count converged within its schedule"


def verdict_sentences(attacks: pd.DataFrame) -> list[str]:
    """``verdict_sentence`` of each method that has a verdict, in the methods' order."""
    return [text for method in sorted_methods(attacks) if (text := verdict_sentence(attacks, method))]
