"""One result vocabulary: attacks.csv's columns are defined once (``fl_attack.schema.ATTACK_SCHEMA``),
and the attacker's outcome, the evaluator's row, results.csv, the docs and analysis/ use its names.

A real written attacks.csv (the evaluator through the run folder's writer; a short in-process
federation) has exactly the schema's header; every column is typed and documented, and names where
its value comes from, which the outcome and its target really carry; an older attacks.csv (the golden
record, from before the compile and batch columns) still loads with every column.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import shutil
from pathlib import Path

import pytest

from analysis import aggregate, load
from fl_attack import schema as runs
from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.runtime.workers import AttackJob, AttackOutcome
from fl_attack.audit.run_folder import RunFolder
from fl_attack.evaluation.evaluator import Evaluator, attack_row, results_row
from fl_attack.federation.update import AttackTarget
from fl_attack.records import read_csv
from fl_attack.schema import (
    ATTACK_COLUMNS,
    ATTACK_SCHEMA,
    FORMER_NAMES,
    RESULT_COLUMNS,
    ROUND_COLUMNS,
    ROUND_SCHEMA,
)

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (runs.TARGET, runs.OUTCOME, runs.SCORE, runs.VERDICT, runs.EVALUATOR)


def _header(path: Path) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f))


def test_every_column_is_named_once_typed_and_documented():
    for schema in (ROUND_SCHEMA, ATTACK_SCHEMA):
        names = [c.name for c in schema]
        assert len(set(names)) == len(names)
        assert all(c.kind in (int, float, str) for c in schema)
        assert all(c.doc.strip() for c in schema)
    assert ATTACK_COLUMNS[-1] == "image"  # the reader spots a cut-off last line by its image path
    assert runs.ATTACK_DESCRIPTIONS == {c.name: c.doc for c in ATTACK_SCHEMA}
    assert runs.ATTACKS == {c.name: c.kind for c in ATTACK_SCHEMA}
    documented = (ROOT / "docs" / "run-folder.md").read_text(encoding="utf-8")
    assert [c.name for c in ATTACK_SCHEMA if f"| `{c.name}` |" not in documented] == []


def _outcome_attributes() -> set[str]:
    """AttackOutcome's fields and the properties it reads from its reconstruction."""
    properties = {name for name, value in vars(AttackOutcome).items() if isinstance(value, property)}
    return {f.name for f in dataclasses.fields(AttackOutcome)} | properties


def test_each_attack_column_names_a_source_that_carries_it():
    assert {c.source for c in ATTACK_SCHEMA} == set(SOURCES)
    fields = _outcome_attributes()
    target = AttackTarget(1, (0,), 7, "w0")
    for column in ATTACK_SCHEMA:
        attribute = column.attribute or column.name
        if column.source == runs.OUTCOME:
            assert attribute in fields, column.name
        elif column.source == runs.TARGET:
            assert hasattr(target, attribute), column.name
        else:
            assert not column.attribute, column.name
    assert runs.attack_columns(runs.SCORE) == ("psnr", "ssim", "fsim", "lpips", "label_accuracy", "psnr_recovered")


def test_the_outcome_fills_its_columns_under_their_names():
    # the outcome's fields carry the names of the columns they fill; the one exception is the labels
    # column, whose name the outcome gives the label tensor (its value is label_source)
    fields = _outcome_attributes()
    assert [c.name for c in ATTACK_SCHEMA if c.attribute] == ["labels"]
    assert "attack_seconds" in fields and "seconds" not in fields
    # and no field named like a column holds anything but that column's value
    assert [c for c in ATTACK_COLUMNS if c in fields and c not in runs.attack_columns(runs.OUTCOME)] == []


def test_an_attack_row_written_to_a_run_folder_has_the_schemas_header(tmp_path):
    folder = RunFolder(tmp_path)
    job = AttackJob(3, None, "pisme", AttackConfig(iterations=5), AttackTarget(2, (4,), 99, "w4"))
    outcome = AttackOutcome.failed(job, "RuntimeError: boom", attack_seconds=1.23456)
    row = Evaluator("femnist", defense="topk(0.1)", table=folder.append_attack).record(outcome, None, lag_rounds=1)
    assert list(row) == ATTACK_COLUMNS and _header(folder.attacks_file) == ATTACK_COLUMNS
    with open(folder.attacks_file, newline="") as f:
        (written,) = list(csv.DictReader(f))
    assert written["round"] == "2" and written["partition_id"] == "4" and written["node_id"] == "99"
    assert written["client_id"] == "w4" and written["method"] == "pisme" and written["labels"] == "recovered"
    assert written["status"] == "failed" and written["error"] == "RuntimeError: boom"
    assert written["attack_seconds"] == "1.235" and written["iterations"] == "5" and written["lag_rounds"] == "1"
    assert written["defense"] == "topk(0.1)" and written["dataset"] == "femnist"
    assert math.isnan(float(written["psnr"])) and written["k"] == ""


def test_results_csv_is_a_view_of_attacks_csv_under_its_names():
    assert [c for c in RESULT_COLUMNS if c not in ATTACK_COLUMNS] == []
    row = attack_row(
        method="ig",
        dataset="femnist",
        local_steps=2,
        gradients_per_iteration=1,
        iterations=1,
        labels="recovered",
        partition_id=0,
        label_estimator="support",
        attack_seconds=2.5,
    )
    result = results_row(row)
    assert tuple(result) == RESULT_COLUMNS and result["partition_id"] == 0 and result["attack_seconds"] == 2.5


def test_committed_older_records_are_read_under_todays_names():
    """Unit test of the read-time mapping (``FORMER_NAMES``) on committed records, which stay as written."""
    assert set(FORMER_NAMES.values()) <= set(RESULT_COLUMNS) and not set(FORMER_NAMES) & set(ATTACK_COLUMNS)
    # a results.csv of fl-attack attack from before the renames went: client, nodes, seconds
    old = ROOT / "docs/experiments/prior-option/femnist-E50-check/results.csv"
    assert {"client", "nodes", "seconds"} <= set(_header(old))
    header, rows = read_csv(old, FORMER_NAMES)
    assert not {"client", "nodes", "seconds"} & set(header)
    assert [c for c in header if c not in RESULT_COLUMNS] == []  # an older view: some columns came later
    assert [r["partition_id"] for r in rows] == ["0", "1", "2"]
    assert (rows[0]["method"], rows[0]["gradients_per_iteration"], rows[0]["attack_seconds"]) == ("ig", "1", "1.284")
    # a run folder's attacks.csv from when gradients_per_iteration was nodes, through analysis.load
    folder = ROOT / "docs/demo-record"
    with open(folder / "attacks.csv", newline="") as f:
        written = [float(r["nodes"]) for r in csv.DictReader(f)]
    attacks = load.load_run(folder).attacks
    assert "nodes" not in attacks and attacks["gradients_per_iteration"].tolist() == written == [1.0] * 6
    # a former name that is the file's own column stays: rounds.csv's seconds (the round's wall time)
    header, rows = read_csv(folder / "rounds.csv", FORMER_NAMES, ROUND_COLUMNS)
    assert "seconds" in header and "attack_seconds" not in header and float(rows[0]["seconds"]) > 0


def test_a_resume_rewrites_an_older_attacks_csv_under_todays_names(tmp_path):
    """RunFolder.cut_back (a resume) on copies of the demo record's files: attacks.csv's nodes becomes
    gradients_per_iteration with its values; rounds.csv keeps its own seconds."""
    for name in ("attacks.csv", "rounds.csv"):
        shutil.copy(ROOT / "docs" / "demo-record" / name, tmp_path / name)
    _, old = read_csv(tmp_path / "attacks.csv")
    RunFolder(tmp_path).cut_back(1)
    header, rows = read_csv(tmp_path / "attacks.csv")
    assert header == ATTACK_COLUMNS and rows
    assert [r["gradients_per_iteration"] for r in rows] == [r["nodes"] for r in old if r["round"] == "1"]
    assert _header(tmp_path / "rounds.csv") == ROUND_COLUMNS


def test_analysis_reads_the_schemas_columns():
    readable = set(ATTACK_COLUMNS) | set(load.DERIVED)
    used = [*aggregate.GROUP_KEYS, *aggregate.METRICS, *load.ATTACK_KEY, *load.ATTACK_REQUIRED]
    assert [c for c in used if c not in readable] == []
    assert load.ATTACK_COLUMNS is ATTACK_COLUMNS and load.ATTACK_NUMERIC == runs.numeric(runs.ATTACKS)


def test_an_older_attacks_csv_still_loads_with_every_column(tmp_path):
    golden = ROOT / "tests" / "golden"
    for name in ("attacks.csv", "rounds.csv"):
        shutil.copy(golden / name, tmp_path / name)
    older = _header(tmp_path / "attacks.csv")
    missing = [c for c in ATTACK_COLUMNS if c not in older]
    assert "compile" in missing and "batch" in missing and set(older) - set(ATTACK_COLUMNS) == {"nodes"}
    run = load.load_run(tmp_path)
    assert len(run.attacks) == 8 and run.attacks["gradients_per_iteration"].notna().all()  # its nodes
    assert list(run.attacks.columns[: len(ATTACK_COLUMNS)]) == ATTACK_COLUMNS
    assert run.attacks["batch"].isna().all() and (run.attacks["labels"] == "recovered").all()


@pytest.mark.heavy
def test_a_federations_attacks_csv_has_the_schemas_header(tmp_path):
    from tests.inprocess import serve

    run = serve(tmp_path, partitions=(0, 1), num_rounds=1, attack_method="ig", attack_iterations=1)
    assert _header(run / "attacks.csv") == ATTACK_COLUMNS
    with open(run / "attacks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    for r in rows:
        assert r["labels"] == "recovered" and float(r["attack_seconds"]) > 0 and r["batch"] == "1"
        assert math.isfinite(float(r["psnr"])) and r["k"] != "" and r["worker_id"] and r["compile"]
