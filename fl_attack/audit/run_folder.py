"""A run folder: every file of a federation's or a replay's record, read and written in one place.

``RunFolder`` holds the paths of the files that the record's schema lists (fl_attack.schema:
``FOLDER_FILES``, and the CSVs' columns ``ROUND_SCHEMA`` / ``ATTACK_SCHEMA``); ``check_resumable``
checks that a run can be resumed. Every write is crash-safe (fl_attack.records). No torch at import.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from importlib import metadata
from pathlib import Path

from fl_attack.records import (
    append_csv_row,
    csv_text,
    read_csv,
    remove_temporaries,
    write_json_atomic,
    write_text_atomic,
)
from fl_attack.schema import ATTACK_COLUMNS, FORMER_NAMES, ROUND_COLUMNS, RUN_FILES

log = logging.getLogger(__name__)


def versions() -> dict:
    """The versions a record was written with: fl_attack, python and the packages behind the numbers."""
    from fl_attack import __version__

    out = {"fl_attack": __version__, "python": platform.python_version()}
    for dist in ("flwr", "torch", "ray", "lpips", "piq"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


class RunFolder:
    """The files of one run folder (module docstring), read and written in one place."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:  # Path(folder), open(folder / ...) and the like
        return str(self.path)

    config_file = property(lambda self: self.path / "config.json")
    events_file = property(lambda self: self.path / "events.log")
    rounds_file = property(lambda self: self.path / "rounds.csv")
    attacks_file = property(lambda self: self.path / "attacks.csv")
    summary_file = property(lambda self: self.path / "summary.json")
    checkpoint_file = property(lambda self: self.path / "checkpoint.pt")
    memory_file = property(
        lambda self: self.path / "memory.pt"
    )  # the server's attack memory (fl_attack.attacker.memory)
    updates = property(lambda self: self.path / "updates")
    replays = property(lambda self: self.path / "replays")

    @property
    def holds_run(self) -> bool:
        return any((self.path / name).exists() for name in RUN_FILES)

    def event(self, text: str) -> None:
        """A timestamped line in events.log (and the log); a failing write is logged, never raised."""
        log.info(text)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with open(self.events_file, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
        except OSError as exc:
            log.warning("could not write %s: %s", self.events_file, exc)

    def write_config(self, config: dict) -> None:
        """config.json, atomically; ``versions`` and ``started`` are added when missing."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            self.config_file, {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": versions(), **config}
        )

    def read_config(self) -> dict:
        """config.json as a dict; ValueError (one line) when it is missing or unreadable."""
        try:
            config = json.loads(self.config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{self.config_file} is unreadable: {exc}") from None
        if not isinstance(config, dict):
            raise ValueError(f"{self.config_file} is not a JSON object")
        return config

    def append_round(self, row: dict) -> None:
        append_csv_row(self.rounds_file, row, ROUND_COLUMNS)

    def append_attack(self, row: dict) -> None:
        append_csv_row(self.attacks_file, row, ATTACK_COLUMNS)

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.summary_file, summary)

    def save_checkpoint(self, done: int, arrays: dict) -> None:
        """checkpoint.pt: round ``done``'s global model (a state dict), atomically."""
        from fl_attack.federation.update import save_torch_atomic

        save_torch_atomic(self.checkpoint_file, {"round": int(done), "arrays": arrays})

    def load_checkpoint(self) -> tuple[int, dict]:
        """(the round, its global model); ValueError (one line) when missing or unreadable."""
        import torch

        try:
            checkpoint = torch.load(self.checkpoint_file, weights_only=True)
            return int(checkpoint["round"]), checkpoint["arrays"]
        except FileNotFoundError:
            raise ValueError(f"{self.checkpoint_file} is missing") from None
        except Exception as exc:  # cut off, or not ours: torch's own advice (weights_only=False) is unsafe
            raise ValueError(
                f"{self.checkpoint_file} is not a checkpoint fl-attack wrote ({type(exc).__name__}: cut off or "
                "another file); start a new run, or restore the file"
            ) from None

    def cut_back(self, done: int) -> None:
        """Cut rounds.csv, attacks.csv and updates/index.csv back to rounds <= ``done``, atomically
        (a resume: the rounds after the checkpoint run again). Each is rewritten with this
        version's columns, so a run recorded before a column was added gets it, empty, and one
        recorded under a column's former name (``FORMER_NAMES``) gets today's; the temporary files
        of atomic writes the killed process left are removed. ValueError before any change when a
        file has columns this version does not write."""
        from fl_attack.federation.update import UPDATE_INDEX, UPDATE_INDEX_COLUMNS

        schema = {
            self.rounds_file: ROUND_COLUMNS,
            self.attacks_file: ATTACK_COLUMNS,
            self.updates / UPDATE_INDEX: UPDATE_INDEX_COLUMNS,
        }
        former = {self.attacks_file: FORMER_NAMES}  # an older run's attacks.csv is rewritten under today's names
        found = {path: read_csv(path, former.get(path), schema[path]) for path in schema if path.exists()}
        for path, (header, _) in found.items():
            unknown = [c for c in header if c not in schema[path]]
            if unknown:
                raise ValueError(
                    f"{path} has columns this version does not write ({unknown}); "
                    "resume it with the version that recorded it"
                )
        for path, (_, rows) in found.items():
            kept = [r for r in rows if r.get("round") and int(r["round"]) <= done]
            write_text_atomic(path, csv_text(kept, schema[path]))
        for path in remove_temporaries(self.path):  # half-written files of the killed process
            self.event(f"resume: removed {path.relative_to(self.path)}, left half-written when the run died")


def check_resumable(settings, run_config: dict) -> tuple | None:
    """With ``settings`` (fl_attack.audit.settings.RunSettings) at resume="RUN_DIR": (the run folder,
    its config.json, its last completed round R, R's global model), after checking what a resume
    needs, before anything starts: a readable config.json and checkpoint.pt, ``run_config`` (the
    whole run config of the resume) equal to the interrupted run's but for RESUMABLE_KEYS, rounds
    left to run, and with attack-memory on, a readable memory.pt (the server's memory cannot be
    rebuilt from the record). ValueError (one line) naming what does not fit; None when resume is
    off. Nothing is changed on disk."""
    if not settings.resume:
        return None
    from fl_attack.attacker.memory import AttackMemory
    from fl_attack.audit.settings import ADDED_KEYS, RESUMABLE_KEYS
    from fl_attack.paths import resolve_in_project

    folder = RunFolder(resolve_in_project(settings.resume))
    refused = f"invalid run config: resume='{settings.resume}' cannot be resumed"
    try:
        recorded = folder.read_config()
        before = recorded["run_config"]
        done, arrays = folder.load_checkpoint()
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{refused}: {exc}") from None
    differing = sorted(
        k
        for k in set(before) | set(run_config)
        if k not in RESUMABLE_KEYS and before.get(k, ADDED_KEYS.get(k)) != run_config.get(k, ADDED_KEYS.get(k))
    )
    if differing:
        raise ValueError(
            f"invalid run config: resume: the run config differs from the interrupted run's in "
            f"{', '.join(differing)}; only {', '.join(sorted(RESUMABLE_KEYS))} may change"
        )
    if done >= settings.num_server_rounds:
        raise ValueError(
            f"invalid run config: resume: {folder.path} has finished all {done} rounds; raise "
            "num-server-rounds to go on"
        )
    if settings.attack_memory != "none":
        try:
            AttackMemory.load(folder.memory_file)
        except ValueError as exc:
            raise ValueError(
                f"{refused}: {exc}; the server's memory (attack-memory='{settings.attack_memory}') cannot be "
                "rebuilt from the record: restore the file, or start a new run"
            ) from None
    return folder, recorded, done, arrays
