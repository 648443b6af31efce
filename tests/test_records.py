"""The crash-safe writers every result file goes through (fl_attack/records.py)."""
from __future__ import annotations

import csv
import json
import math
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from fl_attack.records import append_csv_row, csv_text, write_bytes_atomic, write_json_atomic, write_text_atomic


def test_atomic_text_and_json_replace_whole_files_and_leave_no_temporaries(tmp_path):
    path = tmp_path / "sub" / "a.json"
    write_json_atomic(path, {"b": 1, "a": [1.5, None]})
    assert json.loads(path.read_text()) == {"a": [1.5, None], "b": 1}
    write_text_atomic(path, "x\n")
    assert path.read_text() == "x\n"

    with pytest.raises(TypeError):
        write_text_atomic(path, object())
    with pytest.raises(TypeError):
        write_bytes_atomic(path, object())  # a write failing midway leaves the old file and no temporary
    assert path.read_text() == "x\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]
    write_bytes_atomic(path, b"\x89PNG")
    assert path.read_bytes() == b"\x89PNG"


def test_analysis_and_records_import_without_torch():
    """The report path is light: fl_attack's public names load lazily, so analysis never starts torch."""
    code = ("import sys, fl_attack.records, analysis.report, analysis.defenses; "
            "assert 'torch' not in sys.modules, 'torch was imported'; "
            "from fl_attack import reconstruct, ObservedUpdate; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_csv_cells_round_trip_and_mark_missing_values():
    rows = [{"psnr": 21.25, "label": None, "ssim": float("nan"), "n": 3, "np": np.float64(0.5)},
            {"psnr": 1 / 3, "extra": "ignored"}]
    text = csv_text(rows, ["psnr", "label", "ssim", "n", "np"])
    back = list(csv.DictReader(text.splitlines()))
    assert text.splitlines()[0] == "psnr,label,ssim,n,np"
    assert float(back[0]["psnr"]) == 21.25 and float(back[1]["psnr"]) == 1 / 3  # exact round trip
    assert back[0]["label"] == "" and math.isnan(float(back[0]["ssim"])) and back[0]["np"] == "0.5"


def test_append_csv_row_keeps_earlier_rows_and_rejects_unknown_columns(tmp_path):
    path = tmp_path / "attacks.csv"
    append_csv_row(path, {"round": 1, "psnr": 20.0}, ["round", "psnr"])
    append_csv_row(path, {"round": 2}, ["round", "psnr"])
    with pytest.raises(ValueError, match="not in the file's header"):
        append_csv_row(path, {"round": 3, "oops": 1}, ["round", "psnr"])
    rows = list(csv.DictReader(path.open()))
    assert [(r["round"], r["psnr"]) for r in rows] == [("1", "20.0"), ("2", "")]


def test_written_files_get_the_usual_permissions(tmp_path):
    """Result files are shared: like open(), the writers give 0o666 less the umask (not mkstemp's 0o600)."""
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "report.md", "x")
        write_bytes_atomic(tmp_path / "grid.png", b"x")
        append_csv_row(tmp_path / "attacks.csv", {"a": 1}, ["a"])
    finally:
        os.umask(old)
    for name in ("report.md", "grid.png", "attacks.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
