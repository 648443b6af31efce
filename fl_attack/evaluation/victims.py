"""Victims and their ground truth: the only code besides clients/ that touches private data.

* ``Victim`` / ``train_victim``: one real client trained for E local epochs; it keeps its private
  images and labels (the ground truth) beside the ``ObservedUpdate`` the attacker is given.
* ``DataSettings`` (fl_attack.federation.data's) / ``private_samples`` / ``ground_truth``: a federation client's
  private samples by partition id, partitioned exactly as the ClientApp does
  (fl_attack.federation.data.load_client_split: the paper's client_partition or a Flower Datasets partitioner).

Nothing on the attacker's side (``api``, ``workers``, ``attacks``, ``labels``) imports this module
(the layers contract, pyproject.toml): the attacker sees ``Victim.update`` alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from fl_attack.attacker.api import resolve_device
from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.labels import check_label_mode
from fl_attack.attacker.runtime.workers import AttackJob
from fl_attack.federation.data import ClientData, DataSettings, client_partition, get_spec, load_client_split, load_pool
from fl_attack.federation.models import build_model, resolve_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import AttackTarget, ObservedUpdate

__all__ = ["Victim", "train_victim", "DataSettings", "private_samples", "ground_truth"]


@dataclass
class Victim:
    """One trained victim client.

    images (k,C,H,W) in [0,1] and labels (k,) int64 are the ground truth (the evaluator's only);
    the attacker is given ``update`` (w0, wT, public metadata) alone. seed: of w0 and the batch
    shuffling. states / batches: w0..wT and each step's batch indices, only when recorded (path
    consistency). seconds: wall time of the local training. model: the architecture's spec
    (``fl_attack.federation.models.resolve_model``; "" = the paper's CNN), public like the metadata.
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

    @property
    def truth(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels): what an attack on this victim is scored against."""
        return self.images, self.labels

    def attack_job(self, method: str, config: AttackConfig, labels: str = "recovered", job_id: int = 0) -> AttackJob:
        """The attacker's job on this victim: its update and public metadata only. labels:
        "recovered" (from the update) or "oracle" (the true labels handed to the attack, an explicit
        leak that isolates the image recovery). ValueError for another labels mode (``check_label_mode``)."""
        given = self.labels.clone() if check_label_mode(labels) == "oracle" else "recovered"
        target = AttackTarget(1, (self.partition,), client_id=self.client_id)
        return AttackJob(job_id, self.update, method, config, target, labels=given, model=self.model)


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
    optimizer=None,
    train_mode: bool = False,
) -> Victim:
    """Train client ``partition`` (k = ``samples`` real samples) for E local epochs of plain SGD
    (or ``optimizer``, a fl_attack.federation.config.ClientOptimizer) from w0 = build_model(dataset, seed, width),
    or with ``model`` (a spec, fl_attack.federation.models.resolve_model) from w0 = resolve_model(model, dataset, seed);
    in eval mode, or in train mode with ``train_mode`` (fl_attack.federation.training.train_local).

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
        optimizer=optimizer,
        train_mode=train_mode,
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


def private_samples(data: DataSettings, partition_id: int) -> ClientData:
    """Client ``partition_id``'s private training samples (images (k,C,H,W) in [0,1], labels (k,);
    k = the partition's size with a Flower partitioner and samples-per-client = 0), cut exactly as
    the ClientApp cuts them (``fl_attack.federation.data.load_client_split``). ``data``
    (fl_attack.federation.data.DataSettings)
    must carry the federation's num_partitions for a Flower partitioner. Raises ValueError /
    FileNotFoundError for bad data settings."""
    return load_client_split(data, partition_id).train


def ground_truth(data: DataSettings, partition_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (N,C,H,W) in [0,1], labels (N,)) an attack on ``partition_ids`` is scored against:
    one client's samples, or for an aggregate the participants' concatenated in the given order."""
    sets = [private_samples(data, p) for p in partition_ids]
    return torch.cat([s.images for s in sets]), torch.cat([s.labels for s in sets])
