"""The crash-safe writers every result file goes through (fl_attack/records.py)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fl_attack.records import (
    append_csv_row,
    csv_text,
    read_csv,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)


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


@pytest.mark.runtime
def test_analysis_and_records_import_without_torch():
    """The report path is light: fl_attack's public names load lazily, so analysis never starts torch."""
    code = (
        "import sys, fl_attack.records, analysis.report, analysis.defenses; "
        "assert 'torch' not in sys.modules, 'torch was imported'; "
        "from fl_attack import reconstruct, ObservedUpdate; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_csv_cells_round_trip_and_mark_missing_values():
    rows = [
        {"psnr": 21.25, "label": None, "ssim": float("nan"), "n": 3, "np": np.float64(0.5)},
        {"psnr": 1 / 3, "extra": "ignored"},
    ]
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


def test_append_csv_row_refuses_a_file_with_another_header_and_leaves_it_alone(tmp_path):
    """A run recorded by an older version (fewer columns): appending would shift every cell."""
    path = tmp_path / "attacks.csv"
    append_csv_row(path, {"round": 1, "psnr": 20.0}, ["round", "psnr"])
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"missing: \['device'\]"):
        append_csv_row(path, {"round": 2, "psnr": 21.0, "device": "cpu"}, ["round", "psnr", "device"])
    with pytest.raises(ValueError, match=r"unknown: \['psnr'\]"):
        append_csv_row(path, {"round": 2}, ["round"])
    assert path.read_bytes() == before


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


# Injected faults: the real writers against a failing os.write, and what stays on disk ------------

import errno  # noqa: E402

import fl_attack.records as records  # noqa: E402

REAL_WRITE = os.write


@pytest.fixture
def no_backoff(monkeypatch):
    monkeypatch.setattr(records, "RETRY_DELAYS", (0.0,))


def _short_writes(monkeypatch, at_most=3):
    """os.write that writes at most ``at_most`` bytes per call, as a full disk or a signal may."""
    calls = []

    def short(fd, data):
        calls.append(len(data))
        return REAL_WRITE(fd, bytes(data[:at_most]))

    monkeypatch.setattr(os, "write", short)
    return calls


def _failing_writes(monkeypatch, failures, code=errno.ENOSPC):
    """os.write that raises OSError(code) ``failures`` times, then writes (failures=None: always)."""
    state = {"failed": 0}

    def failing(fd, data):
        if failures is None or state["failed"] < failures:
            state["failed"] += 1
            raise OSError(code, os.strerror(code))
        return REAL_WRITE(fd, data)

    monkeypatch.setattr(os, "write", failing)
    return state


def test_short_writes_are_completed_to_whole_rows_and_whole_files(tmp_path, monkeypatch):
    calls = _short_writes(monkeypatch)
    path = tmp_path / "attacks.csv"
    append_csv_row(path, {"round": 1, "psnr": 20.25}, ["round", "psnr"])
    append_csv_row(path, {"round": 2, "psnr": 21.5}, ["round", "psnr"])
    write_text_atomic(tmp_path / "summary.json", '{"ok": true}\n')
    monkeypatch.undo()
    assert len(calls) > 6  # really written a few bytes at a time
    assert path.read_text() == "round,psnr\n1,20.25\n2,21.5\n"
    assert (tmp_path / "summary.json").read_text() == '{"ok": true}\n'


def test_a_full_disk_for_a_moment_is_retried_and_the_row_is_kept_once(tmp_path, monkeypatch, no_backoff, caplog):
    path = tmp_path / "attacks.csv"
    append_csv_row(path, {"round": 1}, ["round"])
    state = _failing_writes(monkeypatch, failures=2)
    append_csv_row(path, {"round": 2}, ["round"])
    assert state["failed"] == 2
    state["failed"] = 0
    write_text_atomic(tmp_path / "report.md", "text")
    monkeypatch.undo()
    assert state["failed"] == 2
    assert path.read_text() == "round\n1\n2\n"
    assert (tmp_path / "report.md").read_text() == "text"
    assert f"write to {path} failed (No space left on device); retrying" in caplog.text


def test_a_write_that_always_fails_raises_naming_the_file_and_keeps_the_old_contents(tmp_path, monkeypatch, no_backoff):
    path = tmp_path / "attacks.csv"
    append_csv_row(path, {"round": 1}, ["round"])
    write_text_atomic(tmp_path / "summary.json", "old")
    _failing_writes(monkeypatch, failures=None)
    with pytest.raises(
        OSError, match=f"could not write {path} \\(4 tries, 0 of 2 bytes written\\): No space left on device"
    ) as info:
        append_csv_row(path, {"round": 2}, ["round"])
    assert info.value.errno == errno.ENOSPC
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'summary.json'}"):
        write_text_atomic(tmp_path / "summary.json", "new")
    monkeypatch.undo()
    assert path.read_text() == "round\n1\n"
    assert (tmp_path / "summary.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attacks.csv", "summary.json"]  # no temporary


def test_a_row_failing_halfway_is_cut_off_never_half_kept(tmp_path, monkeypatch, no_backoff):
    path = tmp_path / "attacks.csv"
    append_csv_row(path, {"round": 1, "psnr": 1.0}, ["round", "psnr"])
    state = {"calls": 0}

    def half_then_full_disk(fd, data):  # 3 bytes land, then the disk is full for good
        state["calls"] += 1
        if state["calls"] == 1:
            return REAL_WRITE(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full_disk)
    with pytest.raises(OSError, match="3 of 12 bytes written"):
        append_csv_row(path, {"round": 2, "psnr": 22.123456}, ["round", "psnr"])
    monkeypatch.undo()
    assert path.read_text() == "round,psnr\n1,1.0\n"


def test_a_partial_line_left_by_a_crash_is_truncated_before_the_next_row(tmp_path):
    path = tmp_path / "attacks.csv"
    append_csv_row(path, {"round": 1, "psnr": 1.0}, ["round", "psnr"])
    with open(path, "ab") as f:  # the crash: half a row, no newline
        f.write(b"2,22.1")
    append_csv_row(path, {"round": 3, "psnr": 3.0}, ["round", "psnr"])
    assert path.read_text() == "round,psnr\n1,1.0\n3,3.0\n"
    path.write_bytes(b"rou")  # even the header half written
    append_csv_row(path, {"round": 4, "psnr": 4.0}, ["round", "psnr"])
    assert path.read_text() == "round,psnr\n4,4.0\n"


def test_files_and_their_folder_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    append_csv_row(tmp_path / "attacks.csv", {"a": 1}, ["a"])
    assert synced == [str(tmp_path / "attacks.csv"), str(tmp_path)]
    synced.clear()
    append_csv_row(tmp_path / "attacks.csv", {"a": 2}, ["a"])  # the folder entry exists already
    assert synced == [str(tmp_path / "attacks.csv")]
    synced.clear()
    write_text_atomic(tmp_path / "report.md", "x")
    assert len(synced) == 2 and synced[0].startswith(str(tmp_path / ".report.md.")) and synced[1] == str(tmp_path)


def test_a_folder_that_refuses_new_files_raises_naming_the_file_even_as_root(tmp_path, monkeypatch):
    """What a read-only folder does, injected where it happens: EACCES from os.open of any file in
    the folder (root ignores file modes, so the chmod test below skips there)."""
    import errno

    folder = tmp_path / "ro"
    folder.mkdir()
    append_csv_row(folder / "attacks.csv", {"a": 1}, ["a"])
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(PermissionError, match=f"could not write {folder / 'summary.json'}: Permission denied"):
        write_text_atomic(folder / "summary.json", "x")
    with pytest.raises(PermissionError, match=f"could not write {folder / 'rounds.csv'}: Permission denied"):
        append_csv_row(folder / "rounds.csv", {"a": 1}, ["a"])
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == ["attacks.csv"]  # nothing half-written left


def test_a_read_only_folder_raises_naming_the_file(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    append_csv_row(folder / "attacks.csv", {"a": 1}, ["a"])
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: file modes are not enforced")
        with pytest.raises(PermissionError, match=f"could not write {folder / 'summary.json'}"):
            write_text_atomic(folder / "summary.json", "x")
        with pytest.raises(PermissionError, match=f"could not write {folder / 'rounds.csv'}"):
            append_csv_row(folder / "rounds.csv", {"a": 1}, ["a"])
        assert sorted(p.name for p in folder.iterdir()) == ["attacks.csv"]
    finally:
        folder.chmod(0o700)


def _append_rows(path: str, writer: int, count: int, start) -> None:
    """A writer whose every os.write lands half its bytes after a pause (a nearly full disk): another
    writer sees its half row on the file's end, and only the flock keeps it from cutting it off.
    ``start``: a Barrier both writers pass before their first row, so that they run at once."""
    real_write = os.write

    def short_write(fd, data):
        time.sleep(0.001)
        return real_write(fd, data[: max(1, len(data) // 2)])

    os.write = short_write
    start.wait(timeout=120)
    for i in range(count):
        append_csv_row(path, {"writer": writer, "i": i, "text": "x" * 500}, ["writer", "i", "text"])


@pytest.mark.heavy
def test_concurrent_appenders_each_keep_every_row_whole(tmp_path):
    """Two real processes appending 300 rows each to one CSV at once (a barrier starts them
    together; their rows interleave in the file), with short writes (the flock): 600 whole rows,
    one header."""
    import multiprocessing

    path = str(tmp_path / "attacks.csv")
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    procs = [context.Process(target=_append_rows, args=(path, w, 300, start)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    text = Path(path).read_text()
    lines = text.split("\n")
    assert lines[0] == "writer,i,text" and lines[-1] == "" and len(lines) == 602  # ends with a whole row
    assert all(re.fullmatch(r"[12],\d+,x{500}", line) for line in lines[1:-1])  # every row whole
    writers = [line[0] for line in lines[1:-1]]
    # The writers overlapped: the file alternates between them more than once.
    assert sum(a != b for a, b in zip(writers, writers[1:])) > 1, "the writers did not run at once"
    header, rows = read_csv(path)
    assert header == ["writer", "i", "text"] and len(rows) == 600
    for w in ("1", "2"):
        assert [r["i"] for r in rows if r["writer"] == w] == [str(i) for i in range(300)]
