"""Crash-safe result files: atomic text, JSON and whole-CSV writes, and CSV rows appended one whole
line at a time.

Every write goes through ``_write_all``: a short ``os.write`` is continued until every byte is on
the file, a failing ``os.write`` (ENOSPC, EIO, ...) is retried ``WRITE_TRIES`` times with a short
backoff, and then an OSError naming the file is raised. Files are fsync'd, and so is their folder
when a file is created or renamed into it, so a finished write survives a power cut.

A CSV row is formatted in memory and appended on an O_APPEND descriptor under an exclusive flock;
a row that cannot be written whole is cut off again, so the file never keeps half a row.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import logging
import math
import os
import re
import secrets
import time
from pathlib import Path

log = logging.getLogger(__name__)

WRITE_TRIES = 4  # one write and three retries
RETRY_DELAYS = (0.05, 0.2, 0.5)  # seconds before the 2nd, 3rd and 4th try


def _write_all(fd: int, data: bytes, path) -> None:
    """Write every byte of ``data`` to ``fd``: short writes are continued, a failing write is retried
    (``WRITE_TRIES`` tries in all, ``RETRY_DELAYS`` apart). Raises OSError naming ``path`` (same errno
    as the last failure) when a write still fails; the bytes written before it stay on the file (the
    callers cut them off or discard the file). TypeError for ``data`` that is not bytes-like."""
    view = memoryview(data).cast("B")
    done, failures = 0, 0
    while done < len(view):
        try:
            n = os.write(fd, view[done:])
        except OSError as exc:
            failures += 1
            if failures >= WRITE_TRIES:
                raise OSError(
                    exc.errno,
                    f"could not write {path} ({failures} tries, {done} of {len(view)} bytes written): {exc.strerror}",
                ) from exc
            log.warning("write to %s failed (%s); retrying", path, exc.strerror)
            time.sleep(RETRY_DELAYS[min(failures, len(RETRY_DELAYS)) - 1])
            continue
        if n <= 0:  # a write that makes no progress would loop forever
            raise OSError(errno.EIO, f"could not write {path}: os.write wrote {n} of {len(view) - done} bytes")
        done += n


def _fsync_dir(folder) -> None:
    """fsync a folder, so a file just created or renamed in it stays after a crash."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new, exclusively created temporary file in ``path``'s folder: (fd, name). Created with mode
    0o666 less the umask, as a plain open() would (tempfile.mkstemp would make it 0o600)."""
    while True:
        name = os.path.join(path.parent, f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), name
        except FileExistsError:
            continue
        except OSError as exc:  # e.g. a read-only folder: name the file the caller asked for
            raise OSError(exc.errno, f"could not write {path}: {exc.strerror}") from exc


def remove_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files ``write_bytes_atomic`` leaves under ``folder`` (recursively) when
    its process is killed mid-write (``.NAME.PID.HEX.tmp``); returns them. Only for a folder no live
    process writes to (a run being resumed)."""
    pattern = re.compile(r"\..+\.\d+\.[0-9a-f]{8}\.tmp")
    removed = []
    for path in sorted(Path(folder).rglob(".*.tmp")):
        if path.is_file() and pattern.fullmatch(path.name):
            path.unlink()
            removed.append(path)
    return removed


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it over ``path`` and fsync
    the folder.

    Creates missing parent folders; on any error the temporary file is removed and ``path`` is
    untouched. Raises OSError naming ``path`` when the folder is not writable or a write still fails
    after its retries (``_write_all``); TypeError when ``data`` is not bytes-like.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        try:
            _write_all(fd, data, path)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
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


def _cut_partial_line(fd: int, path) -> int:
    """Cut off a last line without its "\n" (a row an earlier crash left half written); returns the
    file's size after. A quoted cell holding a newline would be cut at that newline: the rows written
    here hold numbers and identifiers only."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    keep, end = 0, size
    while end > 0:  # search back for the last newline, 64 KiB at a time
        start = max(0, end - 65536)
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            keep = start + found + 1
            break
        end = start
    log.warning("%s ended in a partial line of %d bytes (an earlier crash); cut it off", path, size - keep)
    os.ftruncate(fd, keep)
    return keep


def header_mismatch(header: list[str], columns) -> str:
    """ "" when a CSV's ``header`` is exactly ``columns``; else what differs, as
    "missing: [...], unknown: [...]" (for the error that refuses to append to it)."""
    columns = list(columns)
    if header == columns:
        return ""
    return f"missing: {[c for c in columns if c not in header]}, unknown: {[c for c in header if c not in columns]}"


def _header(fd: int) -> list[str]:
    """The column names on the first line of the open CSV file ``fd``."""
    head, offset = b"", 0
    while b"\n" not in head:
        chunk = os.pread(fd, 65536, offset)
        if not chunk:
            break
        head, offset = head + chunk, offset + len(chunk)
    return next(csv.reader([head.split(b"\n", 1)[0].decode()]), [])


def read_csv(path: str | os.PathLike, former: dict | None = None, own=()) -> tuple[list[str], list[dict]]:
    """(header, rows as dicts of text) of the CSV at ``path``; ([], []) when it does not exist.

    former: {a column's former name: today's name} (fl_attack.schema.FORMER_NAMES): an older record's
    column is read under today's name, unless the header has today's name too or the former name is one
    of ``own`` (the columns the reader's table still has under that name). The file is never changed."""
    path = Path(path)
    if not path.is_file():
        return [], []
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
        names = current_names(header, former or {}, own)
        reader = csv.DictReader(f, fieldnames=names)
        return names, list(reader)


def current_names(header: list[str], former: dict, own=()) -> list[str]:
    """``header`` with each former name in ``former`` replaced by today's (``read_csv``'s rule)."""
    return [former[c] if c in former and c not in own and former[c] not in header else c for c in header]


def append_csv_row(path: str | os.PathLike, row: dict, columns: list[str]) -> None:
    """Append ``row`` (missing columns left empty) as one whole line to the CSV at ``path``, creating
    the file (and missing folders) with a header line first; then fsync the file, and its folder
    when the file was new.

    Never a misaligned row: when the file exists, its header must equal ``columns``; otherwise
    ValueError (it was written by another version of the schema), and nothing is written.
    Never half a row: the row is one buffer written under an exclusive flock (other appenders wait);
    if the file does not end in "\n" (a partial line an earlier crash left), that partial line is
    TRUNCATED before the row is written, so the file only ever holds whole lines; a row that still
    cannot be written whole after the retries of ``_write_all`` is cut off again and OSError naming
    ``path`` is raised. Raises ValueError, before touching the disk, for keys that are not in
    ``columns``, so no value is silently dropped.
    """
    unknown = sorted(set(row) - set(columns))
    if unknown:
        raise ValueError(f"row has columns not in the file's header: {unknown}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = io.StringIO()
    csv.writer(line, lineterminator="\n").writerow([csv_cell(row.get(c)) for c in columns])
    header = io.StringIO()
    csv.writer(header, lineterminator="\n").writerow(columns)
    created = not path.exists()
    try:  # O_RDWR: the partial-line check reads the file's end
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise OSError(exc.errno, f"could not write {path}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = _cut_partial_line(fd, path)
        differs = header_mismatch(_header(fd), columns) if size else ""
        if differs:
            raise ValueError(
                f"{path} has other columns than this version writes ({differs}); "
                "nothing was appended, so that no row lands under the wrong header"
            )
        data = line.getvalue().encode() if size else (header.getvalue() + line.getvalue()).encode()
        try:
            _write_all(fd, data, path)
        except BaseException:
            os.ftruncate(fd, size)  # never leave half a row behind
            os.fsync(fd)
            raise
        os.fsync(fd)
    finally:
        os.close(fd)  # also releases the flock
    if created:
        _fsync_dir(path.parent)


# Set to N, the process SIGKILLs itself right after a CsvTable's N-th row is written: how the tests
# interrupt a real experiment at a known point.
KILL_ENV = "FL_ATTACK_SIGKILL_AFTER_ROWS"


def _typed(text: str):
    """A CSV cell read back: int, float, None for "", else the text."""
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class CsvTable:
    """A CSV of result rows (results.csv, an experiment's NAME.csv), rewritten whole and atomically
    (temporary file + os.replace) after every row, so a reader never sees half a file and a crash
    loses nothing done. Columns: ``columns``, then any new key of a row, in first-seen order.

    key: the columns that identify one measurement. With a key, the rows already in NAME.csv are
    kept and ``done(...)`` tells the experiment which to skip, so rerunning the same command
    resumes where it stopped. NAME.json beside it records ``identity`` (the scale); a CSV
    written with another identity raises ValueError (use another --out) before any work.
    Without a key, the file starts empty (a header only), replacing one of the same name.
    former: {former name: today's name} for the rows read back (``read_csv``; none of ``columns`` is
    renamed), so a table an older version began resumes under today's names.
    """

    def __init__(
        self, path: Path, columns: list[str], key: tuple = (), identity: dict | None = None, former: dict | None = None
    ):
        self.path, self.columns, self.key, self.rows = Path(path), list(columns), tuple(key), []
        self.former = former
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.key:
            self._resume(identity or {})
        self._write()

    def _resume(self, identity: dict) -> None:
        meta = self.path.with_suffix(".json")
        header, rows = read_csv(self.path, self.former, self.columns)
        if rows:
            if not meta.is_file():
                raise ValueError(f"{self.path} has rows but no {meta.name}: its scale is unknown; use another --out")
            recorded = json.loads(meta.read_text())
            if recorded != identity:
                diff = ", ".join(
                    f"{k}: {recorded.get(k)!r} there, {identity.get(k)!r} now"
                    for k in sorted(set(recorded) | set(identity))
                    if recorded.get(k) != identity.get(k)
                )
                raise ValueError(f"{self.path} was written at another scale ({diff}); use another --out")
            self.rows = [{k: _typed(v) for k, v in row.items()} for row in rows]
            self.columns += [c for c in header if c not in self.columns]
        write_json_atomic(meta, identity)

    def done(self, **key) -> bool:
        """Whether a row with these key values (compared as CSV text) is already recorded."""
        want = {k: csv_cell(v) for k, v in key.items()}
        return any(all(csv_cell(row.get(k)) == v for k, v in want.items()) for row in self.rows)

    def add(self, row: dict) -> None:
        self.rows.append(dict(row))
        for key in row:
            if key not in self.columns:
                self.columns.append(key)
        self._write()
        if os.environ.get(KILL_ENV) == str(len(self.rows)):  # fault injection for the resume tests
            os.kill(os.getpid(), 9)  # SIGKILL: no clean-up of any kind

    def _write(self) -> None:
        write_text_atomic(self.path, csv_text(self.rows, self.columns))
