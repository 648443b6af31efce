"""The evaluator's side of every pipeline: victims, the ground truth, scores, image grids and THE row.

One module serves the three places that train or observe a victim, attack it, score it and write a
row: ``fl-attack attack`` (fl_attack.standalone), the paper experiments (analysis.experiments) and
the federation's evaluator (strategies.evaluator), and ``fl-attack replay`` (fl_attack.replay).

* ``Victim`` / ``train_victim``: one real client trained for E local epochs; it keeps its private
  images and labels (the ground truth) beside the ``ObservedUpdate`` the attacker is given.
* ``DataSettings`` / ``private_samples`` / ``ground_truth``: a federation client's private samples
  by partition id, partitioned exactly as the ClientApp does (fl_attack.data.client_partition).
* ``score``: PSNR after Hungarian matching, SSIM, FSIM, LPIPS-alex (one network, loaded once) and
  label-count accuracy; ``save_grid``: originals over their matched reconstructions.
* ``attack_row``: the one row schema, ``fl_attack.records.ATTACK_COLUMNS`` (attacks.csv);
  ``results_row`` renames it for the standalone results.csv and the experiments' CSVs.

The attacker never sees anything here but ``Victim.update``; scoring happens after the attack.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .api import Reconstruction, reconstruct, resolve_device
from .attacks import AttackConfig, get_attack
from .data import ClientData, client_partition, get_spec, load_pool
from .images import save_comparison_grid
from .metrics import evaluate_reconstruction, get_lpips, match_pairs, psnr
from .models import build_model, resolve_model
from .records import ATTACK_COLUMNS
from .training import train_local
from .update import ObservedUpdate

__all__ = [
    "Victim",
    "train_victim",
    "DataSettings",
    "private_samples",
    "ground_truth",
    "score",
    "save_grid",
    "attack_row",
    "RESULT_COLUMNS",
    "results_row",
    "ScoredAttack",
    "attack_victim",
    "psnr_trace",
]

_SCORES = ("psnr", "ssim", "fsim", "lpips", "label_accuracy")
# results.csv (fl-attack attack) and the experiments' CSVs: ATTACK_COLUMNS names but for these two.
RESULT_COLUMNS = (
    "dataset",
    "client",
    "method",
    "local_steps",
    "nodes",
    "iterations",
    "labels",
    "psnr",
    "ssim",
    "fsim",
    "lpips",
    "lsim_honest",
    "lsim_calibrated",
    "label_accuracy",
    "seconds",
)
RESULT_RENAMES = {"partition_id": "client", "attack_seconds": "seconds"}


# ----------------------------------------------------------------------------------- victims


@dataclass
class Victim:
    """One trained victim client.

    images (k,C,H,W) in [0,1] and labels (k,) int64 are the ground truth (the evaluator's only);
    the attacker is given ``update`` (w0, wT, public metadata) alone. seed: of w0 and the batch
    shuffling. states / batches: w0..wT and each step's batch indices, only when recorded (path
    consistency). seconds: wall time of the local training. model: the architecture's spec
    (``fl_attack.models.resolve_model``; "" = the paper's CNN), public like the metadata.
    """

    dataset: str
    partition: int
    seed: int
    client_id: str
    images: torch.Tensor
    labels: torch.Tensor
    update: ObservedUpdate
    train_loss: float
    seconds: float
    classes: int | None = None
    states: list = field(default_factory=list)
    batches: list = field(default_factory=list)
    model: str = ""

    @property
    def local_steps(self) -> int:
        """T = E * ceil(k/B) of the victim's update."""
        return self.update.metadata.local_steps


def train_victim(
    dataset: str,
    partition: int,
    *,
    samples: int,
    batch_size: int,
    local_epochs: int,
    lr: float,
    seed: int = 0,
    data_seed: int | None = None,
    classes: int | None = None,
    data_dir: str | None = None,
    pool=None,
    device: str = "cpu",
    width: int | None = None,
    record_states: bool = False,
    model: str = "",
) -> Victim:
    """Train client ``partition`` (k = ``samples`` real samples) for E local epochs of plain SGD
    from w0 = build_model(dataset, seed, width), or with ``model`` (a spec, fl_attack.models.resolve_model)
    from w0 = resolve_model(model, dataset, seed).

    data_seed: the partition draw (default ``seed``); pool: an already loaded data pool (default
    ``load_pool(dataset, data_dir)``); device: where training runs ("auto", "cpu", "cuda").
    Raises ValueError (B > k, too few samples, unknown dataset, no CUDA, a bad model spec or a
    width with a model spec) before training.
    """
    if model and width is not None:
        raise ValueError("width applies to the paper's CNN only, not to a model spec")
    start = time.perf_counter()
    pool = load_pool(dataset, data_dir) if pool is None else pool
    split = client_partition(pool, partition, samples, classes=classes, seed=seed if data_seed is None else data_seed)
    net = resolve_model(model, dataset, seed=seed) if model else build_model(dataset, seed=seed, width=width)
    net = net.to(resolve_device(device))
    result = train_local(
        net,
        split.train.images,
        split.train.labels,
        dataset=dataset,
        lr=lr,
        batch_size=batch_size,
        local_epochs=local_epochs,
        seed=seed,
        record_states=record_states,
        client={"partition_id": int(partition)},
    )
    return Victim(
        dataset=get_spec(dataset).name,
        partition=int(partition),
        seed=int(seed),
        client_id=split.train.client_id,
        images=split.train.images,
        labels=split.train.labels,
        update=result.update,
        train_loss=result.train_loss,
        seconds=time.perf_counter() - start,
        classes=classes,
        states=result.states,
        batches=result.batches,
        model=model,
    )


# ------------------------------------------------------------------------------ ground truth


@dataclass(frozen=True)
class DataSettings:
    """How a federation's clients got their private data (run config: dataset, data-dir,
    samples-per-client, classes-per-client, seed, server-test-samples).

    data_dir: None for the bundled real sample. classes: C for CIFAR-100, None for unrestricted.
    held_out: samples the server keeps for its own test set (``fl_attack.data.server_test_set``).
    """

    dataset: str
    samples: int
    data_dir: str | None = None
    classes: int | None = None
    seed: int = 0
    held_out: int = 0


def private_samples(data: DataSettings, partition_id: int) -> ClientData:
    """Client ``partition_id``'s private training samples (images (k,C,H,W) in [0,1], labels (k,)),
    partitioned as the ClientApp does. Raises ValueError / FileNotFoundError for bad data settings."""
    pool = load_pool(data.dataset, data.data_dir or None)
    return client_partition(
        pool, partition_id, data.samples, data.classes, seed=data.seed, held_out=data.held_out
    ).train


def ground_truth(data: DataSettings, partition_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (N,C,H,W) in [0,1], labels (N,)) an attack on ``partition_ids`` is scored against:
    one client's samples, or for an aggregate the participants' concatenated in the given order."""
    sets = [private_samples(data, p) for p in partition_ids]
    return torch.cat([s.images for s in sets]), torch.cat([s.labels for s in sets])


# ----------------------------------------------------------------------------------- scoring


def score(images: torch.Tensor, labels, truth_images: torch.Tensor, truth_labels, dataset: str) -> dict:
    """Score a reconstruction against the ground truth, on Hungarian-matched pairs.

    images, truth_images: (N,C,H,W) in [0,1]; labels, truth_labels: (N,) class ids (order irrelevant).
    Returns ``fl_attack.metrics.evaluate_reconstruction``'s dict: psnr (dB), ssim, fsim, lpips (the
    shared CPU LPIPS-alex network, loaded once per process), label_accuracy in [0,1], per_image,
    matching, matched_recon. Raises TypeError / ValueError for malformed inputs.
    """
    return evaluate_reconstruction(
        images,
        truth_images,
        recon_labels=labels,
        true_labels=truth_labels,
        num_classes=get_spec(dataset).num_classes,
        lpips=get_lpips("cpu"),
    )


def psnr_trace(truth: torch.Tensor) -> Callable[[int, torch.Tensor], dict]:
    """A ``reconstruct`` callback: the matched-pair mean PSNR of the current images, for the trace.
    The evaluator's view during the attack; nothing goes back to the attacker."""

    def callback(iteration: int, images: torch.Tensor) -> dict:
        recon_idx, _ = match_pairs(images, truth)
        return {"psnr": float(psnr(images[torch.as_tensor(recon_idx)], truth).double().mean())}

    return callback


def save_grid(truth_images: torch.Tensor, scores: dict, path: str | Path, columns: int = 16) -> Path:
    """PNG of the originals (N,C,H,W in [0,1]) over their matched reconstructions (``score``'s
    matched_recon), in bands of ``columns`` pairs; written atomically."""
    return save_comparison_grid(truth_images, scores["matched_recon"].cpu(), path, columns=columns)


# -------------------------------------------------------------------------------------- rows


def attack_row(
    *,
    method: str,
    dataset: str,
    local_steps: int | None,
    nodes,
    iterations: int,
    labels: str,
    partition_id: int | None,
    round: int | None = None,
    node_id: int | None = None,
    client_id: str = "",
    label_estimator: str,
    defense: str = "none",
    status: str = "ok",
    error: str = "",
    lsim_honest: float = math.nan,
    lsim_calibrated: float = math.nan,
    attack_seconds: float = math.nan,
    scores: dict | None = None,
    image: str = "",
    lag_rounds: int | None = None,
    worker_node: str = "",
    worker_id: str = "",
    device: str = "",
) -> dict:
    """One attack's row, with exactly the columns ``ATTACK_COLUMNS`` (attacks.csv).

    scores: ``score``'s dict (psnr in dB, ssim, fsim, lpips, label_accuracy); None leaves the
    metrics NaN (a failed attack). nodes: ``Attack.nodes_per_iteration``. labels: "recovered" or
    "oracle". label_estimator: the AttackConfig's (recorded even with oracle labels, where it is unused).
    attack_seconds: the attack's wall time. image: the grid's path relative to the run.
    worker_node, worker_id: where the attack ran (``fl_attack.workers.where_am_i``); device: the torch
    device it ran on (cpu, cuda), empty where unknown.
    """
    row = dict.fromkeys(ATTACK_COLUMNS)
    row.update(
        round=round,
        node_id=node_id,
        partition_id=partition_id,
        client_id=client_id,
        method=method,
        dataset=dataset,
        defense=defense,
        local_steps=local_steps,
        nodes=nodes,
        iterations=iterations,
        labels=labels,
        lsim_honest=lsim_honest,
        lsim_calibrated=lsim_calibrated,
        attack_seconds=attack_seconds,
        status=status,
        error=error,
        label_estimator=label_estimator,
        lag_rounds=lag_rounds,
        worker_node=worker_node,
        worker_id=worker_id,
        device=device,
        image=image,
        **{m: float((scores or {}).get(m, math.nan)) for m in _SCORES},
    )
    return row


def results_row(row: dict, columns=RESULT_COLUMNS) -> dict:
    """An ``attack_row`` as a results.csv row (fl-attack attack, the experiments): partition_id is
    named ``client``, attack_seconds ``seconds``; only ``columns`` are kept, in their order."""
    renamed = {RESULT_RENAMES.get(k, k): v for k, v in row.items()}
    return {c: renamed.get(c) for c in columns}


# ------------------------------------------------------------------------ one scored attack


@dataclass
class ScoredAttack:
    """One attack on a victim: its ``attack_row``, the Reconstruction and ``score``'s full dict."""

    row: dict
    reconstruction: Reconstruction
    scores: dict


def attack_victim(
    victim: Victim,
    method: str,
    config: AttackConfig,
    *,
    labels: str = "recovered",
    device: str | torch.device = "auto",
    trace_psnr: bool = False,
    progress: bool = False,
) -> ScoredAttack:
    """Attack ``victim.update`` with ``method`` and ``config``, then score it against the victim's truth.

    labels: "recovered" (from the update) or "oracle" (the victim's true labels, given to the
    attack: an explicit leak, recorded in the row). trace_psnr: add the evaluator's PSNR to the
    trace every ``config.trace_every`` iterations. Raises what ``reconstruct`` raises.
    """
    if labels not in ("recovered", "oracle"):
        raise ValueError(f"labels must be 'recovered' or 'oracle', got {labels!r}")
    given = victim.labels.clone() if labels == "oracle" else "recovered"
    rec = reconstruct(
        victim.update,
        method,
        labels=given,
        config=config,
        device=device,
        model=victim.model,
        callback=psnr_trace(victim.images) if trace_psnr else None,
        progress=progress,
    )
    scores = score(rec.images, rec.labels, victim.images, victim.labels, victim.dataset)
    row = attack_row(
        method=method,
        dataset=victim.dataset,
        label_estimator=config.label_estimator,
        local_steps=victim.local_steps,
        nodes=get_attack(method).nodes_per_iteration(config, rec.trace),
        iterations=config.iterations,
        labels=rec.label_source,
        partition_id=victim.partition,
        client_id=victim.client_id,
        lsim_honest=rec.lsim_honest,
        lsim_calibrated=rec.lsim_calibrated,
        attack_seconds=rec.seconds,
        scores=scores,
    )
    return ScoredAttack(row=row, reconstruction=rec, scores=scores)
