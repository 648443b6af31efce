"""Crash-safe result files: atomic JSON writes and CSV rows appended one whole line at a time.

A row is formatted in memory and written with a single ``os.write`` on an O_APPEND descriptor,
then fsync'd, so a crash never leaves half a row and never loses a row already written.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """Write JSON to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


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
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(header.getvalue())
        try:
            os.link(tmp, path)  # atomic create-if-absent: never clobbers a header written meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    line = io.StringIO()
    csv.writer(line).writerow([_cell(row.get(c)) for c in columns])
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.getvalue().encode())
        os.fsync(fd)
    finally:
        os.close(fd)
