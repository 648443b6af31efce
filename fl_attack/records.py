"""Crash-safe result files: atomic text, JSON and whole-CSV writes, and CSV rows appended one whole
line at a time.

A row is formatted in memory and written with a single ``os.write`` on an O_APPEND descriptor,
then fsync'd, so a crash never leaves half a row and never loses a row already written.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import secrets
from pathlib import Path

# The columns of a run folder's CSVs (README "Results of a run"), shared by the writers
# (strategies/) and the reader (analysis/load.py). New columns go at the end, except in
# ATTACK_COLUMNS where "image" stays last: the reader spots a cut-off last line by its image path.
ROUND_COLUMNS = ["round", "clients", "train_loss", "eval_loss", "eval_accuracy", "attacks_in_flight", "seconds",
                 "global_loss", "global_accuracy", "attack_lag_rounds", "attacks_dispatched", "attacks_skipped",
                 "excluded"]
ATTACK_COLUMNS = ["round", "node_id", "partition_id", "client_id", "method", "dataset", "defense", "local_steps",
                  "nodes", "iterations", "labels", "psnr", "ssim", "fsim", "lpips", "lsim_honest",
                  "lsim_calibrated", "label_accuracy", "attack_seconds", "status", "error", "label_estimator",
                  "lag_rounds", "image"]


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new, exclusively created temporary file in ``path``'s folder: (fd, name). Created with mode
    0o666 less the umask, as a plain open() would (tempfile.mkstemp would make it 0o600)."""
    while True:
        name = os.path.join(path.parent, f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), name
        except FileExistsError:
            continue


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over ``path``.

    Creates missing parent folders; on any error the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """``text`` as UTF-8 (newlines kept as given), written as ``write_bytes_atomic`` does.

    Raises TypeError, before touching the disk, when ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"write_text_atomic needs a str, got {type(text).__name__}")
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented JSON (keys sorted, unknown types as str) atomically to ``path``."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def csv_cell(value) -> str:
    """A CSV cell: "" for None, "nan" for NaN, else str (shortest round-trip form for floats)."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return str(value)


def csv_text(rows: list[dict], columns) -> str:
    """A whole CSV file (header, then one line per row; keys outside ``columns`` ignored) as text."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_cell(row.get(k)) for k in columns})
    return buf.getvalue()


def read_csv(path: str | os.PathLike) -> tuple[list[str], list[dict]]:
    """(header, rows as dicts of text) of the CSV at ``path``; ([], []) when it does not exist."""
    path = Path(path)
    if not path.is_file():
        return [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def append_csv_row(path: str | os.PathLike, row: dict, columns: list[str]) -> None:
    """Append ``row`` (missing columns left empty) to the CSV at ``path``, creating it with a header.

    Raises ValueError for keys that are not in ``columns``, so no value is silently dropped.
    """
    unknown = sorted(set(row) - set(columns))
    if unknown:
        raise ValueError(f"row has columns not in the file's header: {unknown}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        header = io.StringIO()
        csv.writer(header).writerow(columns)
        fd, tmp = _temp_beside(path)
        with os.fdopen(fd, "w") as f:
            f.write(header.getvalue())
        try:
            os.link(tmp, path)  # atomic create-if-absent: never clobbers a header written meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    line = io.StringIO()
    csv.writer(line).writerow([csv_cell(row.get(c)) for c in columns])
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.getvalue().encode())
        os.fsync(fd)
    finally:
        os.close(fd)
