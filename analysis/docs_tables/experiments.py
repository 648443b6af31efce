"""docs/results.md's tables of the CPU-scale and paper-scale experiments (docs/experiments/cpu, paper,
table1-fair, table1-dimitrov, prior-option): each cell as the experiment's own report writes it (mean ±
sample variance over the cell's attacks, a lone attack's value alone), from its committed CSV."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.paper_values import PAPER_MARGIN, PAPER_OTHER

from .core import ROOT, _head, _read, _table, records_table

PAGE = Path("docs/results.md")
EXP = Path("docs/experiments")
DATASETS = {"femnist": "FEMNIST", "cifar100": "CIFAR-100"}
LABELS = {  # analysis.experiments.table1.LABELS
    "ig": "IG",
    "ginas": "GI-NAS",
    "dggi": "DGGI",
    "sme": "SME",
    "nlsme": "NL-SME",
    "pisme": "PI-SME",
    "dimitrov": "Dimitrov et al.",
}
CELLS = [(d, t) for d in DATASETS for t in (100, 250)]


def _pm(values: pd.Series) -> str:
    """'mean ± sample variance' (analysis.experiments.common.pm): the mean alone for one value."""
    return f"{values.mean():.2f}" if len(values) < 2 else f"{values.mean():.2f} ± {values.var():.2f}"


def _mean(column: str, digits: int):
    return lambda g: f"{g[column].mean():.{digits}f}"


def _signed(x: float) -> str:
    """+0.95, −0.71 (a typographic minus)."""
    text = f"{x:+.2f}"
    return "0.00" if text in ("+0.00", "-0.00") else text.replace("-", "−")


def _paired(rows: pd.DataFrame, a: str, b: str) -> pd.Series:
    """PSNR of method ``a`` minus that of ``b`` on each victim (client, seed) both attacked."""
    psnr = rows.pivot_table(index=["client", "seed"], columns="method", values="psnr")
    return (psnr[a] - psnr[b]).dropna()


# --- Table 1 with all six rows (table1-fair, 5 clients a cell) ----------------------------------------------


def table1_six() -> str:
    def method(name: str):
        def cell(g: pd.DataFrame) -> str:
            rows = g[g["method"] == name]
            paper = rows["paper_psnr"].iloc[0]
            return f"{_pm(rows['psnr'])} ({'–' if pd.isna(paper) else f'{paper:.2f}'})"

        return cell

    return records_table(
        PAGE,
        EXP / "table1-fair" / "table1.csv",
        [
            ("dataset", lambda g: DATASETS[g["dataset"].iloc[0]]),
            ("T", lambda g: str(g["local_steps"].iloc[0])),
            *((LABELS[m], method(m)) for m in ("ig", "ginas", "dggi", "sme", "nlsme", "pisme")),
        ],
        by=["dataset", "paper_T"],
        rows=CELLS,
    )


# --- Dimitrov et al. beside PI-SME on the same victims (table1-dimitrov) ------------------------------------


def _seconds(x: float) -> str:
    """123, 1,503 (whole seconds from 100 on), 8.8, 31 (two significant figures below)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.2g}"


def dimitrov() -> str:
    def victims(g: pd.DataFrame) -> pd.DataFrame:
        """The cell's rows on the clients Dimitrov et al.'s attack ran on."""
        return g[g["client"].isin(g.loc[g["method"] == "dimitrov", "client"])]

    def of(method: str, column: str, g: pd.DataFrame) -> float:
        rows = victims(g)
        return rows.loc[rows["method"] == method, column].mean()

    def gain(g: pd.DataFrame) -> str:
        d = _paired(victims(g), "dimitrov", "pisme")
        return f"{_signed(d.mean())} ({_signed(d.min())} .. {_signed(d.max())})"

    def ahead(g: pd.DataFrame) -> str:
        d = _paired(victims(g), "dimitrov", "pisme")
        return f"{(d > 0).sum()} of {len(d)}"

    def clients(g: pd.DataFrame) -> str:
        ran = g.loc[g["method"] == "dimitrov", "client"]
        return f"{ran.min()}–{ran.max()}"

    return records_table(
        PAGE,
        EXP / "table1-dimitrov" / "table1.csv",
        [
            ("dataset", lambda g: DATASETS[g["dataset"].iloc[0]]),
            ("T", lambda g: str(g["local_steps"].iloc[0])),
            ("clients", clients),
            ("Dimitrov et al.", lambda g: f"{of('dimitrov', 'psnr', g):.2f}"),
            ("PI-SME", lambda g: f"{of('pisme', 'psnr', g):.2f}"),
            ("Dimitrov − PI-SME, per client", gain),
            ("ahead", ahead),
            (
                "s per attack: Dimitrov / PI-SME",
                lambda g: f"{_seconds(of('dimitrov', 'seconds', g))} / {_seconds(of('pisme', 'seconds', g))}",
            ),
        ],
        by=["dataset", "paper_T"],
        rows=CELLS,
    )


# --- the diffusion prior for PI-SME and SME (prior-option, paired with table1-fair) -------------------------

PRIOR = EXP / "prior-option"


def prior_option() -> str:
    """docs/experiments/prior-option/pair.py's table: each prior run's PSNR minus table1-fair's on the same
    victim (dataset, T, client, method)."""
    base = EXP / "table1-fair" / "table1.csv"
    runs = [PRIOR / f"{d}-E{e}-prior" / "results.csv" for d in DATASETS for e in (50, 125)]
    without = _read(base).set_index(["dataset", "local_steps", "client", "method"])["psnr"]
    body = []
    for run in runs:
        rows = _read(run)
        rows["gain"] = [without[(r.dataset, r.local_steps, r.client, r.method)] for r in rows.itertuples()]
        rows["gain"] = rows["psnr"] - rows["gain"]
        for method, g in sorted(rows.groupby("method", sort=False)):
            d = g.sort_values("client")["gain"]
            body.append(
                [
                    g["dataset"].iloc[0],
                    str(g["local_steps"].iloc[0]),
                    method,
                    f"{d.mean():+.2f}",
                    " ".join(f"{x:+.2f}" for x in d),
                    f"{(d > 0).sum()}/{len(d)}",
                ]
            )
    header = ["dataset", "T", "method", "with prior - without (mean, dB)", "per client 0, 1, 2", "clients helped"]
    return _head(*runs, base, page=PAGE) + "\n" + _table(header, body)


# --- the CPU-scale tables (docs/experiments/cpu, k=8, 100 iterations) ----------------------------------------

CPU = EXP / "cpu"


def cpu_table1() -> str:
    def with_paper(column: str):
        def cell(g: pd.DataFrame) -> str:
            key = (g["dataset"].iloc[0], g["paper_T"].iloc[0], g["method"].iloc[0])
            paper = PAPER_OTHER.get(key, {}).get(column)
            return f"{g[column].mean():.3f}" + (f" (paper {paper})" if paper is not None else "")

        return cell

    return records_table(
        PAGE,
        CPU / "table1.csv",
        [
            ("dataset", lambda g: g["dataset"].iloc[0]),
            ("T", lambda g: str(g["local_steps"].iloc[0])),
            ("method", lambda g: LABELS[g["method"].iloc[0]]),
            ("PSNR ours (mean ± var)", lambda g: _pm(g["psnr"])),
            ("PSNR paper", _mean("paper_psnr", 2)),
            ("SSIM", with_paper("ssim")),
            ("FSIM", _mean("fsim", 3)),
            ("LPIPS", with_paper("lpips")),
            ("honest Lsim", _mean("lsim_honest", 4)),
            ("label acc.", _mean("label_accuracy", 2)),
            ("n", lambda g: str(len(g))),
            ("s/iter", _mean("seconds_per_iteration", 3)),
        ],
        by=["dataset", "paper_T", "method"],
        rows=[(d, t, m) for d, t in CELLS for m in ("ig", "sme", "nlsme", "pisme")],
    )


def cpu_node_sweep() -> str:
    return records_table(
        PAGE,
        CPU / "node-sweep.csv",
        [
            ("m", lambda g: str(g["nodes"].iloc[0])),
            ("PSNR (mean ± var)", lambda g: _pm(g["psnr"])),
            ("SSIM", _mean("ssim", 3)),
            ("LPIPS", _mean("lpips", 3)),
            ("honest Lsim", _mean("lsim_honest", 4)),
            ("calibrated Lsim", _mean("lsim_calibrated", 4)),
            ("s/iter", _mean("seconds_per_iteration", 3)),
            ("s/iter / m", lambda g: f"{g['seconds_per_iteration'].mean() / g['nodes'].iloc[0]:.3f}"),
            ("n", lambda g: str(len(g))),
        ],
        by="nodes",
    )


def cpu_class_deficiency() -> str:
    def psnr(method: str):
        return lambda g: f"{g.loc[g['method'] == method, 'psnr'].mean():.2f}"

    def margin(g: pd.DataFrame) -> str:
        return f"{_paired(g, 'pisme', 'nlsme').mean():.2f}"

    def paper(g: pd.DataFrame) -> str:
        m = PAPER_MARGIN.get(g["paper_classes"].iloc[0])
        return "-" if m is None else f"{m:.2f}"

    return records_table(
        PAGE,
        CPU / "class-deficiency.csv",
        [
            ("C (paper, k=50)", lambda g: str(g["paper_classes"].iloc[0])),
            ("C used (k=8)", lambda g: str(g["classes"].iloc[0])),
            ("distinct labels", _mean("distinct_labels", 1)),
            ("SME PSNR", psnr("sme")),
            ("NL-SME PSNR", psnr("nlsme")),
            ("PI-SME PSNR", psnr("pisme")),
            ("PI-SME - NL-SME (dB)", margin),
            ("paper margin", paper),
            ("PI-SME honest Lsim", lambda g: f"{g.loc[g['method'] == 'pisme', 'lsim_honest'].mean():.4f}"),
            ("n", lambda g: str(g.loc[g["method"] == "pisme"].shape[0])),
        ],
        by="paper_classes",
    )


def cpu_matched_compute() -> str:
    def method(g: pd.DataFrame) -> str:
        name = g["method"].iloc[0]
        return LABELS[name] + (f" (m={g['nodes'].iloc[0]})" if name == "pisme" else "")

    def gap(g: pd.DataFrame) -> str:
        return f"{g['lsim_honest'].mean() - g['lsim_calibrated'].mean():.4f}"

    return records_table(
        PAGE,
        CPU / "matched-compute.csv",
        [
            ("method", method),
            ("iterations", lambda g: str(g["iterations"].iloc[0])),
            ("gradient evals", _mean("gradient_evaluations", 0)),
            ("PSNR (mean ± var)", lambda g: _pm(g["psnr"])),
            ("SSIM", _mean("ssim", 3)),
            ("honest Lsim", _mean("lsim_honest", 4)),
            ("calibrated Lsim", _mean("lsim_calibrated", 4)),
            ("honest - calibrated", gap),
            ("seconds", _mean("seconds", 0)),
            ("n", lambda g: str(len(g))),
        ],
        by=["method", "iterations"],
    )


def cpu_adaptive_nodes() -> str:
    def schedule(g: pd.DataFrame) -> str:
        return "; ".join("-" if pd.isna(s) else str(s) for s in g["nodes_schedule"])

    return records_table(
        PAGE,
        CPU / "adaptive-nodes.csv",
        [
            ("T", lambda g: str(g["local_steps"].iloc[0])),
            ("variant", lambda g: g["variant"].iloc[0]),
            ("mean m", _mean("nodes", 2)),
            ("m over the run (iteration:m)", schedule),
            ("node-gradient evals", _mean("gradient_evaluations", 0)),
            ("seconds", _mean("seconds", 0)),
            ("PSNR (mean ± var)", lambda g: _pm(g["psnr"])),
            ("SSIM", _mean("ssim", 3)),
            ("honest Lsim", _mean("lsim_honest", 4)),
            ("n", lambda g: str(len(g))),
        ],
        by=["local_steps", "variant"],
    )


# --- Table 3, path consistency at the paper's scale (docs/experiments/paper) --------------------------------

PAPER_TABLE3 = {  # analysis.experiments.path_consistency.PAPER (Table 3 of the paper)
    100: {"single": 0.0242, "tau_fraction": 0.44, 2: 0.0079, 3: 0.0065, 5: 0.0055},
    250: {"single": 0.0446, "tau_fraction": 0.71, 2: 0.0136, 3: 0.0113, 5: 0.0119},
}


PATH_RECORD = EXP / "paper" / "path-consistency.csv"
PATH_PAGE = Path("docs/path-consistency.md")


def _path_ours(t: int, quantity: str, nodes=None, key: str = "lsim") -> float:
    """The record's mean of ``key`` over its ``quantity`` rows at the paper's T (and m = ``nodes``).

    Raises ValueError when it has none."""
    rows = _read(PATH_RECORD)
    keep = (rows["paper_T"] == t) & (rows["quantity"] == quantity)
    if nodes is not None:
        keep &= rows["nodes"] == nodes
    if not keep.any():
        raise ValueError(f"{PATH_RECORD} has no {quantity} rows at T={t}")
    return rows.loc[keep, key].mean()


def _path_line(label, quantity, nodes=None, paper=None, key="lsim", percent=False, digits=4) -> list[str]:
    """One row of Table 3: ``label``, then ours and the paper's at each T ('-' where the paper gives none)."""
    cells = [label]
    for t in PAPER_TABLE3:
        p = PAPER_TABLE3[t].get(paper) if paper is not None else None
        v = _path_ours(t, quantity, nodes, key)
        if percent:
            cells += [f"{100 * v:.0f}%", "-" if p is None else f"{100 * p:.0f}%"]
        else:
            cells += [f"{v:.{digits}f}", "-" if p is None else f"{p:.4f}"]
    return cells


def _path_table(body: list[list[str]], page: Path, first: str = "honest Lsim vs delta_w") -> str:
    header = [first, "T=100 ours", "T=100 paper", "T=250 ours", "T=250 paper"]
    return _head(PATH_RECORD, page=page) + "\n" + _table(header, body)


def path_consistency() -> str:
    """results.md's key rows of Table 3 at the paper's scale."""
    body = [
        _path_line("delta_single (best true state)", "single", paper="single"),
        _path_line("best tau / T", "single", paper="tau_fraction", key="tau_fraction", percent=True),
        *(_path_line(f"delta_quad({m}), P1 fitted", "quad-fit", m, paper=m) for m in (2, 3, 5)),
        _path_line("delta_quad(2), P1 at the midpoint (no fit)", "quad-midpoint", 2),
    ]
    return _path_table(body, PAGE)


def _adam_steps(lr: str) -> int:
    rows = _read(PATH_RECORD)
    return int(rows.loc[rows["quantity"] == f"quad-fit-adam-{lr}", "steps"].max())


def path_consistency_full() -> str:
    """path-consistency.md's whole Table 3: every quantity of the record at both T, as the study writes it."""
    nodes = (2, 3, 5)
    body = [
        _path_line("delta_single (best true state)", "single", paper="single"),
        _path_line("best tau / T", "single", paper="tau_fraction", key="tau_fraction", percent=True),
        *(_path_line(f"delta_quad({m}), P1 fitted", "quad-fit", m, paper=m) for m in nodes),
        *(_path_line(f"delta_quad({m}), P1 at midpoint (no fit)", "quad-midpoint", m) for m in nodes),
        *(_path_line(f"delta_quad({m}), P1 least-squares on the true states", "quad-true-path-p1", m) for m in nodes),
        _path_line(
            "fitted P1: shift from midpoint / ‖delta_w‖ (m=2)", "quad-fit", 2, key="control_point_shift", digits=2
        ),
        _path_line(
            f"delta_quad(2), P1 by Adam lr 1e-3 (paper's setting), {_adam_steps('0.001')} steps",
            "quad-fit-adam-0.001",
            2,
        ),
        _path_line(f"delta_quad(2), P1 by Adam lr 1e-5, {_adam_steps('1e-05')} steps", "quad-fit-adam-1e-05", 2),
        _path_line("true-path mean of full-batch gradients (oracle)", "true-path-mean"),
        _path_line("SME: best point on the straight line", "sme-best-alpha"),
        _path_line("IG: gradient at w0 (tau = 0)", "ig-w0"),
        _path_line("minibatch-exact sum (sanity, should be ~0)", "minibatch-exact", digits=6),
    ]
    return _path_table(body, PATH_PAGE, "quantity (honest Lsim vs delta_w)")


def path_acceptance() -> str:
    """Per T: delta_single, delta_quad(2) with the fitted P1, and their ratio, ours and the paper's."""
    rows = []
    for t, paper in PAPER_TABLE3.items():
        single, quad = _path_ours(t, "single"), _path_ours(t, "quad-fit", 2)
        rows.append(
            [f"T={t}", f"{single:.4f}", f"{quad:.4f}", f"{single / quad:.1f}x", f"{paper['single'] / paper[2]:.1f}x"]
        )
    header = ["", "delta_single", "delta_quad(2)", "ratio (ours)", "ratio (paper)"]
    return _head(PATH_RECORD, page=PATH_PAGE) + "\n" + _table(header, rows)


BLOCKS = {
    PAGE: {
        "results-table1-six": table1_six,
        "results-table1-dimitrov": dimitrov,
        "results-prior-option": prior_option,
        "results-cpu-table1": cpu_table1,
        "results-cpu-node-sweep": cpu_node_sweep,
        "results-cpu-class-deficiency": cpu_class_deficiency,
        "results-paper-path-consistency": path_consistency,
        "results-cpu-matched-compute": cpu_matched_compute,
        "results-cpu-adaptive-nodes": cpu_adaptive_nodes,
    }
}
BLOCKS[PATH_PAGE] = {"path-consistency-table3": path_consistency_full, "path-consistency-acceptance": path_acceptance}


# --- results.md's wall times: each study's own Command and Wall time lines (its committed .md) --------------

WALL_RECORDS = [
    *(EXP / "cpu" / f"{name}.md" for name in ("table1", "matched-compute", "node-sweep", "adaptive-nodes")),
    *(EXP / "cpu" / f"{name}.md" for name in ("class-deficiency", "path-consistency")),
    EXP / "paper" / "path-consistency.md",
    EXP / "table1-fair" / "table1.md",
]
WALL_NOTES = {EXP / "table1-fair" / "table1.md": " (six rows, issue #41)"}


def wall_times() -> str:
    """Per study record: the command its .md names and the wall time it states (summed over its invocations
    where a resumed study took several).

    Raises ValueError when a record lacks either line."""
    import re

    rows = []
    for record in WALL_RECORDS:
        text = (ROOT / record).read_text(encoding="utf-8")
        command = re.search(r"^Command[^`]*`([^`]+)`", text, re.M)
        wall = re.search(r"^Wall time: (\d+) s", text, re.M)
        if command is None or wall is None:
            raise ValueError(f"{record} has no 'Command: `...`' or 'Wall time: N s' line")
        runs = re.search(r"(\d+) invocation\(s\)", text)
        where = f" ({runs.group(1)} invocations)" if runs and int(runs.group(1)) > 1 else ""
        rows.append([f"`{command.group(1)}`{WALL_NOTES.get(record, '')}", f"{wall.group(1)} s{where}"])
    return _head(*WALL_RECORDS, page=PAGE) + "\n" + _table(["command", "wall time"], rows)


BLOCKS[PAGE]["results-wall-times"] = wall_times
