"""The leakage-over-rounds study's record and page (analysis/leakage_study.py, analysis/leakage_figure.py,
analysis/docs.py's rounds block): its table in the verdict's unit, read from real run folders, and the page
and figure written from study.csv alone.

The run folders are tests/golden/frontier/'s (a real tiny run: 3 writers of 8 samples, 3 rounds, each
attacked by PI-SME and the remembering server every round): a fixture, NOT the study. The study's own
record, once run, is docs/leakage-over-rounds/."""

from __future__ import annotations

import csv
import json
import shutil
import struct
from collections import defaultdict
from pathlib import Path

import pandas as pd
from scipy.stats import beta

from analysis import docs
from analysis.leakage_figure import plot_rounds_study, read_study, rounds_markdown
from analysis.leakage_study import TABLE_COLUMNS, study_table
from analysis.plots import save_figure
from analysis.studies import study_main

RUN = Path(__file__).parent / "golden" / "frontier" / "runs" / "none"


def _reference(path: Path) -> dict:
    """{(method, round): [images, recovered, guess]} summed from attacks.csv with the csv module alone."""
    sums = defaultdict(lambda: [0, 0, 0])
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok":
                s = sums[(row["method"], int(row["round"]))]
                s[0] += int(row["k"])
                s[1] += int(row["recovered"])
                s[2] += int(row["guess_recovered"])
    return sums


def _study(tmp_path: Path) -> Path:
    """A study folder: the fixture's run, and a copy of it as that run's replay "again"."""
    study = tmp_path / "study"
    shutil.copytree(RUN, study / "runs" / "none")
    shutil.copytree(RUN, study / "runs" / "none" / "replays" / "again")
    return study


def test_the_table_sums_the_verdicts_counts_per_round_with_the_exact_interval(tmp_path):
    """Per method and round: the tracked clients' images, recovered and best-guess counts summed as attacks.csv
    has them (a reference reading the file with the csv module), the Clopper-Pearson interval from the beta
    quantiles, the chance k-weighted; a replay's rows are named RUN/REPLAY."""
    study = _study(tmp_path)
    table = study_table([study / "runs" / "none", study / "runs" / "none" / "replays" / "again"])
    assert list(table.columns) == TABLE_COLUMNS
    assert set(table["run"]) == {"none", "none/again"}
    reference = _reference(RUN / "attacks.csv")
    mine = table[table["run"] == "none"]
    assert len(mine) == len(reference) == 6  # pisme and pisme+memory, 3 rounds
    for row in mine.itertuples():
        images, recovered, guess = reference[(row.method, row.round)]
        assert (row.images, row.recovered, row.guess_recovered, row.n) == (images, recovered, guess, 3)
        low = beta.ppf(0.025, recovered, images - recovered + 1) if recovered else 0.0
        high = beta.ppf(0.975, recovered + 1, images - recovered) if recovered < images else 1.0
        assert abs(row.fraction_low - low) < 1e-9 and abs(row.fraction_high - high) < 1e-9
        assert row.fraction == recovered / images
    by = {(r.method, r.round): r for r in mine.itertuples()}
    assert (by[("pisme", 1)].recovered, by[("pisme+memory", 3)].recovered) == (6, 6)  # the fixture's rows


def test_the_page_block_and_figure_are_written_from_study_csv(tmp_path):
    """The rounds block from a study.csv: per round a line with the accuracy and each attack's count (the
    first two with their interval), the totals, the figure linked; the figure is a PNG. Without a
    study.csv the block says how to record one."""
    study = _study(tmp_path)
    record = tmp_path / "record"
    record.mkdir()
    assert "No study of today's code is recorded" in docs.rounds_block(record)
    table = study_table([study / "runs" / "none"])
    table.to_csv(record / "study.csv", index=False)
    read = read_study(record / "study.csv")
    block = docs.rounds_block(record)
    assert block.startswith(docs._generated("rounds"))
    assert rounds_markdown(read) in block + "\n"
    lines = [line for line in block.splitlines() if line.startswith("| ")]
    assert lines[0] == "| round | test acc. | PI-SME | remembering server | best guess | chance |"
    round1 = next(line for line in lines if line.startswith("| 1 |"))
    assert "| 6 of 24 (" in round1  # 1 + 4 + 1 of 3 x 8
    assert (
        "each round attacks the same clients' images again): PI-SME 8 of 72 (3 rounds); "
        "remembering server 18 of 72 (3 rounds); the best guess 0 of 72." in block
    )
    width, height = struct.unpack(">II", save_figure(plot_rounds_study(read), tmp_path / "f.png").read_bytes()[16:24])
    assert width >= 400 and height >= 250


def test_the_2026_12_01_study_csv_is_refused_by_name(tmp_path):
    """A unit test: the dated study's study.csv (no verdict columns) is not read as today's."""
    old = docs.ROOT / "docs" / "leakage-over-rounds-2026-12-01" / "study.csv"
    try:
        read_study(old)
    except ValueError as exc:
        assert "no images, recovered" in str(exc) and str(old) in str(exc)
    else:
        raise AssertionError("the dated study.csv was read as today's")


def test_the_record_keeps_each_runs_and_replays_rows_and_names_the_folder_out(tmp_path):
    """A unit test: rounds-record copies study.csv, study.json (its command's folder as OUT) and each run's and
    replay's attacks.csv and rounds.csv, nothing else of their folders."""
    study = _study(tmp_path)
    table = study_table([study / "runs" / "none", study / "runs" / "none" / "replays" / "again"])
    table.to_csv(study / "study.csv", index=False)
    command = f"python -m analysis.leakage_study --out {study}"
    (study / "study.json").write_text(json.dumps({"calls": [{"command": command, "started": "t"}]}))
    docs.copy_rounds(study, tmp_path / "record")
    record = tmp_path / "record"
    assert json.loads((record / "study.json").read_text())["calls"][0]["command"] == (
        "python -m analysis.leakage_study --out OUT"
    )
    for kept in (record / "runs" / "none", record / "runs" / "none" / "replays" / "again"):
        assert sorted(p.name for p in kept.iterdir() if p.is_file()) == ["attacks.csv", "rounds.csv"]
        assert (kept / "attacks.csv").read_bytes() == (RUN / "attacks.csv").read_bytes()


def test_a_study_records_its_call(tmp_path):
    """A unit test (no run): a study's call is in study.json with its command, commit and wall time."""
    written = study_main(
        ["--out", str(tmp_path), "--skip-replays"],
        label="t",
        prog="python -m analysis.leakage_study",
        doc="",
        runs=[],
        replays=[],
        outputs=lambda out, folders: pd.DataFrame(),
    )
    assert written == 0
    (call,) = json.loads((tmp_path / "study.json").read_text())["calls"]
    assert call["command"].startswith("python -m analysis.leakage_study --out ")
    assert call["seconds"] is not None and call["ended"] and call["settings"] == {}


def test_the_committed_block_is_the_generators():
    """docs/leakage-over-rounds.md's rounds block is what `python -m analysis.docs rounds` writes."""
    page = (docs.ROOT / docs.ROUNDS_PAGE).read_text()
    expected = docs.with_blocks(page, {"rounds": docs.rounds_block(docs.ROOT / docs.ROUNDS_RECORD)})
    assert page == expected, "docs/leakage-over-rounds.md's rounds block is stale: python -m analysis.docs rounds"
