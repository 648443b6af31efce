"""Tests of the round-by-round report: intervals inside each metric's range and only from n >= 3, the
summary table, leakage against accuracy, old/new/unknown CSV columns, folders mixing two runs."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import METRIC_RANGES, MixedRunsError, load_run, per_round, summary_sentences, summary_table
from analysis.aggregate import METRICS, mean_ci95
from analysis.plots import plot_leakage, save_figure
from analysis.report import main
from fl_attack.schema import ATTACK_COLUMNS, ROUND_COLUMNS

# The columns of runs written before defense, attacks_in_flight, seconds and centralised evaluation.
OLD_ROUND_COLUMNS = ["round", "clients", "train_loss", "eval_loss", "eval_accuracy"]
OLD_ATTACK_COLUMNS = [c for c in ATTACK_COLUMNS if c not in ("defense", "label_estimator", "lag_rounds")]


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def attack(round_, partition, method="pisme", labels="recovered", **metrics) -> dict:
    row = {
        "round": round_,
        "node_id": 100 + partition,
        "partition_id": partition,
        "client_id": f"c{partition}",
        "method": method,
        "dataset": "femnist",
        "defense": "none",
        "labels": labels,
        "status": "ok",
        "label_estimator": "bias",
        "lag_rounds": 0,
        "psnr": 20.0,
        "ssim": 0.5,
        "fsim": 0.7,
        "lpips": 0.3,
        "lsim_honest": 0.2,
        "lsim_calibrated": 0.1,
        "label_accuracy": 1.0,
    }
    row.update(metrics)
    return row


def rounds(n: int) -> list[dict]:
    return [
        {
            "round": r,
            "clients": 4,
            "train_loss": 1 / r,
            "eval_loss": 1 / r,
            "eval_accuracy": 0.1 * r,
            "attacks_in_flight": 0,
            "seconds": 2.0,
            "global_loss": 1 / r,
            "global_accuracy": 0.05 * r,
            "attack_lag_rounds": 0,
        }
        for r in range(1, n + 1)
    ]


def make_folder(
    folder: Path,
    attacks: list[dict],
    round_rows: list[dict],
    attack_columns=ATTACK_COLUMNS,
    round_columns=ROUND_COLUMNS,
    config: dict | None = None,
) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps({"run_name": folder.name, "run_config": {"num-server-rounds": 15, **(config or {})}})
    )
    write_csv(folder / "attacks.csv", attack_columns, attacks)
    write_csv(folder / "rounds.csv", round_columns, round_rows)
    return folder


def random_run(folder: Path, n_rounds: int = 15, seed: int = 0) -> Path:
    """pisme and sme, recovered and oracle labels, 4 clients a round, PSNR rising with the rounds."""
    rng = np.random.default_rng(seed)
    rows = [
        attack(
            r,
            c,
            method,
            labels,
            psnr=12 + r + rng.normal(0, 2),
            ssim=rng.uniform(0.2, 1.0),
            lpips=rng.uniform(0.0, 0.5),
            label_accuracy=rng.choice([0.75, 1.0]),
        )
        for r in range(1, n_rounds + 1)
        for c in range(4)
        for method in ("pisme", "sme")
        for labels in ("recovered", "oracle")
    ]
    return make_folder(folder, rows, rounds(n_rounds))


# ---------------------------------------------------------------- intervals


@pytest.mark.parametrize("metric", METRICS)
def test_intervals_stay_inside_the_metric_range_near_its_bounds(tmp_path, metric):
    bottom, top = METRIC_RANGES[metric]
    top = 1.0 if math.isinf(top) else top  # LPIPS: values near 0
    rng = np.random.default_rng(1)
    near_bottom = [bottom, bottom + 1e-3, bottom + 0.4 * (top - bottom)]
    near_top = [top, top - 1e-3, top - 0.4 * (top - bottom)]
    spread = list(rng.uniform(bottom, top, size=5))
    groups = [near_bottom, near_top, spread, [bottom, top, bottom, top]]
    # recovered_fraction is recovered / k (analysis.load)
    given = (
        (lambda v: {"recovered": v * 1000, "k": 1000}) if metric == "recovered_fraction" else (lambda v: {metric: v})
    )
    rows = [attack(r, c, **given(value)) for r, values in enumerate(groups, start=1) for c, value in enumerate(values)]
    table = per_round(load_run(make_folder(tmp_path / "run", rows, rounds(len(groups)))).attacks)
    low, high = table[f"{metric}_ci95_low"], table[f"{metric}_ci95_high"]
    assert low.notna().all() and high.notna().all()
    bottom, top = METRIC_RANGES[metric]
    assert (low >= bottom).all() and (high <= top).all() and (low <= high).all()
    # The bounds are reached: the unclipped interval would leave the range.
    assert low.iloc[0] == bottom and (math.isinf(top) or high.iloc[1] == top)


def test_no_interval_below_three_values(tmp_path):
    assert all(math.isnan(v) for v in mean_ci95([0.4, 0.6], "ssim")[1:])
    rows = [
        attack(1, 0, psnr=10),
        attack(1, 1, psnr=30),
        attack(2, 0, psnr=10),
        attack(2, 1, psnr=20),
        attack(2, 2, psnr=30),
        attack(3, 0, status="failed", psnr=""),
        attack(3, 1),
        attack(3, 2),
    ]
    folder = make_folder(tmp_path / "run", rows, rounds(3))
    table = per_round(load_run(folder).attacks).set_index("round")
    for metric in METRICS:
        assert table.loc[[1, 3], f"{metric}_ci95_low"].isna().all()  # n = 2 (the failed row is not a value)
        assert table.loc[[1, 3], f"{metric}_ci95_high"].isna().all()
    assert table.loc[2, "psnr_ci95_low"] < 20 < table.loc[2, "psnr_ci95_high"]
    # The report shows a blank cell, not NaN or a dash, and the CSV export an empty field.
    out = tmp_path / "out"
    assert main([str(folder), "--out", str(out), "--format", "md"]) == 0
    text = (out / "report.md").read_text()
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)
    verdict_blank = "  |" * 12  # the verdict's three metrics, recorded by no row here
    assert f"| 1 | pisme | none | recovered | 2 | 2 | 0 |{verdict_blank} 20 | 20 |  |  |" in text
    exported = pd.read_csv(out / "per_round.csv", keep_default_na=False)
    assert exported.loc[exported["round"] == 1, "psnr_ci95_low"].tolist() == [""]


# ---------------------------------------------------------------- summary table and accuracy


def test_summary_table_has_one_row_per_group_and_few_sentences(tmp_path):
    run = load_run(random_run(tmp_path / "run"))
    table = summary_table(run)
    assert list(zip(table["method"], table["labels"])) == [
        ("pisme", "oracle"),
        ("pisme", "recovered"),
        ("sme", "oracle"),
        ("sme", "recovered"),
    ]
    assert (table["defense"] == "none").all()
    assert (table["rounds_attacked"] == 15).all() and (table["n_ok"] == 60).all() and (table["n_failed"] == 0).all()
    assert (table["psnr_first"] < table["psnr_last"]).all()
    assert (table["accuracy_source"] == "global_accuracy").all()
    assert (table["psnr_accuracy_corr"] > 0.8).all() and (table["psnr_trend"] - 1).abs().max() < 0.3
    # 15 rounds, 2 methods: one sentence per method and one on utility, not one per round.
    sentences = summary_sentences(run)
    assert len(sentences) == 3 and sentences[-1] == "Model utility: global accuracy 75.0% after round 15."


def test_accuracy_is_global_when_present_else_eval(tmp_path):
    new = load_run(make_folder(tmp_path / "new", [attack(r, 0) for r in (1, 2)], rounds(2)))
    table = per_round(new.attacks, new.rounds)
    assert table["accuracy"].tolist() == pytest.approx([0.05, 0.1])
    assert set(table["accuracy_source"]) == {"global_accuracy"}
    old = load_run(
        make_folder(tmp_path / "old", [attack(r, 0) for r in (1, 2)], rounds(2), OLD_ATTACK_COLUMNS, OLD_ROUND_COLUMNS)
    )
    table = per_round(old.attacks, old.rounds)
    assert table["accuracy"].tolist() == pytest.approx([0.1, 0.2])
    assert set(table["accuracy_source"]) == {"eval_accuracy"}
    # A run that has global_accuracy columns but no values yet also falls back.
    empty_global = [{**row, "global_accuracy": ""} for row in rounds(2)]
    partial = load_run(make_folder(tmp_path / "partial", [attack(1, 0)], empty_global))
    assert per_round(partial.attacks, partial.rounds)["accuracy_source"].tolist() == ["eval_accuracy"]


def test_leakage_vs_accuracy_figure_is_written(tmp_path):
    runs = [
        load_run(random_run(tmp_path / "a", n_rounds=4)),
        load_run(
            make_folder(
                tmp_path / "old",
                [attack(r, c) for r in (1, 2) for c in (0, 1, 2)],
                rounds(2),
                OLD_ATTACK_COLUMNS,
                OLD_ROUND_COLUMNS,
                {"defense": "topk"},
            )
        ),
    ]
    path = save_figure(plot_leakage(runs, x="accuracy"), tmp_path / "fig.png")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
    out = tmp_path / "report"
    assert main([str(tmp_path / "a"), str(tmp_path / "old"), "--out", str(out), "--format", "md"]) == 0
    for name in ("leakage_vs_accuracy", "leakage_over_rounds"):
        png = out / "figures" / f"{name}.png"
        assert png.is_file() and png.stat().st_size > 10_000
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 5 and summary.loc[4, "defense"] == "topk"  # the old run's defense, from its config
    assert summary["accuracy_source"].tolist() == ["global_accuracy"] * 4 + ["eval_accuracy"]
    comparison = pd.read_csv(out / "comparison.csv")
    assert comparison["final_accuracy"].tolist() == pytest.approx([0.2, 0.2])  # global 0.05 * 4, eval 0.1 * 2
    assert comparison["accuracy_source"].tolist() == ["global_accuracy", "eval_accuracy"]
    with pytest.raises(ValueError, match="x must be"):
        plot_leakage(runs, x="loss")


# ---------------------------------------------------------------- columns and mixed folders


def test_old_new_and_unknown_columns_load(tmp_path):
    old = load_run(make_folder(tmp_path / "old", [attack(1, 0)], rounds(1), OLD_ATTACK_COLUMNS, OLD_ROUND_COLUMNS))
    new = load_run(make_folder(tmp_path / "new", [attack(1, 0)], rounds(1)))
    extra_rows = [{**attack(1, 0), "future": "x"}], [{**rounds(1)[0], "gpu_seconds": 3}]
    extra = load_run(
        make_folder(
            tmp_path / "extra",
            extra_rows[0],
            extra_rows[1],
            ATTACK_COLUMNS + ["future"],
            ROUND_COLUMNS + ["gpu_seconds"],
        )
    )
    for run in (old, new, extra):
        assert list(run.attacks.columns[: len(ATTACK_COLUMNS)]) == ATTACK_COLUMNS
        assert list(run.rounds.columns[: len(ROUND_COLUMNS)]) == ROUND_COLUMNS
        assert run.attacks.loc[0, "psnr"] == 20.0 and run.attacks.loc[0, "defense"] == "none"
    assert math.isnan(old.rounds.loc[0, "global_accuracy"]) and old.attacks.loc[0, "label_estimator"] is None
    assert new.rounds.loc[0, "attack_lag_rounds"] == 0 and new.attacks.loc[0, "label_estimator"] == "bias"
    assert new.attacks["lag_rounds"].dtype == "float64"
    assert extra.attacks.loc[0, "future"] == "x" and extra.rounds.loc[0, "gpu_seconds"] == "3"


def test_a_folder_mixing_two_runs_is_refused(tmp_path, capsys):
    rows = [attack(1, 0), attack(1, 1), attack(2, 0)]
    twice = make_folder(tmp_path / "twice", rows + rows[:1], rounds(2))
    with pytest.raises(
        MixedRunsError,
        match=r"attacks.csv mixes rows of several runs \(2 rows repeat an attack, "
        r"e.g. round 1, partition 0, pisme, labels recovered\)",
    ):
        load_run(twice)
    assert main([str(twice), "--out", str(tmp_path / "out")]) == 2
    assert "mixes rows of several runs" in capsys.readouterr().err
    with pytest.raises(MixedRunsError, match="rounds.csv .*round 2 appears more than once"):
        load_run(make_folder(tmp_path / "rounds", rows, rounds(2) + rounds(2)[1:]))
    tagged = [{**row, "run_id": f"r{row['round']}"} for row in rows]
    with pytest.raises(MixedRunsError, match=r"run_id: r1, r2"):
        load_run(make_folder(tmp_path / "ids", tagged, rounds(2), ATTACK_COLUMNS + ["run_id"]))
    # The same attack with oracle labels, or a second method, is not a repeat.
    ok = rows + [attack(1, 0, labels="oracle"), attack(1, 0, method="sme")]
    assert len(load_run(make_folder(tmp_path / "ok", ok, rounds(2))).attacks) == 5
