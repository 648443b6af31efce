"""Leakage analysis of fl-attack run folders: load, aggregate, plot, report.

    from analysis import load_run, per_round, write_report
    run = load_run("results/my-run")
    per_round(run.attacks)
    write_report(["results/my-run"], "report/")   # -> report/report.html

Command line: python -m analysis.report RUN_DIR [RUN_DIR ...] --out REPORT_DIR [--format html|md]
"""

from .aggregate import METRIC_RANGES, compare_runs, mean_ci95, per_client, per_round, summary_sentences, summary_table
from .load import MalformedLineWarning, MixedRunsError, NotARunError, Run, load_run


def __getattr__(name):
    # write_report is imported on first use: it pulls in matplotlib, and importing analysis.report
    # here would make `python -m analysis.report` warn that the module was already imported.
    if name == "write_report":
        from .report import write_report

        return write_report
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")


__all__ = [
    "load_run",
    "Run",
    "NotARunError",
    "MixedRunsError",
    "MalformedLineWarning",
    "per_round",
    "per_client",
    "compare_runs",
    "summary_table",
    "summary_sentences",
    "mean_ci95",
    "METRIC_RANGES",
    "write_report",
]
