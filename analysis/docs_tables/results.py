"""docs/results.md's tables of the fair-scale study (docs/fair-scale/*.csv, the paper's k=50): PSNR as
mean ± variance over the clients, and paired differences on the same victim with their spread."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.paper_values import PAPER_MARGIN

from .core import records_table

PAGE = Path("docs/results.md")
FAIR = Path("docs/fair-scale")
DATASETS = {"femnist": "FEMNIST", "cifar100": "CIFAR-100"}
PAIR = ["client", "seed"]  # one victim


def _signed(x: float) -> str:
    """+0.87, −0.30 (a typographic minus), 0.00."""
    text = f"{x:+.2f}"
    return "0.00" if text in ("+0.00", "-0.00") else text.replace("-", "−")


def _mean_var(rows: pd.DataFrame) -> str:
    """PSNR's mean ± its (sample) variance over the rows' victims."""
    return f"{rows['psnr'].mean():.2f} ± {rows['psnr'].var():.2f}"


def _gain(better: pd.DataFrame, other: pd.DataFrame) -> pd.Series:
    """``better``'s PSNR minus ``other``'s on each victim both attacked."""
    both = better.set_index(PAIR)["psnr"] - other.set_index(PAIR)["psnr"]
    if both.isna().any() or both.empty:
        raise ValueError("the two arms do not attack the same victims")
    return both


def _gain_cells(better, other) -> tuple:
    """The (mean, min .. max) cells of the paired difference of the arms picked by ``better`` and ``other``
    from a group (functions of the group's frame)."""

    def mean(group: pd.DataFrame) -> str:
        return _signed(_gain(better(group), other(group)).mean())

    def spread(group: pd.DataFrame) -> str:
        gain = _gain(better(group), other(group))
        return f"{_signed(gain.min())} .. {_signed(gain.max())}"

    return mean, spread


def _method(name: str):
    return lambda group: group[group["method"] == name]


def _margin(classes) -> str:
    """The paper's PI-SME - NL-SME margin at ``classes`` (Fig. 2, its text), "–" where it gives none."""
    return f"{PAPER_MARGIN[classes]:+.1f}" if classes in PAPER_MARGIN else "–"


def class_deficiency() -> str:
    record = FAIR / "class-deficiency.csv"
    mean, spread = _gain_cells(_method("pisme"), _method("nlsme"))
    return records_table(
        PAGE,
        record,
        [
            ("labels", lambda g: g["labels"].iloc[0]),
            ("C", lambda g: str(g["classes"].iloc[0])),
            ("distinct labels in k=50", lambda g: f"{g['distinct_labels'].mean():.0f}"),
            *(
                (title, lambda g, m=m: _mean_var(g[g["method"] == m]))
                for title, m in (("SME", "sme"), ("NL-SME", "nlsme"), ("PI-SME", "pisme"))
            ),
            ("PI-SME − NL-SME", mean),
            ("spread", spread),
            ("paper margin", lambda g: _margin(g["paper_classes"].iloc[0])),
        ],
        by=["labels", "classes"],
        rows=[(labels, c) for labels in ("recovered", "oracle") for c in (10, 30, 100)],
    )


def matched_compute() -> str:
    record = FAIR / "matched-compute.csv"
    frame = pd.read_csv(Path(__file__).resolve().parents[2] / record)
    pisme = {key: rows for key, rows in frame[frame["method"] == "pisme"].groupby(["dataset", "paper_T"])}
    one = lambda g: pisme[(g["dataset"].iloc[0], g["paper_T"].iloc[0])]  # noqa: E731 - the cell's PI-SME arm
    mean, spread = _gain_cells(one, lambda g: g)

    def is_pisme(g: pd.DataFrame) -> bool:
        return g["method"].iloc[0] == "pisme"

    return records_table(
        PAGE,
        record,
        [
            ("dataset", lambda g: DATASETS[g["dataset"].iloc[0]]),
            ("T", lambda g: str(g["paper_T"].iloc[0])),
            ("method", lambda g: f"PI-SME (m={g['nodes'].iloc[0]})" if is_pisme(g) else "NL-SME"),
            ("iterations", lambda g: str(g["iterations"].iloc[0])),
            ("node-gradient evals", lambda g: f"{g['gradient_evaluations'].mean():.0f}"),
            ("PSNR", _mean_var),
            ("PI-SME − this", lambda g: "–" if is_pisme(g) else mean(g)),
            ("spread", lambda g: "–" if is_pisme(g) else spread(g)),
            ("honest Lsim", lambda g: f"{g['lsim_honest'].mean():.4f}"),
            ("calibrated Lsim", lambda g: f"{g['lsim_calibrated'].mean():.4f}"),
        ],
        by=["dataset", "paper_T", "method", "iterations"],
        rows=[
            (d, t, m, i)
            for d in DATASETS
            for t in (100, 250)
            for m, i in (("pisme", 300), ("nlsme", 300), ("nlsme", 1500), ("nlsme", 2100))
        ],
    )


def node_sweep() -> str:
    record = FAIR / "node-sweep.csv"
    frame = pd.read_csv(Path(__file__).resolve().parents[2] / record)
    seven = {d: rows for d, rows in frame[frame["nodes"] == 7].groupby("dataset")}
    mean, spread = _gain_cells(lambda g: g, lambda g: seven[g["dataset"].iloc[0]])
    is_seven = lambda g: g["nodes"].iloc[0] == 7  # noqa: E731
    return records_table(
        PAGE,
        record,
        [
            ("dataset", lambda g: DATASETS[g["dataset"].iloc[0]]),
            ("m", lambda g: str(g["nodes"].iloc[0])),
            ("PSNR", _mean_var),
            ("vs m=7 (dB)", lambda g: "–" if is_seven(g) else mean(g)),
            ("spread", lambda g: "–" if is_seven(g) else spread(g)),
            ("honest Lsim", lambda g: f"{g['lsim_honest'].mean():.4f}"),
            ("calibrated Lsim", lambda g: f"{g['lsim_calibrated'].mean():.4f}"),
            ("s/iteration", lambda g: f"{g['seconds_per_iteration'].mean():.2f}"),
        ],
        by=["dataset", "nodes"],
        rows=[(d, m) for d in DATASETS for m in (1, 2, 3, 7)],
    )


BLOCKS = {
    PAGE: {
        "results-fair-class-deficiency": class_deficiency,
        "results-fair-matched-compute": matched_compute,
        "results-fair-node-sweep": node_sweep,
    }
}
