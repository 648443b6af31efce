"""Leakage report for one or more run folders: one self-contained HTML file (or Markdown + PNGs).

Usage:
    python -m analysis.report RUN_DIR [RUN_DIR ...] --out REPORT_DIR [--format html|md] [--threshold 20]

Writes REPORT_DIR/report.html (PNGs inlined as data URIs, CSS inline, no scripts, no external
links) or REPORT_DIR/report.md with figures/ and images/ beside it, and the tables
summary.csv, per_round.csv, per_client.csv, comparison.csv (+ .parquet when pyarrow is importable).

Sections: the verdict (its sentences, the per-round plot, and per run the evidence pictures of the
attacks that single out the most images), summary (a few sentences per run and one table row per
run, method, defense and labels source), comparison of runs (several folders), plots (leakage
against round and against the model's accuracy, training curve), configuration, then per run:
per-round and per-client tables, heat map, failed attacks and the best/worst reconstructions.
Exit codes: 0 done, 2 bad arguments or a folder that is not a run, 1 the report could not be written.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import html
import io
import json
import math
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fl_attack.records import write_bytes_atomic, write_text_atomic
from fl_attack.schema import evidence_path, whose

from .aggregate import (
    METRICS,
    STATS,
    compare_runs,
    differing_keys,
    per_client,
    per_round,
    run_labels,
    sorted_methods,
    summary_sentences,
    summary_table,
    verdict_sentences,
)
from .load import NotARunError, Run, load_run
from .plots import (
    figure_png,
    has_epsilon,
    plot_leakage,
    plot_leakage_vs_epsilon,
    plot_memory,
    plot_per_client,
    plot_training,
    plot_utility_vs_leakage,
    plot_verdict,
)

FORMATS = ("html", "md")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Failed attacks listed per run in the report; the CSVs keep all of them.
MAX_FAILED_LISTED = 50
# Evidence pictures shown per run under the verdict: those of the attacks that single out the most images.
MAX_EVIDENCE = 3
_EVIDENCE_NOTE = (
    "Rows: the reconstruction | its own original | the nearest other candidate (another of the client's "
    "originals or a distractor); the distances are 1 - SSIM to the reconstruction."
)


@dataclass
class _Picture:
    """One embedded image: a figure or a run's reconstruction grid."""

    key: str  # file name stem for the Markdown output
    png: bytes
    caption: str


@dataclass
class _RunSection:
    run: Run
    label: str
    per_round: pd.DataFrame
    per_client: pd.DataFrame
    summary: pd.DataFrame
    sentences: list[str]
    heat_map: _Picture | None = None
    memory: list[_Picture] = field(default_factory=list)  # plot_memory's figures, with attack-memory on
    grids: list[tuple[int, list[_Picture | str]]] = field(default_factory=list)
    evidence: list[_Picture] = field(default_factory=list)  # _pick_evidence's, under the verdict


def write_report(
    run_dirs: Sequence[str | Path], out_dir: str | Path, fmt: str = "html", threshold: float = 20.0
) -> Path:
    """Load `run_dirs`, write the report and the table exports into `out_dir`; return the report path.

    fmt: "html" (report.html, self-contained) or "md" (report.md, PNGs in figures/ and images/).
    threshold: PSNR (dB) above which a client counts as recovered in the summary sentences.
    Raises NotARunError for a folder that is not a run, ValueError for no folders or a bad fmt.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if not run_dirs:
        raise ValueError("write_report needs at least one run folder")
    runs = [load_run(path) for path in run_dirs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    sections = _build_sections(runs, threshold)
    comparison = compare_runs(runs)
    _export_tables(sections, comparison, out_dir)

    verdict = None  # the first screen's plot, beside the verdict sentences
    figures = []
    if any(not run.attacks.empty for run in runs):
        verdict = _Picture(
            "verdict_over_rounds",
            figure_png(plot_verdict(runs)),
            "The verdict per round: the fraction of a client's images recovered (singled out among "
            "k + D candidates and read as the original by an independent classifier) and singled out, "
            "against a guess without the update (dashed) and chance (dotted); docs/verdict.md.",
        )
        figures.append(
            _Picture(
                "leakage_over_rounds",
                figure_png(plot_leakage(runs, threshold=threshold)),
                "Mean leakage per round, method, defense and labels source; the band is "
                "the 95% interval of the mean (given from 3 values).",
            )
        )
        figures.append(
            _Picture(
                "leakage_vs_accuracy",
                figure_png(plot_leakage(runs, x="accuracy", threshold=threshold)),
                "Mean leakage against the model's accuracy in the same round (the axis "
                "names the accuracy used), rounds joined in order; bars: 95% intervals.",
            )
        )
    if any(has_epsilon(run) for run in runs):
        figures.append(
            _Picture(
                "leakage_vs_epsilon",
                figure_png(plot_leakage_vs_epsilon(runs)),
                "Leakage (mean over the ok attacks on updates sent with the same budget spent) and model "
                "accuracy against the DP budget spent (fl_attack.privacy.accountant; attacks.csv and rounds.csv "
                "'epsilon'); runs without DP as grey reference lines.",
            )
        )
    if any(not run.rounds.empty for run in runs):
        figures.append(
            _Picture(
                "training", figure_png(plot_training(runs)), "Training curve: loss and accuracy per finished round."
            )
        )
    utility = None
    if len(runs) > 1:
        utility = _Picture(
            "utility_vs_leakage",
            figure_png(plot_utility_vs_leakage(runs)),
            "Final accuracy (global when the run has it, else eval) against mean PSNR over ok attacks, "
            "one point per run.",
        )

    if fmt == "html":
        path = out_dir / "report.html"
        write_text_atomic(path, _render_html(sections, comparison, verdict, figures, utility, threshold))
    else:
        path = out_dir / "report.md"
        write_text_atomic(path, _render_markdown(sections, comparison, verdict, figures, utility, threshold, out_dir))
    return path


# ---------------------------------------------------------------- data for the report


def _build_sections(runs: list[Run], threshold: float) -> list[_RunSection]:
    sections = []
    for label, run in zip(run_labels(runs), runs):
        section = _RunSection(
            run=run,
            label=label,
            per_round=per_round(run.attacks, run.rounds),
            per_client=per_client(run.attacks),
            summary=summary_table(run),
            sentences=summary_sentences(run, threshold=threshold),
        )
        if not run.attacks.empty and run.attacks["method"].astype(str).str.endswith("+memory").any():
            section.memory = [
                _Picture(
                    f"memory_{where}_{_slug(label)}",
                    figure_png(plot_memory(run, x=where)),
                    f"{label}: per tracked client, the estimate the remembering server holds after each round "
                    f"(dashed) and each round's attack alone (solid), against the {what}.",
                )
                for where, what in (("round", "round"), ("accuracy", "model's accuracy that round"))
                if where == "round" or not run.rounds.empty
            ]
        if not run.attacks.empty:
            section.heat_map = _Picture(
                f"per_client_{_slug(label)}",
                figure_png(plot_per_client(run)),
                f"PSNR per client and round, {label}. Grey: not attacked, failed or no value.",
            )
            section.grids = _pick_grids(run, label)
            section.evidence = _pick_evidence(run, label)
        sections.append(section)
    return sections


def _pick_grids(run: Run, label: str) -> list[tuple[int, list[_Picture | str]]]:
    """Per round: the best and worst ok attack (by PSNR) of each method, as pictures or notes."""
    ok = run.attacks[(run.attacks["status"] == "ok") & run.attacks["psnr"].notna()]
    picks = []
    for round_ in sorted(run.attacks["round"].unique()):
        items: list[_Picture | str] = []
        for method in sorted_methods(run.attacks[run.attacks["round"] == round_]):
            rows = ok[(ok["method"] == method) & (ok["round"] == round_)]
            if rows.empty:
                items.append(f"{method}: no successful attack in this round")
                continue
            chosen = [("best", rows.loc[rows["psnr"].idxmax()])]
            worst = rows.loc[rows["psnr"].idxmin()]
            if worst.name != chosen[0][1].name:
                chosen.append(("worst", worst))
            for kind, row in chosen:
                client = _client_text(row)
                caption = f"{method} {kind}: client {client}, PSNR {row['psnr']:.2f} dB"
                if pd.notna(row.get("ssim")):
                    caption += f", SSIM {row['ssim']:.3f}"
                png = _read_run_png(run, row.get("image"))
                if png is None:
                    items.append(f"{caption} (image missing: {row.get('image') or 'no path'})")
                else:
                    items.append(
                        _Picture(f"{_slug(label)}/round-{int(round_)}/{_slug(method)}/client-{client}", png, caption)
                    )
        picks.append((int(round_), items))
    return picks


def _pick_evidence(run: Run, label: str) -> list[_Picture]:
    """The evidence pictures (fl_attack.schema.evidence_path, beside each grid) of the ok attacks that
    single out the most images (then the highest PSNR), at most ``MAX_EVIDENCE``; an attack without
    one is passed over, so a run recorded before the evidence existed shows none."""
    ok = run.attacks[(run.attacks["status"] == "ok") & run.attacks["image"].notna()]
    if ok.empty:
        return []
    fraction, k = (
        pd.to_numeric(ok[c], errors="coerce") if c in ok else pd.Series(math.nan, index=ok.index)
        for c in ("reidentified", "k")
    )
    singled = fraction * k  # NaN where there is no verdict
    order = ok.assign(_singled=singled).sort_values(["_singled", "psnr"], ascending=False, kind="stable")
    pictures = []
    for _, row in order.iterrows():
        png = _read_run_png(run, evidence_path(str(row["image"])).as_posix())
        if png is None:
            continue
        count = f"{row['_singled']:.0f} of {row['k']:.0f} singled out" if pd.notna(row["_singled"]) else "singled out"
        pictures.append(
            _Picture(
                f"evidence/{_slug(label)}/round-{int(row['round'])}/{_slug(row['method'])}/client-{_client_text(row)}",
                png,
                f"{label}, round {int(row['round'])}, {whose(row)}, {row['method']}: {count}. {_EVIDENCE_NOTE}",
            )
        )
        if len(pictures) == MAX_EVIDENCE:
            break
    return pictures


def _client_text(row) -> str:
    partition = row.get("partition_id")
    if pd.notna(partition):
        return str(int(partition))
    return str(row.get("client_id") or "?")


def _read_run_png(run: Run, relative) -> bytes | None:
    """The PNG at `relative` inside the run folder; None when missing, outside the folder or not a PNG."""
    if not isinstance(relative, str) or not relative.strip():
        return None
    root = run.path.resolve()
    path = (root / relative.strip()).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return None
    data = path.read_bytes()
    return data if data.startswith(PNG_SIGNATURE) else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-") or "run"


def _export_tables(sections: list[_RunSection], comparison: pd.DataFrame, out_dir: Path) -> None:
    per_round_all = _concat_with_run([(s.label, s.per_round) for s in sections])
    per_client_all = _concat_with_run([(s.label, s.per_client) for s in sections])
    tables = {
        "summary": _summary_all(sections),
        "per_round": per_round_all,
        "per_client": per_client_all,
        "comparison": comparison,
    }
    for name, table in tables.items():
        write_text_atomic(out_dir / f"{name}.csv", table.to_csv(index=False))
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return
    for name, table in tables.items():
        _write_parquet(table, out_dir / f"{name}.parquet")


def _summary_all(sections: list[_RunSection]) -> pd.DataFrame:
    """The runs' summary tables in one, with a run column when there are several runs."""
    if len(sections) == 1:
        return sections[0].summary
    return _concat_with_run([(s.label, s.summary) for s in sections])


def _concat_with_run(tables: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    frames = [table.assign(run=label)[["run", *table.columns]] for label, table in tables]
    non_empty = [frame for frame in frames if not frame.empty]
    return pd.concat(non_empty, ignore_index=True) if non_empty else frames[0]


def _parquet_bytes(table: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _write_parquet(table: pd.DataFrame, path: Path) -> None:
    try:
        write_bytes_atomic(path, _parquet_bytes(table))
    except Exception as error:  # pyarrow raises its own error types
        # Config columns can mix types between runs (200 vs "200"); store those as text.
        text = table.copy()
        for column in text.columns:
            if text[column].dtype == object:
                text[column] = text[column].map(
                    lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
                )
        try:
            write_bytes_atomic(path, _parquet_bytes(text))
        except Exception:
            warnings.warn(f"could not write {path}: {error}", stacklevel=2)


# ---------------------------------------------------------------- formatting


def _float_text(number: float) -> str:
    if math.isnan(number):
        return ""
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return f"{number:.0f}" if abs(number) >= 1000 else f"{number:.4g}"


def _cell(value) -> tuple[str, str | None]:
    """(display text, full-precision title or None) for one table cell."""
    try:
        missing = pd.isna(value)
    except (TypeError, ValueError):
        missing = False
    if missing is True:
        return "", None
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return str(value), None
    if hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu":
        return str(int(value)), None
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") == "f"):
        number = float(value)
        return _float_text(number), repr(number)
    if isinstance(value, (list, dict)):
        return json.dumps(value), None
    return str(value), None


def _split_columns(columns: list[str]) -> list[tuple[str, str]]:
    """("psnr", "mean") for "psnr_mean" and the like; ("", name) for other columns."""
    pairs = []
    for name in columns:
        for metric in METRICS:
            stat = name[len(metric) + 1 :] if name.startswith(metric + "_") else None
            if stat in STATS:
                pairs.append((metric, stat.replace("ci95_", "95% ")))
                break
        else:
            pairs.append(("", name))
    return pairs


def _html_table(table: pd.DataFrame, cls: str, grouped: bool = False, row_classes: list[str] | None = None) -> str:
    columns = list(table.columns)
    out = [f'<div class="scroll"><table class="{html.escape(cls)}">', "<thead>"]
    if grouped:
        pairs = _split_columns(columns)
        out.append("<tr>")
        i = 0
        while i < len(pairs):
            group = pairs[i][0]
            span = 1
            while i + span < len(pairs) and pairs[i + span][0] == group:
                span += 1
            if group:
                out.append(f'<th colspan="{span}" class="group">{html.escape(group)}</th>')
            else:
                out.extend(f'<th rowspan="2">{_header_html(pairs[j][1])}</th>' for j in range(i, i + span))
            i += span
        out.append("</tr><tr>")
        out.extend(f"<th>{html.escape(stat)}</th>" for group, stat in pairs if group)
        out.append("</tr>")
    else:
        out.append("<tr>" + "".join(f"<th>{_header_html(str(c))}</th>" for c in columns) + "</tr>")
    out.append("</thead><tbody>")
    for i, row in enumerate(table.itertuples(index=False)):
        row_cls = f' class="{html.escape(row_classes[i])}"' if row_classes and row_classes[i] else ""
        cells = []
        for value in row:
            text, title = _cell(value)
            title_attr = f' title="{html.escape(title)}"' if title else ""
            cells.append(f"<td{title_attr}>{html.escape(text)}</td>")
        out.append(f"<tr{row_cls}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _header_html(name: str) -> str:
    # Let long snake_case headers wrap after an underscore.
    return html.escape(name).replace("_", "_<wbr>")


def _md_table(table: pd.DataFrame) -> str:
    if table.empty:
        return "_(empty)_\n"
    columns = [f"{group} {stat}".strip() for group, stat in _split_columns(list(table.columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v)[0].replace("|", "\\|").replace("\n", " ") for v in row) + " |")
    return "\n".join(lines) + "\n"


def _config_table(runs: list[Run], labels: list[str]) -> pd.DataFrame:
    """Rows: run_config keys, then run_name/seed/started/versions; one column per run."""
    keys: list[str] = []
    for run in runs:
        keys += [key for key in run.run_config if key not in keys]
    rows = {key: [run.run_config.get(key) for run in runs] for key in keys}
    for meta in ("run_name", "seed", "started"):
        rows[meta] = [run.config.get(meta) for run in runs]
    version_keys: list[str] = []
    for run in runs:
        versions = run.config.get("versions") or {}
        if isinstance(versions, dict):
            version_keys += [key for key in versions if key not in version_keys]
    for key in version_keys:
        rows[f"version {key}"] = [(run.config.get("versions") or {}).get(key) for run in runs]
    problem = [_problem(run) for run in runs]
    for key in ("client optimizer", "model parameters", "client pixels k*C*H*W", "pixels per parameter"):
        rows[key] = [p.get(key) for p in problem]
    rows["folder"] = [str(run.path) for run in runs]
    table = pd.DataFrame(
        [[key, *values] for key, values in rows.items()], columns=["key", *(labels if len(runs) > 1 else ["value"])]
    )
    return table


def _span(values: pd.Series, digits: int = 0) -> str | None:
    """'v' or 'min .. max' of a numeric column's values; None when it has none (an older run)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return None
    lo, hi = (f"{x:,.{digits}f}" for x in (v.min(), v.max()))
    return lo if lo == hi else f"{lo} .. {hi}"


def _problem(run: Run) -> dict:
    """The attacks' problem size: the update's entries against the client's pixels (breaching's "data
    ratio"; above 1 pixel per parameter the inversion is underdetermined) and the client optimizer."""
    a = run.attacks
    if a.empty or "parameters" not in a:
        return {}
    ratio = pd.to_numeric(a["unknowns"], errors="coerce") / pd.to_numeric(a["parameters"], errors="coerce")
    optimizers = sorted({str(o) for o in a["optimizer"].dropna() if str(o)})
    return {
        "client optimizer": ", ".join(optimizers) or None,
        "model parameters": _span(a["parameters"]),
        "client pixels k*C*H*W": _span(a["unknowns"]),
        "pixels per parameter": _span(ratio, 3),
    }


def _failed_table(run: Run) -> pd.DataFrame:
    failed = run.attacks[run.attacks["status"] == "failed"]
    return failed[["round", "method", "partition_id", "client_id", "error"]].head(MAX_FAILED_LISTED)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# ---------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 1.5rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { border-bottom: 2px solid #ddd; padding-bottom: .2rem;
       margin-top: 2.2rem; } h3 { margin-top: 1.6rem; }
.meta { color: #666; font-size: .9rem; }
.scroll { overflow-x: auto; margin: .6rem 0 1rem; }
table { border-collapse: collapse; font-size: .82rem; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: right; white-space: nowrap; }
th { background: #f3f4f6; text-align: center; white-space: normal; } th.group { background: #e6eaf0; }
td:first-child, td:nth-child(2) { text-align: left; }
table.config td { text-align: left; white-space: normal; max-width: 28rem; word-break: break-word; }
tr.differs td { background: #fff6d6; font-weight: 600; }
table.failed td:last-child { text-align: left; white-space: normal; }
tbody tr:nth-child(even) td { background-color: #fafafa; }
tr.differs:nth-child(even) td { background: #fff6d6; }
figure { margin: .8rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #555; }
.note { background: #eef4ff; border-left: 4px solid #5b8def; padding: .6rem .9rem; margin: .8rem 0; }
.grids { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: .8rem; }
.grids figure { margin: 0; background: #fafafa; padding: .4rem; border: 1px solid #eee; }
.grids img { image-rendering: pixelated; width: 100%; }
.evidence { display: grid; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr)); gap: .8rem; }
.evidence figure { margin: 0; background: #fff; padding: .4rem; border: 1px solid #eee; }
ul.sentences li { margin: .15rem 0; }
.verdict { background: #f4f8ff; border: 1px solid #c9daf5; border-radius: 6px; padding: .2rem 1rem .6rem; }
.verdict h2 { margin-top: .6rem; }
nav { font-size: .9rem; } nav a { margin-right: 1rem; color: #2a5bd7; }
"""


_SUMMARY_NOTE = (
    "One row per method, defense and labels source. recovered of images: the verdict summed over the "
    "ok attacks (guess_recovered: the best guess without the update; reidentified: the fraction singled "
    "out, against reid_chance); guess_*: the floor beside each score. PSNR first/last: mean in the first and last "
    "round attacked; best: the highest single attack. psnr_accuracy_corr: correlation over rounds "
    "of the round's mean PSNR with the model's accuracy (accuracy_source); psnr_trend: dB per "
    "round. Both need 3 rounds; blank cells: not enough data."
)


def _figure_html(picture: _Picture) -> str:
    return (
        f'<figure><img src="{_data_uri(picture.png)}" alt="{html.escape(picture.caption)}">'
        f"<figcaption>{html.escape(picture.caption)}</figcaption></figure>"
    )


def _render_html(
    sections: list[_RunSection],
    comparison: pd.DataFrame,
    verdict: _Picture | None,
    figures: list[_Picture],
    utility: _Picture | None,
    threshold: float,
) -> str:
    runs = [s.run for s in sections]
    labels = [s.label for s in sections]
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>fl-attack leakage report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>fl-attack leakage report</h1>",
        *_verdict_html(sections, verdict),
        f'<p class="meta">Generated {html.escape(now)} from {len(runs)} run folder'
        f"{'s' if len(runs) > 1 else ''}. {html.escape(_VERDICT_NOTE)} PSNR sentences count attacks "
        f"over {threshold:g} dB. "
        "Failed attacks are counted, never averaged in; intervals are 95% t-intervals of the mean, "
        "given from 3 values and clipped to the metric's range (blank otherwise).</p>",
    ]
    links = [("summary", "Summary")]
    if len(sections) > 1:
        links.append(("comparison", "Comparison"))
    if figures:
        links.append(("plots", "Plots"))
    links.append(("config", "Configuration"))
    links += [(f"run-{_slug(s.label)}", f"Run: {s.label}") for s in sections]
    parts.append(
        "<nav>"
        + "".join(f'<a href="#{html.escape(anchor)}">{html.escape(text)}</a>' for anchor, text in links)
        + "</nav>"
    )

    parts.append('<h2 id="summary">Summary</h2>')
    for section in sections:
        if len(sections) > 1:
            parts.append(f"<h3>{html.escape(section.label)}</h3>")
        if section.run.attacks.empty:
            parts.append('<p class="note">No attacks yet: this run has no rows in attacks.csv.</p>')
        parts.append(
            '<ul class="sentences">' + "".join(f"<li>{html.escape(s)}</li>" for s in section.sentences) + "</ul>"
        )
    summary = _summary_all(sections)
    if not summary.empty:
        parts.append(f"<p>{html.escape(_SUMMARY_NOTE)}</p>")
        parts.append(_html_table(summary, "summary"))

    if len(sections) > 1:
        parts.append('<h2 id="comparison">Comparison of runs</h2>')
        keys = [key for key in differing_keys(runs)]
        parts.append("<p>Differing run-config keys: " + (html.escape(", ".join(keys)) if keys else "none") + ".</p>")
        parts.append(_html_table(comparison, "comparison"))
        if utility is not None:
            parts.append(_figure_html(utility))

    if figures:
        parts.append('<h2 id="plots">Leakage against round and model accuracy, training</h2>')
        parts.extend(_figure_html(picture) for picture in figures)

    parts.append('<h2 id="config">Configuration</h2>')
    differing = set(differing_keys(runs))
    config = _config_table(runs, labels)
    parts.append(
        _html_table(config, "config", row_classes=["differs" if key in differing else "" for key in config["key"]])
    )

    for section in sections:
        parts.append(f'<h2 id="run-{html.escape(_slug(section.label))}">Run: {html.escape(section.label)}</h2>')
        parts.append(f'<p class="meta">{html.escape(str(section.run.path))}</p>')
        if section.run.attacks.empty:
            parts.append(
                '<p class="note">No attacks yet: attacks.csv is missing or has no rows, '
                "so there is nothing to tabulate.</p>"
            )
            continue
        parts.append("<h3>Per round, method, defense and labels</h3>")
        parts.append(_html_table(section.per_round, "per-round", grouped=True))
        parts.append("<h3>Per client</h3>")
        parts.append(_html_table(section.per_client, "per-client"))
        parts += [_figure_html(picture) for picture in section.memory]
        if section.heat_map is not None:
            parts.append(_figure_html(section.heat_map))
        failed = _failed_table(section.run)
        if not failed.empty:
            parts.append(f"<h3>Failed attacks ({int((section.run.attacks['status'] == 'failed').sum())})</h3>")
            parts.append(_html_table(failed, "failed"))
        parts.append("<h3>Reconstructions: best and worst client per round</h3>")
        parts.append("<p>Each image: originals in the top row, matched reconstructions in the bottom row.</p>")
        for round_, items in section.grids:
            parts.append(f'<h4>Round {round_}</h4><div class="grids">')
            for item in items:
                if isinstance(item, _Picture):
                    parts.append(_figure_html(item))
                else:
                    parts.append(f'<p class="note">{html.escape(item)}</p>')
            parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


_VERDICT_NOTE = (
    "Recovered: a reconstruction singled out among the client's k images and D distractors (its own "
    "original nearest) and read by an independent classifier as it reads the original (docs/verdict.md)."
)


def _disjoint_text(config: dict) -> str:
    """config.json's line on what the verdict's data and the attacker's public pool share with the
    run's clients (``verdict["disjoint"]["text"]``, fl_attack.evaluation.overlap.disjoint_record); "" when
    the run has none (an audited app's, or one written before it)."""
    verdict = config.get("verdict")
    record = verdict.get("disjoint") if isinstance(verdict, dict) else None
    return str(record.get("text") or "") if isinstance(record, dict) else ""


def _verdict_lines(sections: list[_RunSection]) -> list[tuple[str, list[str]]]:
    """(run label, its verdict sentences, then the data-overlap line where config.json has one) per
    run that has a verdict."""
    out = []
    for section in sections:
        attacks = section.run.attacks
        found = verdict_sentences(attacks)
        if found:
            disjoint = _disjoint_text(section.run.config or {})
            out.append((section.label, found + ([disjoint] if disjoint else [])))
    return out


def _verdict_html(sections: list[_RunSection], verdict: _Picture | None) -> list[str]:
    """The report's first screen: each run's verdict and the per-round verdict plot."""
    lines = _verdict_lines(sections)
    if not lines:
        return ['<p class="note">No verdict: these runs have no scored attack with the verdict\'s columns.</p>']
    parts = ['<div class="verdict"><h2 id="verdict">Verdict</h2>']
    for label, found in lines:
        prefix = f"<b>{html.escape(label)}</b>: " if len(lines) > 1 else ""
        parts.append('<ul class="sentences">' + "".join(f"<li>{prefix}{html.escape(t)}</li>" for t in found) + "</ul>")
    if verdict is not None:
        parts.append(_figure_html(verdict))
    shown = [section for section in sections if section.evidence]
    if shown:
        parts.append('<h3 id="evidence">Evidence: a few singled-out images</h3>')
        for section in shown:
            if len(sections) > 1:
                parts.append(f"<h4>{html.escape(section.label)}</h4>")
            parts.append('<div class="evidence">' + "".join(map(_figure_html, section.evidence)) + "</div>")
    return parts + ["</div>"]


# ---------------------------------------------------------------- Markdown


def _render_markdown(
    sections: list[_RunSection],
    comparison: pd.DataFrame,
    verdict: _Picture | None,
    figures: list[_Picture],
    utility: _Picture | None,
    threshold: float,
    out_dir: Path,
) -> str:
    runs = [s.run for s in sections]
    # Files are overwritten, never deleted: REPORT_DIR may hold the user's own files.
    figure_dir = out_dir / "figures"
    image_dir = out_dir / "images"

    def saved(picture: _Picture, folder: Path) -> str:
        path = folder / f"{picture.key}.png"
        write_bytes_atomic(path, picture.png)
        return f"![{picture.caption}]({path.relative_to(out_dir).as_posix()})\n\n*{picture.caption}*\n"

    lines = ["# fl-attack leakage report", ""]
    verdicts = _verdict_lines(sections)
    if verdicts:
        lines += ["## Verdict", ""]
        for label, found in verdicts:
            lines += [f"- {f'**{label}**: ' if len(verdicts) > 1 else ''}{text}" for text in found]
        lines.append("")
        if verdict is not None:
            lines.append(saved(verdict, figure_dir))
        shown = [section for section in sections if section.evidence]
        if shown:
            lines += ["### Evidence: a few singled-out images", ""]
            for section in shown:
                if len(sections) > 1:
                    lines += [f"#### {section.label}", ""]
                lines += [saved(picture, image_dir) for picture in section.evidence]
    lines += [
        f"{_VERDICT_NOTE} PSNR sentences count attacks over {threshold:g} dB. "
        "Failed attacks are counted, never averaged in; intervals are 95% t-intervals of the mean, "
        "given from 3 values and clipped to the metric's range "
        "(blank otherwise).",
        "",
        "## Summary",
        "",
    ]
    for section in sections:
        if len(sections) > 1:
            lines += [f"### {section.label}", ""]
        lines += [f"- {sentence}" for sentence in section.sentences] + [""]
    summary = _summary_all(sections)
    if not summary.empty:
        lines += [_SUMMARY_NOTE, "", _md_table(summary)]
    if len(sections) > 1:
        keys = differing_keys(runs)
        lines += [
            "## Comparison of runs",
            "",
            f"Differing run-config keys: {', '.join(keys) or 'none'}.",
            "",
            _md_table(comparison),
        ]
        if utility is not None:
            lines.append(saved(utility, figure_dir))
    if figures:
        lines += ["## Leakage against round and model accuracy, training", ""]
        lines += [saved(picture, figure_dir) for picture in figures]
    lines += ["## Configuration", "", _md_table(_config_table(runs, [s.label for s in sections]))]
    for section in sections:
        lines += [f"## Run: {section.label}", ""]
        if section.run.attacks.empty:
            lines += ["> No attacks yet: attacks.csv is missing or has no rows.", ""]
            continue
        lines += [
            "### Per round, method, defense and labels",
            "",
            _md_table(section.per_round),
            "### Per client",
            "",
            _md_table(section.per_client),
        ]
        lines += [saved(picture, figure_dir) for picture in section.memory]
        if section.heat_map is not None:
            lines.append(saved(section.heat_map, figure_dir))
        failed = _failed_table(section.run)
        if not failed.empty:
            lines += ["### Failed attacks", "", _md_table(failed)]
        lines += [
            "### Reconstructions: best and worst client per round",
            "",
            "Each image: originals in the top row, matched reconstructions in the bottom row.",
            "",
        ]
        for round_, items in section.grids:
            lines += [f"#### Round {round_}", ""]
            for item in items:
                lines.append(saved(item, image_dir) if isinstance(item, _Picture) else f"> {item}\n")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.report",
        description="Write a leakage report (tables, plots, reconstructions) for fl-attack run folders.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folder(s) with config.json/attacks.csv")
    parser.add_argument("--out", required=True, metavar="REPORT_DIR", help="folder for the report and tables")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="html",
        dest="fmt",
        help="html: one self-contained file (default); md: Markdown with PNGs beside it",
    )
    parser.add_argument(
        "--threshold", type=float, default=20.0, help="PSNR in dB above which a client counts as recovered (default 20)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (0 ok, 1 write error, 2 usage / not a run)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            path = write_report(args.run_dirs, args.out, fmt=args.fmt, threshold=args.threshold)
        except NotARunError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except OSError as error:
            print(f"error: could not write the report: {error}", file=sys.stderr)
            return 1
        finally:
            for warning in caught:
                print(f"warning: {warning.message}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
