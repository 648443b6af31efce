"""The leakage-over-rounds study of 2026-12-01 and the privacy-budget study of 2026-12-02, each on its dated page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from .core import _frac, _head, _read, _signed, _table, _two

LEAKAGE_PAGE = Path("docs/leakage-over-rounds-2026-12-01.md")
LEAKAGE = Path("docs/leakage-over-rounds-2026-12-01")  # the study's study.csv and the paper-size replays' rows
MEMORY_VERDICT = Path("docs/attacker-memory/verdict/attacks.csv")  # seed-0 keep+aux federation with the verdict
MEMORY_SEED0 = Path("docs/attacker-memory/seed0-keep-aux/attacks.csv")  # the same federation before the verdict
DEFENSES_2026_PAGE = Path("docs/defenses-2026-12.md")
DEFENSES_VERDICT = Path("docs/defenses-verdict/defenses.csv")


# --- the leakage-over-rounds study of 2026-12-01 ------------------------------------------------------------


def _per_round(study: pd.DataFrame, run: str, method: str, column: str) -> pd.Series:
    rows = study[(study["run"] == run) & (study["method"] == method)]
    if rows.empty:
        raise ValueError(f"{LEAKAGE / 'study.csv'} has no rows of run {run!r}, method {method!r}")
    return rows.set_index("round")[column]


def _leakage_table(dataset: str, rounds: list[int], rows: list[tuple[str, str, str, str, Callable]]) -> str:
    """The per-round table of one dataset of study.csv: each row (its title, run, method, column, format) at
    ``rounds`` and its mean over every round of the run."""
    study = _read(LEAKAGE / "study.csv")
    out = []
    for title, run, method, column, fmt in rows:
        series = _per_round(study, f"{dataset}{run}", method, column)
        mean = {"global_accuracy": "", "psnr": f"{series.mean():.2f}"}.get(column, fmt(series.mean()))
        out.append([title, *(fmt(series[r]) for r in rounds), mean])
    last = int(study[study["run"] == dataset]["round"].max())
    header = ["round", *map(str, rounds), f"mean 1–{last}"]
    return _head(LEAKAGE / "study.csv", page=LEAKAGE_PAGE) + "\n" + _table(header, out)


def leakage_femnist() -> str:
    """The FEMNIST table: accuracy, PSNR per method and label source, label accuracy; the mean LPIPS."""
    psnr = lambda x: f"{x:.1f}"
    block = _leakage_table(
        "femnist",
        [1, 2, 3, 4, 5, 8, 10, 12, 15],
        [
            ("global accuracy", "", "pisme", "global_accuracy", _frac),
            ("PI-SME PSNR (dB)", "", "pisme", "psnr", psnr),
            ("SME PSNR", "/sme-ig", "sme", "psnr", psnr),
            ("IG PSNR", "/sme-ig", "ig", "psnr", psnr),
            ("PI-SME, oracle labels", "/pisme-oracle", "pisme", "psnr", psnr),
            ("PI-SME, `support` labels", "/pisme-support", "pisme", "psnr", psnr),
            ("label accuracy, paper estimator", "", "pisme", "label_accuracy", _two),
            ("label accuracy, `support`", "/pisme-support", "pisme", "label_accuracy", _two),
        ],
    )
    study = _read(LEAKAGE / "study.csv")
    lpips = [
        (title, _per_round(study, run, method, "lpips").mean())
        for title, run, method in (
            ("PI-SME", "femnist", "pisme"),
            ("SME", "femnist/sme-ig", "sme"),
            ("IG", "femnist/sme-ig", "ig"),
            ("PI-SME with `support` labels", "femnist/pisme-support", "pisme"),
            ("PI-SME with oracle labels", "femnist/pisme-oracle", "pisme"),
        )
    ]
    return (
        block + "\n\nMean LPIPS over the 15 rounds (lower is more similar): "
        f"{', '.join(f'{title} {value:.3f}' for title, value in lpips)}."
    )


def leakage_cifar100() -> str:
    psnr = lambda x: f"{x:.1f}"
    return _leakage_table(
        "cifar100",
        [1, 2, 3, 5, 8, 10, 12, 15],
        [
            ("global accuracy", "", "pisme", "global_accuracy", _frac),
            ("PI-SME PSNR (dB)", "", "pisme", "psnr", psnr),
            ("SME PSNR", "/sme-ig", "sme", "psnr", psnr),
            ("IG PSNR", "/sme-ig", "ig", "psnr", psnr),
            ("PI-SME, oracle labels", "/pisme-oracle", "pisme", "psnr", psnr),
            ("label accuracy (paper)", "", "pisme", "label_accuracy", _two),
        ],
    )


def leakage_verdict() -> str:
    """The memoryless PI-SME rows of the remembering-server federation with the verdict, mean over its
    tracked writers per round: images recovered, the share singled out, PSNR over the best guess."""
    rows = _read(MEMORY_VERDICT)
    mean = rows[rows["method"] == "pisme"].groupby("round")[["recovered", "k", "reidentified", "psnr_margin"]].mean()
    rounds = [1, 2, 3, 4, 5, 8, 10, 12, 15]
    k = int(mean["k"].max())
    table = _table(
        ["round", *map(str, rounds)],
        [
            [f"images recovered (of {k})", *(f"{mean.loc[r, 'recovered']:.1f}" for r in rounds)],
            ["singled out", *(f"{100 * mean.loc[r, 'reidentified']:.0f}%" for r in rounds)],
            ["PSNR over the guess (dB)", *(_signed(mean.loc[r, "psnr_margin"]) for r in rounds)],
        ],
    )
    return _head(MEMORY_VERDICT, page=LEAKAGE_PAGE) + "\n" + table


def leakage_paper_size() -> str:
    """Rounds 1, 5 and 15 of three writers: the run's own PI-SME (m=3, 200 it.) against the replays at the
    paper's size (paper-size/*-attacks.csv), mean over the writers."""
    size = LEAKAGE / "paper-size"
    records = [MEMORY_SEED0, size / "big-pisme-attacks.csv", size / "small-ig-attacks.csv", size / "big-ig-attacks.csv"]
    rounds = [1, 5, 15]
    means = []
    for record in records:
        rows = _read(record)
        rows = rows[rows["method"].isin(["pisme", "ig"]) & rows["round"].isin(rounds)]
        means.append(rows.groupby("round")[["psnr", "ssim", "lpips"]].mean())
    own, pisme, small_ig, ig = means
    table = _table(
        [
            "round",
            "PI-SME m=3, 200 it.",
            "PI-SME m=7, 1,000 it.",
            "IG 200 it.",
            "IG 1,000 it.",
            "SSIM: PI-SME / IG at 1,000",
            "LPIPS: PI-SME / IG at 1,000",
        ],
        [
            [
                str(r),
                *(f"{m.loc[r, 'psnr']:.2f}" for m in (own, pisme, small_ig, ig)),
                f"{pisme.loc[r, 'ssim']:.3f} / {ig.loc[r, 'ssim']:.3f}",
                f"{pisme.loc[r, 'lpips']:.3f} / {ig.loc[r, 'lpips']:.3f}",
            ]
            for r in rounds
        ],
    )
    return _head(*records, page=LEAKAGE_PAGE) + "\n" + table


# --- docs/privacy-budget-2026-12-02.md: the privacy-budget study of 2026-12-02 ----------------------------------

PRIVACY_BUDGET_PAGE = Path("docs/privacy-budget-2026-12-02.md")  # its dated page
PRIVACY_BUDGET = Path("docs/privacy-budget/defenses.csv")  # analysis.defenses --grid privacy, seed 0
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _epsilon(x: float) -> str:
    """11.5, 586, 1,752, 5.5·10⁴ (from 10,000 on), '-' for none."""
    if pd.isna(x):
        return "-"
    if x >= 1e4:
        mantissa, exponent = f"{x:.1e}".split("e")
        return f"{mantissa}·10{str(int(exponent)).translate(_SUPERSCRIPT)}"
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def privacy_budget() -> str:
    """One row per setting of defenses.csv: the ε spent (RDP, δ = 1e-5; local-dp: the most-spent client's),
    the means over the ok memoryless attacks and the remembering server's PSNR, the final test accuracy."""
    rows = _read(PRIVACY_BUDGET)
    pct = lambda x: f"{100 * x:.1f}%"
    table = _table(
        [
            "setting",
            "defense",
            "attacks ok",
            "ε spent after 10 rounds (RDP, δ = 1e-5)",
            "PI-SME PSNR (dB)",
            "SSIM",
            "LPIPS",
            "label acc.",
            "+memory PSNR",
            "final test acc.",
        ],
        [
            [
                r.setting,
                f"`{r.defense}`",
                r.attacks,
                _epsilon(r.epsilon),
                f"{r.psnr:.2f}",
                f"{r.ssim:.3f}",
                f"{r.lpips:.3f}",
                pct(r.label_accuracy),
                f"{r.psnr_memory:.2f}",
                pct(r.final_accuracy),
            ]
            for r in rows.itertuples()
        ],
    )
    return _head(PRIVACY_BUDGET, page=PRIVACY_BUDGET_PAGE) + "\n" + table


BLOCKS: dict[Path, dict[str, Callable[[], str]]] = {
    PRIVACY_BUDGET_PAGE: {"privacy-budget": privacy_budget},
    LEAKAGE_PAGE: {
        "leakage-femnist": leakage_femnist,
        "leakage-verdict": leakage_verdict,
        "leakage-paper-size": leakage_paper_size,
        "leakage-cifar100": leakage_cifar100,
    },
}
