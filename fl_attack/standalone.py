"""Standalone attack experiments, without Flower: train real victims, attack them, score, write.

The three roles of the threat model (PISME.md) stay apart here as in the federation:

* victim: ``train_victim`` runs one client's local epochs (``fl_attack.training.train_local``) on its
  real private samples and keeps them, as the ground truth, in a ``Victim``;
* attacker: ``fl_attack.reconstruct`` receives only ``Victim.update``, an ``ObservedUpdate``
  (w0, wT, public metadata), never the images or labels (oracle labels only when asked for);
* evaluator: ``attack_victim`` scores the returned images against the truth after the attack, and
  its trace callback reports PSNR during the attack without passing anything back to it.

``run_attack_experiment`` is the engine of ``fl-attack attack`` (fl_attack.cli) and of
benchmarks/attack_quality.py. It writes, under the output folder:

* ``results.csv``: one row per (client, method), columns ``RESULT_COLUMNS``, rewritten atomically
  (temporary file + os.replace) after every attack, so a crash loses nothing already computed;
* ``trace-<client>-<method>.csv``: the attack's trace (iteration, loss, lsim_honest,
  lsim_calibrated, tv, the attack's own variables, and the evaluator's psnr);
* ``client-<client>-<method>.png``: originals in the top row, matched reconstructions below
  (rows of up to 10 images);
* ``settings.json``: the settings of the run.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import numpy as np
import torch

from .api import Reconstruction, reconstruct, resolve_device
from .attacks import AttackConfig, get_attack
from .data import Pool, client_partition, get_spec, load_pool, num_partitions
from .images import save_comparison_grid
from .metrics import evaluate_reconstruction, get_lpips, match_pairs, psnr
from .models import build_model
from .records import csv_text, write_text_atomic
from .training import train_local
from .update import ObservedUpdate, TrainingMetadata

__all__ = ["RESULT_COLUMNS", "AttackSettings", "Victim", "AttackOutcome", "validate_settings", "train_victim",
           "attack_victim", "failed_row", "ResultsTable", "write_trace", "run_attack_experiment"]

RESULT_COLUMNS = ("dataset", "client", "method", "local_steps", "nodes", "iterations", "labels", "psnr", "ssim",
                  "fsim", "lpips", "lsim_honest", "lsim_calibrated", "label_accuracy", "seconds")
LABEL_MODES = ("recovered", "oracle")
GRID_COLUMNS = 10


@dataclass(frozen=True)
class AttackSettings:
    """One standalone experiment. Defaults are the paper's protocol (PISME.md).

    dataset: "femnist" or "cifar100". methods: attack names (fl_attack.attacks.ATTACKS).
    clients: N victims, partition ids 0..N-1 of ``fl_attack.data.client_partition``.
    samples (k), batch_size (B), local_epochs (E), lr (eta): the victims' local training.
    iterations (K), nodes (m), trace_every, seed: the attack (AttackConfig); seed also fixes the
    victims' initial model w0 = build_model(dataset, seed) and their batch shuffling.
    classes: C classes per CIFAR-100 client (None: a uniform draw; not allowed for femnist).
    labels: "recovered" (from the update) or "oracle" (the true labels, given to the attack).
    device: "auto", "cpu" or "cuda". data_dir: None for the bundled real sample.
    overrides: further AttackConfig fields for every method (e.g. {"lr_control_point": 1e-4}).
    """

    dataset: str = "femnist"
    methods: tuple = ("pisme", "nlsme", "sme", "ig")
    clients: int = 1
    samples: int = 50
    batch_size: int = 10
    local_epochs: int = 20
    lr: float = 0.004
    iterations: int = 1000
    nodes: int = 7
    classes: int | None = None
    labels: str = "recovered"
    seed: int = 0
    device: str = "auto"
    data_dir: str | None = None
    trace_every: int = 10
    overrides: dict = field(default_factory=dict)

    def attack_config(self) -> AttackConfig:
        """The AttackConfig shared by every method of the run; ValueError for bad settings."""
        return AttackConfig.from_overrides(None, iterations=self.iterations, nodes=self.nodes,
                                           trace_every=self.trace_every, seed=self.seed, **self.overrides)


@dataclass
class Victim:
    """One trained victim client. ``images``/``labels`` are the ground truth (evaluator only);
    the attacker is given ``update`` alone."""

    partition: int
    client_id: str
    images: torch.Tensor
    labels: torch.Tensor
    update: ObservedUpdate
    train_loss: float
    seconds: float


@dataclass
class AttackOutcome:
    """An attack's results.csv row, its Reconstruction and the evaluator's full report."""

    row: dict
    reconstruction: Reconstruction
    evaluation: dict


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def validate_settings(settings: AttackSettings) -> Pool:
    """Check every setting before any training; returns the data pool.

    Raises ValueError (unknown dataset or method, labels mode, nodes < 1, iterations < 1, B > k,
    classes for femnist, more clients than partitions, clients with fewer than k samples, no CUDA)
    or FileNotFoundError (missing data directory), each with a one-line message.
    """
    spec = get_spec(settings.dataset)
    methods = list(settings.methods)
    if not methods:
        raise ValueError("no attack method given; choose from: " + ", ".join(sorted(_registry())))
    for method in methods:
        get_attack(method)
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods are listed more than once: {','.join(methods)}")
    if settings.labels not in LABEL_MODES:
        raise ValueError(f"labels must be one of {', '.join(LABEL_MODES)}, got {settings.labels!r}")
    _check_int("clients", settings.clients, 1)
    settings.attack_config()  # iterations, nodes, trace_every and overrides
    TrainingMetadata(dataset=spec.name, lr=settings.lr, batch_size=settings.batch_size,
                     local_epochs=settings.local_epochs, num_samples=settings.samples)
    resolve_device(settings.device)
    if settings.data_dir is not None and not Path(settings.data_dir).expanduser().exists():
        raise FileNotFoundError(f"data directory not found: {settings.data_dir}")
    pool = load_pool(spec.name, settings.data_dir)
    available = num_partitions(pool, settings.samples, settings.classes)
    if available == 0:
        try:
            client_partition(pool, 0, settings.samples, classes=settings.classes, seed=settings.seed)
        except ValueError as exc:
            raise ValueError(f"no {spec.name} client has k={settings.samples} samples ({exc})") from None
    if settings.clients > available:
        raise ValueError(f"{settings.clients} clients asked for, but the {spec.name} data has only {available} "
                         f"client(s) with k={settings.samples} samples")
    for partition in range(settings.clients):  # e.g. too few samples in a client's C classes
        client_partition(pool, partition, settings.samples, classes=settings.classes, seed=settings.seed)
    return pool


def _registry():
    from .attacks import ATTACKS
    return ATTACKS


def train_victim(pool: Pool, partition: int, settings: AttackSettings) -> Victim:
    """Train client ``partition`` for E local epochs from w0 = build_model(dataset, seed)."""
    start = time.perf_counter()
    split = client_partition(pool, partition, settings.samples, classes=settings.classes, seed=settings.seed)
    device = resolve_device(settings.device)
    model = build_model(settings.dataset, seed=settings.seed).to(device)
    result = train_local(model, split.train.images, split.train.labels, dataset=settings.dataset, lr=settings.lr,
                         batch_size=settings.batch_size, local_epochs=settings.local_epochs, seed=settings.seed,
                         client={"partition_id": int(partition)})
    return Victim(partition=int(partition), client_id=split.train.client_id, images=split.train.images,
                  labels=split.train.labels, update=result.update, train_loss=result.train_loss,
                  seconds=time.perf_counter() - start)


def _psnr_callback(truth: torch.Tensor) -> Callable[[int, torch.Tensor], dict]:
    """The evaluator's view during the attack: matched-pair mean PSNR of the current images."""

    def callback(iteration: int, images: torch.Tensor) -> dict:
        recon_idx, _ = match_pairs(images, truth)
        return {"psnr": float(psnr(images[torch.as_tensor(recon_idx)], truth).double().mean())}

    return callback


def _nodes_used(method: str, config: AttackConfig) -> int:
    """Gradient evaluations per iteration: m for PI-SME (the largest m for pisme-adaptive), 1 for
    the single-gradient attacks."""
    return config.nodes if method.startswith("pisme") else 1


def attack_victim(victim: Victim, method: str, settings: AttackSettings, *, lpips=None,
                  overrides: dict | None = None, progress: bool = False) -> AttackOutcome:
    """Attack one victim with one method and score it (on Hungarian-matched pairs).

    overrides: AttackConfig fields for this attack only, on top of ``settings.overrides``.
    """
    config = AttackConfig.from_overrides(settings.attack_config(), **(overrides or {}))
    labels = victim.labels.clone() if settings.labels == "oracle" else "recovered"
    rec = reconstruct(victim.update, method, labels=labels, config=config, device=settings.device,
                      callback=_psnr_callback(victim.images), progress=progress)
    spec = get_spec(settings.dataset)
    if lpips is None:
        lpips = get_lpips("cpu")
    evaluation = evaluate_reconstruction(rec.images, victim.images, recon_labels=rec.labels,
                                         true_labels=victim.labels, num_classes=spec.num_classes, lpips=lpips)
    row = _row(victim.update.metadata, victim.partition, method, config, settings.labels)
    row.update(psnr=evaluation["psnr"], ssim=evaluation["ssim"], fsim=evaluation["fsim"], lpips=evaluation["lpips"],
               lsim_honest=rec.lsim_honest, lsim_calibrated=rec.lsim_calibrated,
               label_accuracy=evaluation["label_accuracy"], seconds=rec.seconds)
    return AttackOutcome(row=row, reconstruction=rec, evaluation=evaluation)


def _row(meta: TrainingMetadata | None, partition: int, method: str, config: AttackConfig, labels: str) -> dict:
    row = dict.fromkeys(RESULT_COLUMNS, math.nan)
    row.update(dataset=meta.dataset if meta else None, client=int(partition), method=method,
               local_steps=meta.local_steps if meta else None, nodes=_nodes_used(method, config),
               iterations=config.iterations, labels=labels)
    return row


def failed_row(settings: AttackSettings, partition: int, method: str, seconds: float = math.nan) -> dict:
    """The results.csv row of an attack that raised: identifiers filled in, metrics NaN."""
    config = settings.attack_config()
    meta = TrainingMetadata(dataset=get_spec(settings.dataset).name, lr=settings.lr,
                            batch_size=settings.batch_size, local_epochs=settings.local_epochs,
                            num_samples=settings.samples)
    row = _row(meta, partition, method, config, settings.labels)
    row["seconds"] = seconds
    return row


class ResultsTable:
    """results.csv, rewritten whole and atomically (temporary file + os.replace) on every ``add``.

    A reader never sees a half-written file, and a crash loses no row already added. Starts empty
    (a header only) and replaces an existing file of the same name.
    """

    def __init__(self, path: str | Path, columns=RESULT_COLUMNS):
        self.path, self.columns, self.rows = Path(path), tuple(columns), []
        write_text_atomic(self.path, csv_text(self.rows, self.columns))

    def add(self, row: dict) -> None:
        self.rows.append(dict(row))
        write_text_atomic(self.path, csv_text(self.rows, self.columns))


def write_trace(path: str | Path, trace: list[dict]) -> None:
    """A trace as CSV, columns in first-seen order (iteration first), written atomically."""
    columns: list[str] = []
    for row in trace:
        columns += [k for k in row if k not in columns]
    write_text_atomic(Path(path), csv_text(trace, columns))


def run_attack_experiment(settings: AttackSettings, out: str | Path, *, progress: bool = True,
                          log: TextIO | None = None, pool: Pool | None = None) -> list[dict]:
    """Validate, then train ``settings.clients`` victims and attack each with every method.

    Writes results.csv, trace-*.csv, client-*.png and settings.json under ``out`` (created after
    validation). A failing attack is logged to ``log`` (default stderr) and recorded with NaN
    metrics; the others go on. Returns the results.csv rows.
    Raises ValueError / FileNotFoundError from ``validate_settings`` before writing anything.
    """
    log = sys.stderr if log is None else log
    pool = validate_settings(settings) if pool is None else pool
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {**asdict(settings), "methods": list(settings.methods),
            "device_resolved": str(resolve_device(settings.device)), "torch": torch.__version__}
    write_text_atomic(out / "settings.json", json.dumps(meta, indent=2, default=str) + "\n")
    table = ResultsTable(out / "results.csv")
    lpips = get_lpips("cpu")

    from tqdm.auto import tqdm

    bar = tqdm(total=settings.clients * len(settings.methods), desc="attacks", unit="attack", disable=not progress,
               file=log)
    try:
        for partition in range(settings.clients):
            bar.set_postfix_str(f"client {partition}: training")
            try:
                victim = train_victim(pool, partition, settings)
            except Exception as exc:  # recorded, the other clients go on
                _report(log, f"training client {partition} failed", exc)
                for method in settings.methods:
                    table.add(failed_row(settings, partition, method))
                    bar.update(1)
                continue
            for method in settings.methods:
                bar.set_postfix_str(f"client {partition}: {method}")
                start = time.perf_counter()
                try:
                    outcome = attack_victim(victim, method, settings, lpips=lpips)
                except Exception as exc:
                    _report(log, f"attack '{method}' on client {partition} failed", exc)
                    table.add(failed_row(settings, partition, method, time.perf_counter() - start))
                    bar.update(1)
                    continue
                table.add(outcome.row)
                write_trace(out / f"trace-{partition}-{method}.csv", outcome.reconstruction.trace)
                save_comparison_grid(victim.images, outcome.evaluation["matched_recon"].cpu(),
                                     out / f"client-{partition}-{method}.png", columns=GRID_COLUMNS)
                bar.update(1)
    finally:
        bar.close()
    return table.rows


def _report(log: TextIO, what: str, exc: BaseException) -> None:
    print(f"fl-attack: {what}: {type(exc).__name__}: {exc}", file=log)
    if os.environ.get("FL_ATTACK_DEBUG"):
        traceback.print_exception(exc, file=log)
    log.flush()
