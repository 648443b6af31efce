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

from fl_attack.data import client_partition, get_spec, load_pool
from fl_attack.images import save_comparison_grid
from fl_attack.metrics import evaluate_reconstruction, get_lpips, label_count_accuracy
from fl_attack.records import ATTACK_COLUMNS, append_csv_row
from fl_attack.update import AttackTarget
from .settings import RunSettings

from .attacker import AttackOutcome
from .timings import Timings

_METRICS = ("psnr", "ssim", "fsim", "lpips", "label_accuracy")


class Evaluator:
    """Scores attack outcomes against the private ground truth and writes them to ``run_dir``."""

    def __init__(self, settings: RunSettings, run_dir: str | Path):
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.spec = get_spec(settings.dataset)
        self.attack_config = settings.attack_config()
        self._lpips = None
        self.timings = Timings()  # scoring, images, writing (attacks.csv rows)

    def private_train_set(self, partition_id: int):
        """The client's private training samples (images in [0,1] NCHW, labels)."""
        s = self.settings
        pool = load_pool(s.dataset, s.data_dir or None)
        return client_partition(pool, partition_id, s.samples, s.classes, seed=s.seed, held_out=s.held_out).train

    def oracle_labels(self, partition_id: int):
        """True labels, for runs that ask for attack-labels = "oracle" (an explicit leak, recorded)."""
        return self.private_train_set(partition_id).labels

    def truth(self, target: AttackTarget) -> tuple[torch.Tensor, torch.Tensor]:
        """The private images and labels an attack is scored against: one client's, or for an
        aggregate the union of the participants', concatenated in partition order."""
        sets = [self.private_train_set(p) for p in target.partition_ids]
        return torch.cat([s.images for s in sets]), torch.cat([s.labels for s in sets])

    def record(self, outcome: AttackOutcome, lag_rounds: int | None = None) -> dict:
        """Score one outcome (if it succeeded) and append its row; returns the row.

        ``lag_rounds``: how many rounds after its own the attack finished (the attacker's lag)."""
        target, config = outcome.target, self.attack_config
        row = {"round": target.round, "node_id": target.node_id, "partition_id": target.partition_id,
               "client_id": target.client_id, "method": outcome.method, "dataset": self.settings.dataset,
               "defense": self.settings.defense.label, "local_steps": outcome.local_steps,
               "nodes": config.nodes, "iterations": config.iterations, "lag_rounds": lag_rounds,
               "label_estimator": getattr(config, "label_estimator", "paper"),
               "labels": outcome.label_source or self.settings.attack_labels,
               "lsim_honest": outcome.lsim_honest, "lsim_calibrated": outcome.lsim_calibrated,
               "attack_seconds": round(outcome.seconds, 3) if not math.isnan(outcome.seconds) else float("nan"),
               "status": outcome.status, "error": outcome.error, "image": "",
               **{m: float("nan") for m in _METRICS}}
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
            if self._lpips is None:
                self._lpips = get_lpips("cpu")
            scores = evaluate_reconstruction(outcome.images, images, lpips=self._lpips)
            label_acc = label_count_accuracy(outcome.labels, labels, self.spec.num_classes)
        rel = Path("images") / f"round-{target.round}" / outcome.method / f"{target.name}.png"
        with self.timings.measure("images"):
            save_comparison_grid(images, scores["matched_recon"], self.run_dir / rel)
        return {"psnr": scores["psnr"], "ssim": scores["ssim"], "fsim": scores["fsim"], "lpips": scores["lpips"],
                "label_accuracy": label_acc, "image": rel.as_posix()}
