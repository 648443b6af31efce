"""A run folder: every file of a federation's or a replay's record, and the typed row schema.

Each file, and what it holds, is in ``FOLDER_FILES``; docs/run-folder.md is generated from it and from the
row schemas (python -m analysis.docs run-folder).

The writers (strategies/, fl_attack.audit.replay) and the reader (analysis/load.py) share ``ROUNDS`` and
``ATTACKS``: each column with its type (int, float or str). New columns go at the end, except in
ATTACKS where "image" stays last: the reader spots a cut-off last line by its image path. Every
write is crash-safe (fl_attack.records). No torch at import.
"""

from __future__ import annotations

import json
import logging
import math
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

log = logging.getLogger(__name__)

# Column -> type. node_id and client_id are text: Flower node ids are 64-bit and would lose digits as floats.
# Each column's meaning is in ROUND_DESCRIPTIONS / ATTACK_DESCRIPTIONS below (docs/run-folder.md is made from them).
ROUNDS: dict[str, type] = {
    "round": int,
    "clients": int,
    "train_loss": float,
    "eval_loss": float,
    "eval_accuracy": float,
    "attacks_in_flight": int,
    "seconds": float,
    "global_loss": float,
    "global_accuracy": float,
    "attack_lag_rounds": int,
    "attacks_dispatched": int,
    "attacks_skipped": int,
    "excluded": str,
    "participants": str,
    "epsilon": float,
    "epsilon_tracked": str,
}
ATTACKS: dict[str, type] = {
    "round": int,
    "node_id": str,
    "partition_id": int,
    "client_id": str,
    "method": str,
    "dataset": str,
    "defense": str,
    "local_steps": int,
    "nodes": float,
    "iterations": int,
    "labels": str,
    "psnr": float,
    "ssim": float,
    "fsim": float,
    "lpips": float,
    "lsim_honest": float,
    "lsim_calibrated": float,
    "label_accuracy": float,
    "attack_seconds": float,
    "status": str,
    "error": str,
    "label_estimator": str,
    "lag_rounds": int,
    "worker_node": str,
    "worker_id": str,
    "device": str,
    "precision": str,
    "compile": str,
    "batch": int,
    "threads": int,
    "memory": str,
    "epsilon": float,
    "parameters": int,
    "unknowns": int,
    "optimizer": str,
    # The verdict (fl_attack.audit.verdict, docs/verdict.md); empty for a failed attack or an older run.
    "k": int,
    "recovered": int,
    "recovered_low": int,
    "recovered_high": int,
    "guess_recovered": int,
    "reidentified": float,
    "reid_chance": float,
    "reid_noise": float,
    "reid_chance_matched": float,
    "reid_chance_labels": float,
    "reid_chance_uniform": float,
    "guess_reidentified": float,
    "recognized": float,
    "recognized_low": float,
    "recognized_high": float,
    "recognized_truth": float,
    "recognized_guess": float,
    "guess_psnr": float,
    "guess_ssim": float,
    "guess_lpips": float,
    "psnr_margin": float,
    "guesses": str,
    "image": str,
}
# What each column holds: the same keys as the schemas (tests/test_docs.py holds them equal).
ROUND_DESCRIPTIONS: dict[str, str] = {
    "round": "the server round, 1..num-server-rounds",
    "clients": "the updates the round's aggregate was made from",
    "train_loss": "the clients' mean training loss (empty when they report none)",
    "eval_loss": "the clients' federated evaluation of the round's global model: loss",
    "eval_accuracy": "... accuracy",
    "attacks_in_flight": "attacks dispatched and not yet finished at the round's end",
    "seconds": "the round's wall time, from configure to its row",
    "global_loss": "the server's evaluation of the global model on its held-out set (server-test-samples): loss",
    "global_accuracy": "... accuracy",
    "attack_lag_rounds": "how many rounds the attacker is behind the federation at the round's end",
    "attacks_dispatched": "attacks (client x method) the round sent to the attacker",
    "attacks_skipped": "attacks the round left out (attack-budget, attack-max-backlog; events.log says why)",
    "excluded": '"1,3": the partitions left out of the round (a non-finite update)',
    "participants": '"0,1,2": the partitions whose updates the round received',
    "epsilon": "DP budget spent by the round (fl_attack.privacy): the most any client spent; empty without DP",
    "epsilon_tracked": '"0:1.2;1:0.9": each tracked client\'s (attack-clients ids) under local-dp',
}
ATTACK_DESCRIPTIONS: dict[str, str] = {
    "round": "the round whose update was attacked",
    "node_id": "the client's Flower node id (64-bit, kept as text)",
    "partition_id": "the client's data partition (empty for an aggregate under secagg)",
    "client_id": "the client's name in the data (a FEMNIST writer), or the aggregate's",
    "method": 'the attack (pisme, nlsme, sme, ig, ...; "METHOD+memory" for a remembering server\'s row)',
    "dataset": "femnist or cifar100",
    "defense": 'the defense\'s label, e.g. "topk(0.1)+local-dp(C=0.05,eps=10)"; "none"',
    "local_steps": "the client's local steps (epochs x batches): the update's steps the attack models",
    "nodes": "gradient evaluations per iteration (Attack.nodes_per_iteration): m for PI-SME",
    "iterations": "the attack's iterations",
    "labels": "where the attack's labels came from: recovered (from the update) or oracle",
    "psnr": "PSNR (dB) of the matched reconstruction against the originals",
    "ssim": "SSIM, matched",
    "fsim": "FSIM, matched",
    "lpips": "LPIPS, matched (lower is closer)",
    "lsim_honest": "the attack's final gradient-matching loss Lsim, as the server can compute it",
    "lsim_calibrated": "... with the attack's calibrated scale",
    "label_accuracy": "the fraction of the client's labels the attack got right",
    "attack_seconds": "the attack's wall time",
    "status": "ok or failed",
    "error": "why a failed attack failed (an exception, a time-out, a NaN update)",
    "label_estimator": "the AttackConfig's, recorded even with oracle labels (where it is unused)",
    "lag_rounds": "how many rounds after its own the attack finished (the federation's attacker lag)",
    "worker_node": "where the attack ran (fl_attack.attacker.workers.where_am_i)",
    "worker_id": "the worker that ran it",
    "device": "the torch device it ran on (cpu, cuda); empty where unknown",
    "precision": 'the attack\'s arithmetic as it ran (fp32, bf16, tf32: "auto" resolved); empty in older runs',
    "compile": 'how its steps ran: compiled, eager, "eager (<why>)" (attacker/attacks/compiled.py); empty: older',
    "batch": "the attacks run as one reconstruct_batch with it (1: alone; attack-batch); empty in older runs",
    "threads": "the attack's torch threads: what reproduces its numbers exactly",
    "memory": 'a "+memory" row\'s attack memory (labels, keep, joint; fl_attack.attacker.memory), else empty',
    "epsilon": "the DP budget the attacked client(s) had spent by the update's round; empty without DP",
    "parameters": "the update's floating-point entries: the equations the attack has",
    "unknowns": "the client's pixels k*C*H*W: what it must recover",
    "optimizer": 'the client\'s optimizer, e.g. "momentum 0.9, weight decay 0.0005"',
    "k": "the client's images (the attacked samples)",
    "recovered": "of the k: singled out and read by the reader as their original is",
    "recovered_low": "its exact 95% interval over the k images (Clopper-Pearson), low end",
    "recovered_high": "... high end",
    "guess_recovered": "the same count for the best guess without the update (the floor)",
    "reidentified": "the fraction singled out: own original nearest among k + D candidates",
    "reid_chance": "update-free outputs' rate under the same matching (the largest of the four below)",
    "reid_noise": "the attacks' N(0, I) starts, matched and ranked like the attack",
    "reid_chance_matched": "k / (k + D): an output exchangeable with the candidates",
    "reid_chance_labels": "a random candidate of each recovered label's class",
    "reid_chance_uniform": "1 / (k + D): a random ranking's, before the matching (not the chance)",
    "guess_reidentified": "the best guess's fraction singled out (the floor)",
    "recognized": "the fraction the reader classifies as their original's true class",
    "recognized_low": "its exact 95% interval, low end",
    "recognized_high": "... high end",
    "recognized_truth": "the reader's accuracy on the originals (the ceiling)",
    "recognized_guess": "... on the best guess (the floor)",
    "guess_psnr": "the best update-free guess's matched PSNR (dB): the floor",
    "guess_ssim": "... its SSIM",
    "guess_lpips": "... its LPIPS",
    "psnr_margin": "psnr - guess_psnr (dB): above the floor when positive",
    "guesses": "JSON: each guess's reidentified, recognized, recovered, psnr, ssim, lpips",
    "image": "the grid's path relative to the run folder (stays the last column)",
}
ROUND_COLUMNS, ATTACK_COLUMNS = list(ROUNDS), list(ATTACKS)
# Every file of a run folder -> what it holds (RunFolder's paths; docs/run-folder.md is made from it).
FOLDER_FILES: dict[str, str] = {
    "config.json": "the full run config, the AttackConfig, the defense, versions and seed (and each resume); "
    "`privacy`: the DP accountant and its parameters; `verdict`: how the verdict was scored (``write_config``)",
    "events.log": "one timestamped line per event: each round's start and end, what was attacked or skipped and "
    "why, the backlog and lag, excluded updates, resumes (``event``)",
    "rounds.csv": "one row per finished round (``ROUNDS``, columns below)",
    "attacks.csv": "one row per attack, the leakage record and the verdict (``ATTACKS``, columns below; "
    "fl_attack.audit.evaluator.attack_row)",
    "images/round-R/METHOD/client-P.png": "every original over its matched reconstruction, in bands of 16 pairs",
    "images/round-R/METHOD/client-P-evidence.png": "a few singled-out images: the reconstruction, its own original "
    "and the nearest other candidate, with their 1 - SSIM (``evidence_path``; docs/verdict.md)",
    "updates/index.csv": "one line per recorded update, with record-updates=true: whose it is and the SHA-256 of "
    "its files (columns below; fl_attack.federation.update)",
    "updates/round-R/w0.pt": "round R's global weights w0, written once per round and shared by its updates",
    "updates/round-R/NAME.pt": "an attacked update's wT, its public training metadata and its target: what the "
    "attacker observed, never data (`fl-attack replay` attacks it again)",
    "checkpoint.pt": "the last finished round's global model, written atomically after its rounds.csv row, for "
    "resume (``save_checkpoint``)",
    "memory.pt": "the server's attack memory of its tracked clients, with attack-memory on (fl_attack.attacker.memory)",
    "summary.json": "written at the end: attack counts, wall time, the final drain's seconds, `timings` (where the "
    "time went), `verdict` (each attack's verdict and the lines the launcher prints) and `writes_refused` (rounds "
    "whose row, checkpoint or update the disk refused) (``write_summary``)",
    "replays/NAME/": "the record of a `fl-attack replay` of this run, a run folder of its own",
    "report/": "`python -m analysis.report RUN --out RUN/report` (make demo): report.html and its tables",
}
RUN_FILES = ("config.json", "rounds.csv", "attacks.csv", "events.log")  # any of them: the folder holds a run


def numeric(schema: dict[str, type]) -> list[str]:
    """The columns of ``schema`` read as numbers."""
    return [c for c, kind in schema.items() if kind is not str]


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


def percent(x: float) -> str:
    """A fraction in [0,1] as a reader's percentage: "28%", "0.049%" below 1%, "n/a" when not a number."""
    if not math.isfinite(x):
        return "n/a"
    return f"{100 * x:.0f}%" if x >= 0.01 or x == 0 else f"{100 * x:.2g}%"


def whose(row) -> str:
    """An attack row's target in words (a dict or a pandas row): "partition P", or for an aggregate
    (SecAgg+; its partition_id empty or NaN) its client_id."""
    pid = row.get("partition_id")
    if pid is None or pid == "" or (isinstance(pid, float) and math.isnan(pid)):
        return str(row.get("client_id") or "the aggregate")
    return f"partition {int(pid)}"


def evidence_path(image: str | Path) -> Path:
    """The evidence picture beside a row's grid (its ``image``, relative to the run folder):
    images/round-R/METHOD/NAME.png -> images/round-R/METHOD/NAME-evidence.png (fl_attack.audit.images
    .save_evidence; drawn by the evaluator when the verdict singles some image out)."""
    image = Path(image)
    return image.with_name(f"{image.stem}-evidence.png")


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
        version's columns, so a run recorded before a column was added gets it, empty; the
        temporary files of atomic writes the killed process left are removed. ValueError before any
        change when a file has columns this version does not write."""
        from fl_attack.federation.update import UPDATE_INDEX, UPDATE_INDEX_COLUMNS

        schema = {
            self.rounds_file: ROUND_COLUMNS,
            self.attacks_file: ATTACK_COLUMNS,
            self.updates / UPDATE_INDEX: UPDATE_INDEX_COLUMNS,
        }
        found = {path: read_csv(path) for path in schema if path.exists()}
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
    """With ``settings`` (fl_attack.run_config.RunSettings) at resume="RUN_DIR": (the run folder,
    its config.json, its last completed round R, R's global model), after checking what a resume
    needs, before anything starts: a readable config.json and checkpoint.pt, ``run_config`` (the
    whole run config of the resume) equal to the interrupted run's but for RESUMABLE_KEYS, rounds
    left to run, and with attack-memory on, a readable memory.pt (the server's memory cannot be
    rebuilt from the record). ValueError (one line) naming what does not fit; None when resume is
    off. Nothing is changed on disk."""
    if not settings.resume:
        return None
    from fl_attack.attacker.memory import AttackMemory
    from fl_attack.paths import resolve_in_project
    from fl_attack.run_config import ADDED_KEYS, RESUMABLE_KEYS

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
