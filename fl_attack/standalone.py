"""Standalone attack experiments, without Flower: train real victims, attack them, score, write.

The three roles of the threat model (docs/PISME.md) stay apart here as in the federation:

* victim: ``train_victim`` runs one client's local epochs (``fl_attack.evaluation.victims.train_victim``)
  on its real private samples and keeps them, as the ground truth, in a ``Victim``;
* attacker: ``fl_attack.reconstruct`` receives only ``Victim.update``, an ``ObservedUpdate``
  (w0, wT, public metadata), never the images or labels (oracle labels only when asked for);
* evaluator: ``attack_victim`` hands the outcome to ``fl_attack.evaluation.evaluator.Evaluator``, which scores
  the returned images against the truth after the attack; its trace callback reports PSNR during the
  attack without passing anything back to it.

``run_attack_experiment`` is the engine of ``fl-attack attack`` (fl_attack.cli) and of
benchmarks/attack_quality.py. It writes, under the output folder:

* ``results.csv``: one row per (client, method), columns ``RESULT_COLUMNS``, rewritten atomically
  (temporary file + os.replace) after every attack, so a crash loses nothing already computed.
  Each row is the federation's attacks.csv row (``fl_attack.evaluation.evaluator.attack_row``, its columns
  those of ``fl_attack.schema.ATTACK_SCHEMA``), its ``RESULT_COLUMNS`` under the same names
  (``results_row``), without the federation's other columns (round, node_id, client_id, defense,
  status, error, image, ...);
* ``trace-<client>-<method>.csv``: the attack's trace (iteration, loss, lsim_honest,
  lsim_calibrated, tv, the attack's own variables, and the evaluator's psnr);
* ``client-<client>-<method>.png``: originals in the top row, matched reconstructions below
  (rows of up to 10 images);
* ``client-<client>-<method>-evidence.png``: a few singled-out images, each beside its own original
  and the nearest other candidate (``fl_attack.evaluation.verdict.Verdict.evidence``); none when no image is;
* ``settings.json``: the settings of the run.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from fl_attack.attacker.api import resolve_device
from fl_attack.attacker.attacks import AttackConfig, check_own_settings, parse_methods
from fl_attack.attacker.labels import check_label_mode
from fl_attack.attacker.precision import resolve_precision
from fl_attack.attacker.runtime.workers import AttackJob, AttackOutcome, run_job
from fl_attack.evaluation.evaluator import RESULT_COLUMNS, Evaluator, psnr_trace, results_row
from fl_attack.evaluation.verdict import Verdict
from fl_attack.evaluation.victims import Victim
from fl_attack.evaluation.victims import train_victim as _train_victim
from fl_attack.federation.config import PRESETS, TrainingProtocol
from fl_attack.federation.data import (
    DataSettings,
    Pool,
    client_partition,
    get_spec,
    load_pool,
    num_partitions,
    run_writers,
)
from fl_attack.federation.models import resolve_model
from fl_attack.federation.update import AttackTarget, TrainingMetadata
from fl_attack.records import CsvTable, csv_text, write_text_atomic

__all__ = [
    "RESULT_COLUMNS",
    "AttackSettings",
    "validate_settings",
    "train_victim",
    "attack_victim",
    "write_trace",
    "run_attack_experiment",
]

DEFAULT_PRESET = PRESETS["paper"]  # AttackSettings' (and so the CLI's) protocol, iterations and nodes
GRID_COLUMNS = 10
_CONFIG_FIELDS = {f.name for f in fields(AttackConfig)}


@dataclass(frozen=True)
class AttackSettings:
    """One standalone experiment. Defaults are the "paper" preset (``fl_attack.federation.config.PRESETS``,
    docs/PISME.md).

    dataset: a registered dataset (fl_attack.federation.data.DATASETS: femnist, cifar100, femnist-digits).
    methods: attack names (fl_attack.attacker.attacks.ATTACKS).
    clients: N victims, partition ids 0..N-1 of ``fl_attack.federation.data.client_partition``.
    samples (k), batch_size (B), local_epochs (E), lr (eta): the victims' local training.
    iterations (K), nodes (m), trace_every, seed: the attack (AttackConfig); seed also fixes the
    victims' initial model w0 = build_model(dataset, seed) and their batch shuffling.
    classes: C classes per CIFAR-100 client (None: a uniform draw; not allowed for femnist).
    labels: "recovered" (from the update) or "oracle" (the true labels, given to the attack).
    device: "auto", "cpu" or "cuda". precision: the attacks' arithmetic, fp32 (default), bf16, tf32
    (CUDA) or auto (``fl_attack.attacker.precision``). data_dir: None for the bundled real sample.
    overrides: further AttackConfig fields for every method (e.g. {"lr_control_point": 1e-4}).
    model: the victims' architecture, "" (the paper's CNN) or "package.module:factory"
    (fl_attack.federation.models.resolve_model); the attacker knows it, as a federation's server does.
    """

    dataset: str = "femnist"
    methods: tuple = ("pisme", "nlsme", "sme", "ig")
    clients: int = 1
    samples: int = DEFAULT_PRESET.protocol.samples
    batch_size: int = DEFAULT_PRESET.protocol.batch_size
    local_epochs: int = DEFAULT_PRESET.protocol.local_epochs
    lr: float = DEFAULT_PRESET.protocol.lr
    iterations: int = DEFAULT_PRESET.iterations
    nodes: int = DEFAULT_PRESET.nodes
    classes: int | None = None
    labels: str = "recovered"
    seed: int = 0
    device: str = "auto"
    data_dir: str | None = None
    trace_every: int = 10
    preset: str = (
        ""  # the fl_attack.federation.config.PRESETS name the sizes came from ("" = none given), for the record
    )
    overrides: dict = field(default_factory=dict)
    model: str = ""
    precision: str = "fp32"

    @property
    def protocol(self) -> TrainingProtocol:
        """The victims' TrainingProtocol (samples, batch_size, local_epochs, lr); ValueError or
        TypeError for bad values."""
        return TrainingProtocol(
            samples=self.samples, batch_size=self.batch_size, local_epochs=self.local_epochs, lr=self.lr
        )

    def attack_config(self) -> AttackConfig:
        """The AttackConfig shared by every method of the run; ValueError for bad settings, and for
        overrides of iterations, nodes, trace_every, seed or precision (settings of their own here)."""
        own = {f.name: f"AttackSettings.{f.name}" for f in fields(AttackSettings) if f.name in _CONFIG_FIELDS}
        try:
            check_own_settings(self.overrides, own)
        except ValueError as exc:
            raise ValueError(f"overrides: {exc}") from None
        return AttackConfig.from_overrides(
            None,
            iterations=self.iterations,
            nodes=self.nodes,
            trace_every=self.trace_every,
            seed=self.seed,
            precision=self.precision,
            **self.overrides,
        )


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def validate_settings(settings: AttackSettings) -> Pool:
    """Check every setting before any training; returns the data pool.

    Raises ValueError (unknown dataset or method, labels mode, nodes < 1, iterations < 1, B > k,
    classes for femnist, more clients than partitions, clients with fewer than k samples, no CUDA,
    a bad precision or tf32 off CUDA, a bad model spec)
    or FileNotFoundError (missing data directory), each with a one-line message.
    """
    spec = get_spec(settings.dataset)
    parse_methods(",".join(settings.methods))
    check_label_mode(settings.labels)
    _check_int("clients", settings.clients, 1)
    settings.attack_config()  # iterations, nodes, trace_every and overrides
    TrainingMetadata(
        dataset=spec.name,
        lr=settings.lr,
        batch_size=settings.batch_size,
        local_epochs=settings.local_epochs,
        num_samples=settings.samples,
    )
    resolve_precision(settings.precision, resolve_device(settings.device))
    resolve_model(settings.model, spec.name)  # a bad spec or a model off the contract, before any data
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
        raise ValueError(
            f"{settings.clients} clients asked for, but the {spec.name} data has only {available} "
            f"client(s) with k={settings.samples} samples"
        )
    for partition in range(settings.clients):  # e.g. too few samples in a client's C classes
        client_partition(pool, partition, settings.samples, classes=settings.classes, seed=settings.seed)
    return pool


def train_victim(pool: Pool, partition: int, settings: AttackSettings) -> Victim:
    """Train client ``partition`` for E local epochs from w0 = build_model(dataset, seed)."""
    return _train_victim(
        settings.dataset,
        partition,
        samples=settings.samples,
        batch_size=settings.batch_size,
        local_epochs=settings.local_epochs,
        lr=settings.lr,
        seed=settings.seed,
        classes=settings.classes,
        pool=pool,
        device=settings.device,
        model=settings.model,
    )


def attack_victim(
    victim: Victim,
    method: str,
    settings: AttackSettings,
    *,
    overrides: dict | None = None,
    evaluator: Evaluator | None = None,
    image: str | None = None,
) -> tuple[dict, AttackOutcome]:
    """Attack one victim in this process and score it (``Evaluator.record``; the evaluator's PSNR
    is in the trace). overrides: AttackConfig fields for this attack only, on top of the settings'.
    image: the grid's file name under the evaluator's folder. Returns (the attacks.csv row, the
    AttackOutcome with its trace); a failed attack is a row with status "failed" and NaN metrics,
    never an exception (an interrupt still propagates)."""
    config = AttackConfig.from_overrides(settings.attack_config(), **(overrides or {}))
    job = victim.attack_job(method, config, settings.labels)
    outcome = run_job(job, settings.device, callback=psnr_trace(victim.images))
    row = (evaluator or Evaluator(victim.dataset)).record(outcome, victim.truth, image=image)
    return row, outcome


def write_trace(path: str | Path, trace: list[dict]) -> None:
    """A trace as CSV, columns in first-seen order (iteration first), written atomically."""
    columns: list[str] = []
    for row in trace:
        columns += [k for k in row if k not in columns]
    write_text_atomic(Path(path), csv_text(trace, columns))


def run_attack_experiment(
    settings: AttackSettings,
    out: str | Path,
    *,
    progress: bool = True,
    log: TextIO | None = None,
    pool: Pool | None = None,
) -> list[dict]:
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
    meta = {
        **asdict(settings),
        "methods": list(settings.methods),
        "device_resolved": str(resolve_device(settings.device)),
        "precision_resolved": resolve_precision(settings.precision, resolve_device(settings.device)),
        "torch": torch.__version__,
    }
    write_text_atomic(out / "settings.json", json.dumps(meta, indent=2, default=str) + "\n")
    table = CsvTable(out / "results.csv", RESULT_COLUMNS)
    clients = DataSettings(
        settings.dataset,
        settings.samples,
        settings.data_dir,
        settings.classes,
        settings.seed,
        num_partitions=settings.clients,
    )
    verdict = Verdict.from_data(  # FEMNIST: the verdict's pool and distractors without the victims' writers
        settings.dataset, data_dir=settings.data_dir, seed=settings.seed, exclude_writers=run_writers(clients, pool)
    )
    evaluator = Evaluator(settings.dataset, folder=out, grid_columns=GRID_COLUMNS, verdict=verdict)

    from tqdm.auto import tqdm

    bar = tqdm(
        total=settings.clients * len(settings.methods), desc="attacks", unit="attack", disable=not progress, file=log
    )
    try:
        for partition in range(settings.clients):
            bar.set_postfix_str(f"client {partition}: training")
            try:
                victim = train_victim(pool, partition, settings)
            except Exception as exc:  # recorded, the other clients go on
                _report(log, f"training client {partition} failed", exc)
                for method in settings.methods:
                    table.add(results_row(_not_trained(settings, partition, method)))
                    bar.update(1)
                continue
            for method in settings.methods:
                bar.set_postfix_str(f"client {partition}: {method}")
                row, outcome = attack_victim(
                    victim, method, settings, evaluator=evaluator, image=f"client-{partition}-{method}.png"
                )
                table.add(results_row(row))
                if outcome.status == "ok":
                    write_trace(out / f"trace-{partition}-{method}.csv", outcome.trace)
                else:
                    print(f"fl-attack: attack '{method}' on client {partition} failed: {outcome.error}", file=log)
                bar.update(1)
    finally:
        bar.close()
    return table.rows


def _not_trained(settings: AttackSettings, partition: int, method: str) -> dict:
    """The row of an attack whose victim could not be trained: identifiers filled in, metrics NaN."""
    meta = TrainingMetadata(
        dataset=get_spec(settings.dataset).name,
        lr=settings.lr,
        batch_size=settings.batch_size,
        local_epochs=settings.local_epochs,
        num_samples=settings.samples,
    )
    job = AttackJob(0, None, method, settings.attack_config(), AttackTarget(1, (partition,)), settings.labels)
    outcome = AttackOutcome.failed(job, "training failed")
    outcome.local_steps = meta.local_steps
    return Evaluator(settings.dataset).record(outcome, None)


def _report(log: TextIO, what: str, exc: BaseException) -> None:
    print(f"fl-attack: {what}: {type(exc).__name__}: {exc}", file=log)
    if os.environ.get("FL_ATTACK_DEBUG"):
        traceback.print_exception(exc, file=log)
    log.flush()
