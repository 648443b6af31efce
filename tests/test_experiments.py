"""The paper experiments (analysis.experiments): every command at --scale tiny, on the bundled real data.

One module-scoped run of each command writes into a temporary folder; the tests check the files,
their columns and the ranges of their values (not the numbers: at tiny scale they mean nothing).
"""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis.experiments import EXPERIMENTS, main
from analysis.experiments.common import SCALES, make_context
from analysis.experiments.path_consistency import true_path_control_point
from analysis.experiments.table1 import PAPER_PSNR

REPO = Path(__file__).resolve().parents[1]
NAMES = list(EXPERIMENTS)
SCORE_COLUMNS = [
    "psnr",
    "ssim",
    "fsim",
    "lpips",
    "lsim_honest",
    "lsim_calibrated",
    "label_accuracy",
    "seconds",
    "seconds_per_iteration",
    "gradient_evaluations",
]
EXPECTED = {
    "table1": ["dataset", "paper_T", "local_steps", "client", "seed", "method", "iterations", "paper_psnr"]
    + SCORE_COLUMNS,
    "node-sweep": ["dataset", "local_steps", "client", "seed", "method", "nodes", "iterations"] + SCORE_COLUMNS,
    "class-deficiency": ["paper_classes", "classes", "distinct_labels", "method", "client"] + SCORE_COLUMNS,
    "path-consistency": [
        "paper_T",
        "local_steps",
        "quantity",
        "nodes",
        "tau",
        "tau_fraction",
        "lsim",
        "optimizer",
        "steps",
        "control_point_shift",
        "paper_lsim",
    ],
    "matched-compute": ["method", "iterations", "multiple"] + SCORE_COLUMNS,
    "adaptive-nodes": ["variant", "method", "node_tolerance", "nodes", "nodes_schedule", "node_error"] + SCORE_COLUMNS,
    "label-recovery": ["round", "client", "estimator", "label_accuracy", "test_accuracy", "pbar_tv_dummy", "seconds"],
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Run every experiment once at --scale tiny; returns the output folder."""
    out = tmp_path_factory.mktemp("experiments")
    before = torch.get_num_threads()
    try:
        for name in NAMES:
            assert main([name, "--scale", "tiny", "--out", str(out), "--device", "cpu", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(before)
    return out


def read(out: Path, name: str) -> tuple[list[str], list[dict]]:
    with open(out / f"{name}.csv", newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def num(value: str) -> float:
    return float(value) if value not in ("", None) else math.nan


@pytest.mark.parametrize("name", NAMES)
def test_writes_csv_png_and_markdown_with_the_scale(outputs, name):
    columns, rows = read(outputs, name)
    assert rows, f"{name}.csv has no rows"
    missing = [c for c in EXPECTED[name] if c not in columns]
    assert not missing, f"{name}.csv lacks columns {missing}"
    png = (outputs / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    md = (outputs / f"{name}.md").read_text()
    assert md.startswith("# ")
    assert "Scale `tiny`" in md or "scale `tiny`" in md
    assert "|---|" in md and "Wall time:" in md and f"python -m analysis.experiments {name}" in md
    sc = SCALES["tiny"]
    assert f"k={sc.samples}" in md and "seed(s)" in md and "client(s)" in md


@pytest.mark.parametrize("name", [n for n in NAMES if n not in ("path-consistency", "label-recovery")])
def test_attack_scores_are_in_range(outputs, name):
    _, rows = read(outputs, name)
    for row in rows:
        assert 0 < num(row["psnr"]) <= 100
        assert -1 <= num(row["ssim"]) <= 1
        assert 0 <= num(row["fsim"]) <= 1 or math.isnan(num(row["fsim"]))
        assert num(row["lpips"]) >= 0 or math.isnan(num(row["lpips"]))
        assert 0 <= num(row["lsim_honest"]) <= 2 and 0 <= num(row["lsim_calibrated"]) <= 2
        assert 0 <= num(row["label_accuracy"]) <= 1
        assert num(row["seconds"]) > 0 and num(row["seconds_per_iteration"]) > 0
        assert num(row["gradient_evaluations"]) >= num(row["iterations"])


def test_table1_covers_the_grid_and_quotes_the_paper(outputs):
    _, rows = read(outputs, "table1")
    cells = {(r["dataset"], int(r["paper_T"]), r["method"]) for r in rows}
    assert cells == {
        (d, t, m) for d in ("femnist", "cifar100") for t in (100, 250) for m in ("ig", "sme", "nlsme", "pisme")
    }
    for r in rows:
        assert num(r["paper_psnr"]) == PAPER_PSNR[(r["dataset"], int(r["paper_T"]))][r["method"]]
        assert int(r["iterations"]) == SCALES["tiny"].iterations
    md = (outputs / "table1.md").read_text()
    assert "26.52" in md and "PSNR paper" in md  # the paper's PI-SME CIFAR-100 T=100 row


def test_node_sweep_runs_every_m(outputs):
    _, rows = read(outputs, "node-sweep")
    assert sorted({int(r["nodes"]) for r in rows}) == [3, 4, 5, 7, 10, 12]
    assert {r["method"] for r in rows} == {"pisme"}
    for r in rows:
        assert num(r["gradient_evaluations"]) == int(r["nodes"]) * int(r["iterations"])


def test_class_deficiency_restricts_the_classes(outputs):
    _, rows = read(outputs, "class-deficiency")
    assert sorted({int(r["paper_classes"]) for r in rows}) == [10, 20, 30, 60, 100]
    assert {r["method"] for r in rows} == {"sme", "nlsme", "pisme"}
    for r in rows:
        assert r["dataset"] == "cifar100"
        assert 1 <= int(r["distinct_labels"]) <= int(r["classes"])


def test_path_consistency_quantities(outputs):
    _, rows = read(outputs, "path-consistency")
    by = {}
    for r in rows:
        by.setdefault((int(r["paper_T"]), r["quantity"]), []).append(r)
    for paper_T in (100, 250):
        T = int(by[(paper_T, "single")][0]["local_steps"])
        curve = by[(paper_T, "single-curve")]
        assert [int(r["tau"]) for r in curve] == list(range(T + 1))
        single = by[(paper_T, "single")][0]
        assert num(single["lsim"]) == pytest.approx(min(num(r["lsim"]) for r in curve))
        assert 0 <= num(single["tau_fraction"]) <= 1
        assert num(single["paper_lsim"]) in (0.0242, 0.0446)
        assert abs(num(by[(paper_T, "minibatch-exact")][0]["lsim"])) < 1e-6  # states and batches made delta_w
        fits = {int(r["nodes"]): num(r["lsim"]) for r in by[(paper_T, "quad-fit")]}
        mids = {int(r["nodes"]): num(r["lsim"]) for r in by[(paper_T, "quad-midpoint")]}
        assert sorted(fits) == sorted(mids) == [2, 3, 5]
        for m in fits:  # backtracking never accepts a worse control point
            assert 0 <= fits[m] <= mids[m] + 1e-12
        for quantity in ("true-path-mean", "sme-best-alpha", "ig-w0", "quad-fit-adam-0.001", "quad-fit-adam-1e-05"):
            assert 0 <= num(by[(paper_T, quantity)][0]["lsim"]) <= 2
    md = (outputs / "path-consistency.md").read_text()
    assert "Acceptance (delta_quad(2) < delta_single)" in md and "0.0242" in md


def test_true_path_control_point_recovers_a_bezier_trajectory():
    gen = torch.Generator().manual_seed(0)
    w0, p1, wT = (torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(3))
    t = torch.arange(11, dtype=torch.float64) / 10
    states = [(1 - s) ** 2 * w0 + 2 * (1 - s) * s * p1 + s**2 * wT for s in t]
    torch.testing.assert_close(true_path_control_point(states), p1)


def test_matched_compute_scales_nlsme_iterations(outputs):
    _, rows = read(outputs, "matched-compute")
    it = SCALES["tiny"].iterations
    assert sorted(int(r["iterations"]) for r in rows if r["method"] == "nlsme") == [it, 5 * it, 7 * it]
    assert [int(r["iterations"]) for r in rows if r["method"] == "pisme"] == [it]


def test_adaptive_nodes_compares_with_fixed_m(outputs):
    _, rows = read(outputs, "adaptive-nodes")
    variants = {r["variant"] for r in rows}
    assert {"fixed m=7", "fixed m=2"} <= variants and any(v.startswith("adaptive") for v in variants)
    for r in rows:
        if r["method"] == "pisme-adaptive":
            assert 1 <= num(r["nodes"]) <= 7 and num(r["node_tolerance"]) > 0 and r["nodes_schedule"].startswith("0:")
            assert 0 <= num(r["node_error"]) <= 2
    md = (outputs / "adaptive-nodes.md").read_text()
    assert "m=1" in md and "m=7" in md  # the error-estimate table


@pytest.mark.parametrize(
    "argv, message",
    [
        (["table1", "--seeds", "0"], "--seeds must be an integer >= 1"),
        (["table1", "--data-dir", "/no/such/dir"], "data directory not found"),
        (["table1", "--device", "tpu"], "unknown device"),
    ],
)
def test_bad_options_exit_2_before_any_work(tmp_path, capsys, argv, message):
    assert main(argv + ["--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_unknown_experiment_and_scale():
    with pytest.raises(SystemExit):
        main(["table2"])
    with pytest.raises(ValueError, match="unknown scale 'huge'"):
        make_context("table1", "huge")


def test_module_entry_point_help():
    out = subprocess.run(
        [sys.executable, "-m", "analysis.experiments", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0
    for name in NAMES:
        assert name in out.stdout


def test_label_recovery_scores_every_estimator(outputs):
    _, rows = read(outputs, "label-recovery")
    estimators = {r["estimator"] for r in rows}
    assert {"paper", "support", "aux", "oracle", "paper+refine"} <= estimators
    assert all(0 <= num(r["label_accuracy"]) <= 1 for r in rows)
    assert all(num(r["label_accuracy"]) == 1 for r in rows if r["estimator"] == "oracle")  # the exact identity
    assert {int(r["round"]) for r in rows} == {1, 2}
