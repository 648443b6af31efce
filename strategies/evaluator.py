"""The evaluator: the simulation's ground-truth role, separate from the attacker.

It alone loads a client's private samples (by partition id, with the same partitioning as the
ClientApp), and only after that client's reconstruction has come back. It scores the
reconstruction with the fl_attack metrics, saves the image grid and appends one row to
attacks.csv per (round, client, method).

An attack on a SecAgg+ aggregate (an AttackTarget with ``aggregate``: the participants' ids) is
scored against the union of all participants' images, in partition order: the attack
reconstructs as many images as the participants hold in total, so the Hungarian matching is
one-to-one over the union.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fl_attack.attacks import get_attack
from fl_attack.evaluation import (
    DataSettings,
    attack_row,
    ground_truth,
    private_samples,
    save_grid,
    score,
)
from fl_attack.records import ATTACK_COLUMNS, append_csv_row
from fl_attack.run_config import RunSettings
from fl_attack.update import AttackTarget

from .attacker import AttackOutcome
from .timings import Timings


def data_settings(settings: RunSettings) -> DataSettings:
    """The run's data settings: how its clients' private samples are drawn."""
    return DataSettings(
        dataset=settings.dataset,
        samples=settings.samples,
        data_dir=settings.data_dir or None,
        classes=settings.classes,
        seed=settings.seed,
        held_out=settings.held_out,
    )


class Evaluator:
    """Scores attack outcomes against the private ground truth and writes them to ``run_dir``."""

    def __init__(self, settings: RunSettings, run_dir: str | Path):
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.data = data_settings(settings)
        self.attack_config = settings.attack_config()
        self.timings = Timings()  # scoring, images, writing (attacks.csv rows)

    def private_train_set(self, partition_id: int):
        """The client's private training samples (images in [0,1] NCHW, labels)."""
        return private_samples(self.data, partition_id)

    def oracle_labels(self, partition_id: int):
        """True labels, for runs that ask for attack-labels = "oracle" (an explicit leak, recorded)."""
        return self.private_train_set(partition_id).labels

    def truth(self, target: AttackTarget) -> tuple[torch.Tensor, torch.Tensor]:
        """The private images and labels an attack is scored against: one client's, or for an
        aggregate the union of the participants', concatenated in partition order."""
        return ground_truth(self.data, target.partition_ids)

    def record(self, outcome: AttackOutcome, lag_rounds: int | None = None) -> dict:
        """Score one outcome (if it succeeded) and append its row; returns the row.

        ``lag_rounds``: how many rounds after its own the attack finished (the attacker's lag)."""
        target, config = outcome.target, self.attack_config
        nodes = outcome.nodes if outcome.nodes is not None else get_attack(outcome.method).nodes_per_iteration(config)
        row = attack_row(
            round=target.round,
            node_id=target.node_id,
            partition_id=target.partition_id,
            client_id=target.client_id,
            method=outcome.method,
            dataset=self.settings.dataset,
            defense=self.settings.defense.label,
            local_steps=outcome.local_steps,
            nodes=nodes,
            iterations=config.iterations,
            lag_rounds=lag_rounds,
            label_estimator=config.label_estimator,
            labels=outcome.label_source or self.settings.attack_labels,
            lsim_honest=outcome.lsim_honest,
            lsim_calibrated=outcome.lsim_calibrated,
            attack_seconds=round(outcome.seconds, 3) if not math.isnan(outcome.seconds) else math.nan,
            status=outcome.status,
            error=outcome.error,
            worker_node=outcome.worker_node,
            worker_id=outcome.worker_id,
            device=outcome.device,
        )
        if outcome.status == "ok":
            try:
                row.update(self._score(outcome))
            except Exception as exc:  # a scoring bug must not lose the run either
                row.update(status="failed", error=f"evaluation: {type(exc).__name__}: {exc}")
        with self.timings.measure("writing"):
            append_csv_row(self.run_dir / "attacks.csv", row, ATTACK_COLUMNS)
        return row

    def _score(self, outcome: AttackOutcome) -> dict:
        target = outcome.target
        with self.timings.measure("scoring"):
            images, labels = self.truth(target)
            scores = score(outcome.images, outcome.labels, images, labels, self.settings.dataset)
        rel = Path("images") / f"round-{target.round}" / outcome.method / f"{target.name}.png"
        with self.timings.measure("images"):
            save_grid(images, scores, self.run_dir / rel)
        return {**{m: scores[m] for m in ("psnr", "ssim", "fsim", "lpips", "label_accuracy")}, "image": rel.as_posix()}
