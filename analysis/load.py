"""Read one fl-attack run folder (config.json, rounds.csv, attacks.csv) into a `Run`.

The federation appends rows while it runs, so every file may be missing, empty (header only)
or cut off in the middle of its last line. Reading never fails on that: malformed lines are
skipped with a `MalformedLineWarning`, missing files give empty tables with the usual columns.
Older folders (fewer columns) and newer ones (unknown extra columns) load alike; a folder whose
rows come from two runs is refused (`MixedRunsError`).
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fl_attack.records import current_names
from fl_attack.schema import ATTACK_COLUMNS, ATTACKS, FORMER_NAMES, ROUND_COLUMNS, ROUNDS, numeric

# The run folder's typed schema (fl_attack.schema): the writers' and this reader's one column list.
ROUND_NUMERIC, ATTACK_NUMERIC = numeric(ROUNDS), numeric(ATTACKS)
ATTACK_STATUSES = ("ok", "failed")
# A row without these cannot be placed in a table at all.
ROUND_REQUIRED = ("round",)
ATTACK_REQUIRED = ("round", "method", "status")
# One attack per round, client, method and labels source in one run; a repeat means two runs' rows.
ATTACK_KEY = ["round", "partition_id", "method", "labels", "label_estimator"]
RUN_ID_COLUMNS = ("run_id", "run_name")
DERIVED = ["recovered_fraction", "guess_recovered_fraction"]  # load_run's columns after ATTACK_COLUMNS


class NotARunError(ValueError):
    """Raised for a path that is not an fl-attack run folder (no config.json or attacks.csv)."""


class MixedRunsError(NotARunError):
    """Raised for a run folder whose CSV rows come from more than one run."""


class MalformedLineWarning(UserWarning):
    """A CSV line of a run folder was skipped because it is incomplete or unreadable."""


@dataclass
class Run:
    """One run folder, loaded.

    path: the folder; name: run_name from config.json, else the folder name; config: the whole
    config.json (empty dict when missing); rounds: one row per finished round (ROUND_COLUMNS);
    attacks: one row per attack (ATTACK_COLUMNS, numeric columns as floats, status lower case),
    with recovered_fraction and guess_recovered_fraction (recovered / k, guess_recovered / k) after them.
    """

    path: Path
    name: str
    config: dict = field(default_factory=dict)
    rounds: pd.DataFrame = field(default_factory=lambda: _empty_frame(ROUND_COLUMNS, ROUND_NUMERIC))
    attacks: pd.DataFrame = field(
        default_factory=lambda: _empty_frame([*ATTACK_COLUMNS, *DERIVED], [*ATTACK_NUMERIC, *DERIVED])
    )

    @property
    def run_config(self) -> dict:
        """The flat Flower run config (config.json "run_config"); {} when unknown."""
        run_config = self.config.get("run_config", {})
        return run_config if isinstance(run_config, dict) else {}


def is_run_folder(path: str | Path) -> bool:
    """True iff `path` is a folder holding config.json or attacks.csv."""
    path = Path(path)
    return path.is_dir() and ((path / "config.json").is_file() or (path / "attacks.csv").is_file())


def load_run(path: str | Path) -> Run:
    """Load the run folder at `path` into a `Run`.

    Raises NotARunError when `path` is not a folder with config.json or attacks.csv, MixedRunsError
    when its rows come from two runs (see `check_single_run`). Empty `defense` cells (older runs)
    take the run's configured defense. Warns (MalformedLineWarning) for each skipped CSV line and for an
    unreadable config.json.
    """
    path = Path(path)
    if not is_run_folder(path):
        raise NotARunError(f"{path} is not an fl-attack run folder (no config.json or attacks.csv)")
    config = _read_config(path / "config.json")
    name = config.get("run_name") or path.resolve().name
    rounds = read_table(path / "rounds.csv", ROUND_COLUMNS, ROUND_NUMERIC, required=ROUND_REQUIRED)
    attacks = read_table(
        path / "attacks.csv",
        ATTACK_COLUMNS,
        ATTACK_NUMERIC,
        required=ATTACK_REQUIRED,
        statuses=ATTACK_STATUSES,
        former=FORMER_NAMES,
    )
    check_single_run(path, rounds, attacks)
    if attacks["defense"].isna().any():
        attacks["defense"] = attacks["defense"].fillna(configured_defense(config))
    if not rounds.empty:
        rounds = rounds.sort_values("round", kind="stable").reset_index(drop=True)
    if not attacks.empty:
        # Rows are appended as attacks finish; give them a stable reading order.
        attacks = attacks.sort_values(
            ["round", "method", "partition_id"], kind="stable", na_position="last"
        ).reset_index(drop=True)
    # The verdict's counts as fractions of k (fl_attack.evaluation.verdict): NaN for older runs and failed attacks.
    attacks["recovered_fraction"] = attacks["recovered"] / attacks["k"]
    attacks["guess_recovered_fraction"] = attacks["guess_recovered"] / attacks["k"]
    return Run(path=path, name=str(name), config=config, rounds=rounds, attacks=attacks)


def configured_defense(config: dict) -> str:
    """The defense label of config.json ("defense": {"label": ...}), else run_config's, else "none"."""
    defense = config.get("defense")
    if isinstance(defense, dict) and defense.get("label"):
        return str(defense["label"])
    run_config = config.get("run_config")
    return str(run_config.get("defense") or "none") if isinstance(run_config, dict) else "none"


def check_single_run(path: Path, rounds: pd.DataFrame, attacks: pd.DataFrame) -> None:
    """Raise MixedRunsError when the rows of `path` come from more than one run: a run_id/run_name
    column with two values, a round twice in rounds.csv, or an attack (ATTACK_KEY) twice in attacks.csv."""
    for name, table in (("rounds.csv", rounds), ("attacks.csv", attacks)):
        for column in RUN_ID_COLUMNS:
            if column in table.columns and table[column].nunique() > 1:
                raise MixedRunsError(
                    f"{path / name} mixes rows of several runs ({column}: "
                    f"{', '.join(sorted(map(str, table[column].dropna().unique())))})"
                )
    twice = rounds.loc[rounds["round"].duplicated(), "round"]
    if not twice.empty:
        raise MixedRunsError(
            f"{path / 'rounds.csv'} mixes rows of several runs (round {int(twice.iloc[0])} appears more than once)"
        )
    repeated = attacks[attacks.duplicated(ATTACK_KEY, keep=False)]
    if not repeated.empty:
        first = repeated.iloc[0]
        raise MixedRunsError(
            f"{path / 'attacks.csv'} mixes rows of several runs ({len(repeated)} rows repeat an "
            f"attack, e.g. round {first['round']}, partition {first['partition_id']:g}, "
            f"{first['method']}, labels {first['labels']})"
        )


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        warnings.warn(
            f"{path}: unreadable config.json ({error}); using an empty config", MalformedLineWarning, stacklevel=3
        )
        return {}
    return config if isinstance(config, dict) else {}


def _empty_frame(columns: list[str], numeric: list[str]) -> pd.DataFrame:
    def dtype(name):
        return "int64" if name == "round" else "float64" if name in numeric else "object"

    return pd.DataFrame({name: pd.Series(dtype=dtype(name)) for name in columns})


def read_table(
    path: Path,
    columns: list[str],
    numeric: list[str],
    required: tuple[str, ...] = (),
    statuses: tuple[str, ...] | None = None,
    former: dict | None = None,
) -> pd.DataFrame:
    """Read one appended-to CSV of a run folder into a DataFrame.

    Returns at least `columns` (missing ones filled with NaN), `numeric` columns as float64,
    "round" as int64. A line is skipped with a MalformedLineWarning when its field count differs
    from the header, a numeric field does not parse, a `required` field is empty, or (with
    `statuses`) its status is not one of them. The
    last line, when it has no line end (a write cut short), must also pass `_looks_complete`.
    A missing or empty file gives an empty table. former: {former name: today's} (FORMER_NAMES), an
    older record's columns read under today's names (fl_attack.records.current_names).
    """
    if not path.is_file():
        return _empty_frame(columns, numeric)
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return _empty_frame(columns, numeric)
    if "\n" not in text and "\r" not in text:
        warnings.warn(
            f"{path}: only a partial header line; treating the file as empty", MalformedLineWarning, stacklevel=3
        )
        return _empty_frame(columns, numeric)

    unterminated = not text.endswith(("\n", "\r"))
    rows = list(csv.reader(io.StringIO(text)))
    header = current_names([name.strip() for name in rows[0]], former or {}, columns)
    body = rows[1:]
    numeric_here = [i for i, name in enumerate(header) if name in numeric]
    status_at = header.index("status") if statuses is not None and "status" in header else None
    image_at = header.index("image") if "image" in header else None
    required_at = [header.index(name) for name in required if name in header]

    kept = []
    for number, row in enumerate(body, start=2):
        if not row or all(not value.strip() for value in row):
            continue
        is_last = number == len(body) + 1
        problem = _row_problem(row, header, numeric_here, required_at, status_at, statuses)
        if problem is None and is_last and unterminated:
            problem = _looks_complete(row, image_at)
        if problem is not None:
            warnings.warn(f"{path}: skipped row {number} ({problem})", MalformedLineWarning, stacklevel=3)
            continue
        kept.append(row)

    frame = (
        pd.DataFrame(kept, columns=header, dtype="object")
        if kept
        else pd.DataFrame({name: pd.Series(dtype="object") for name in header})
    )
    for name in columns:
        if name not in frame.columns:
            frame[name] = float("nan") if name in numeric else None
    for name in frame.columns:
        if name in numeric:
            frame[name] = pd.to_numeric(frame[name].replace("", None), errors="coerce").astype("float64")
        else:
            frame[name] = frame[name].where(frame[name].notna() & (frame[name] != ""), None).astype("object")
    if "round" in frame.columns and frame["round"].notna().all():
        frame["round"] = frame["round"].astype("int64")
    if status_at is not None:
        frame["status"] = frame["status"].map(lambda value: value.strip().lower() if isinstance(value, str) else value)
    ordered = columns + [name for name in frame.columns if name not in columns]
    return frame[ordered]


def _row_problem(
    row: list[str],
    header: list[str],
    numeric_at: list[int],
    required_at: list[int],
    status_at: int | None,
    statuses: tuple[str, ...] | None,
) -> str | None:
    if len(row) != len(header):
        return f"{len(row)} fields, header has {len(header)}"
    for i in required_at:
        if not row[i].strip():
            return f"{header[i]} is empty"
    for i in numeric_at:
        value = row[i].strip()
        if value and not _parses_as_number(value):
            return f"{header[i]}={value!r} is not a number"
    if status_at is not None and row[status_at].strip().lower() not in statuses:
        return f"status={row[status_at]!r} is not one of {', '.join(statuses)}"
    return None


def _looks_complete(row: list[str], image_at: int | None) -> str | None:
    # An unterminated last line can still have the right field count when the cut fell inside
    # the last field; the image path is the last field and always ends in .png when present.
    if image_at is not None and row[image_at].strip() and not row[image_at].strip().lower().endswith(".png"):
        return "last line cut off (no line end, image path incomplete)"
    return None


def _parses_as_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
