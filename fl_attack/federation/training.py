"""Victim training: one client's FedAvg local epochs (docs/PISME.md).

Mean cross-entropy, batches reshuffled every epoch. The model is in eval mode by default (the paper's
protocol: its CNNs have no batch norm or dropout), or in train mode (``train_mode``, run-config key
client-train-mode), as Flower apps train ResNet-style models: batch norm normalises with each batch's
statistics and updates its running statistics and counter, which the update then carries, and
dropout is active. The optimizer is the run's ``ClientOptimizer``: plain SGD by default, or SGD with
momentum / Nesterov, Adam or AdamW, with weight decay, as Flower apps train.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fl_attack.federation.config import PAPER, ClientOptimizer
from fl_attack.federation.pools import get_spec
from fl_attack.federation.update import ObservedUpdate, TrainingMetadata


@dataclass
class LocalResult:
    """Result of ``train_local``.

    update: the ObservedUpdate (w0, wT, metadata) the server sees.
    train_loss: mean cross-entropy over all local steps.
    states: w0, w1, ..., wT as flat-able state dicts when ``record_states`` (for path-consistency
    experiments; never given to the attacker). batches: the index tensor of each step's batch.
    """

    update: ObservedUpdate
    train_loss: float
    states: list = field(default_factory=list)
    batches: list = field(default_factory=list)


def evaluate_model(model, images: torch.Tensor, labels: torch.Tensor, dataset: str, batch: int = 500):
    """(mean cross-entropy, accuracy in [0,1]) of ``model`` (put in eval mode) on ``images`` in
    [0,1] NCHW with ``labels`` (N,), in batches of ``batch``: the server's and the clients' evaluation."""
    spec = get_spec(dataset)
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            logits = model(spec.normalize(images[i : i + batch]))
            loss += F.cross_entropy(logits, labels[i : i + batch], reduction="sum").item()
            correct += int((logits.argmax(1) == labels[i : i + batch]).sum())
    return loss / len(labels), correct / len(labels)


def build_optimizer(params, lr: float, optimizer: ClientOptimizer) -> torch.optim.Optimizer:
    """The torch optimizer of ``optimizer`` (fl_attack.federation.config.ClientOptimizer) at learning rate lr:
    torch.optim.SGD (momentum 0, or heavy ball, or nesterov; weight_decay as L2 in the gradient),
    torch.optim.Adam (L2 weight decay) or torch.optim.AdamW (decoupled weight decay)."""
    o = optimizer
    if o.adaptive:
        cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
        return cls(params, lr=lr, betas=o.adam_betas, weight_decay=o.weight_decay)
    return torch.optim.SGD(
        params, lr=lr, momentum=o.momentum, nesterov=o.name == "nesterov", weight_decay=o.weight_decay
    )


def train_local(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    dataset: str,
    lr: float = PAPER.lr,
    batch_size: int = PAPER.batch_size,
    local_epochs: int = PAPER.local_epochs,
    seed: int = 0,
    record_states: bool = False,
    client: dict | None = None,
    optimizer: ClientOptimizer | None = None,
    train_mode: bool = False,
) -> LocalResult:
    """Run E local epochs of SGD on one client's k samples. Returns a ``LocalResult``: ``.update``
    is the ObservedUpdate (w0, wT, metadata), with the training loss (and the states when asked).

    images: (k,C,H,W) float in [0,1] (normalised here with the dataset's mean/std); labels: (k,)
    int64. The model is trained in place, starting from its current weights (w0). lr, batch_size
    and local_epochs default to the paper's (``fl_attack.federation.config.PAPER``); optimizer (default plain
    SGD) is built by ``build_optimizer`` and recorded in the update's metadata, as is train_mode:
    True trains with ``model.train()`` (batch norm on batch statistics, its running statistics and
    num_batches_tracked updated once per step; dropout active), False (default) in eval mode. The
    model is left in eval mode.
    T = E * ceil(k/B) steps; the last batch of an epoch may be smaller.
    Raises ValueError for B > k or mismatched images/labels, before training starts.
    """
    if images.dim() != 4 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"images must be (k,C,H,W) with one label each, got {tuple(images.shape)} and {tuple(labels.shape)}"
        )
    k = images.shape[0]
    optimizer = ClientOptimizer() if optimizer is None else optimizer
    metadata = TrainingMetadata(
        dataset=dataset,
        lr=lr,
        batch_size=batch_size,
        local_epochs=local_epochs,
        num_samples=k,
        optimizer=optimizer,
        train_mode=bool(train_mode),
    )
    spec = get_spec(dataset)
    device = next(model.parameters()).device
    x = spec.normalize(images.float()).to(device)
    y = labels.long().to(device)
    model.train(bool(train_mode))  # eval: the paper's (its CNNs have no batch norm or dropout)
    w0 = OrderedDict((n, p.detach().cpu().clone()) for n, p in model.state_dict().items())
    step = build_optimizer(model.parameters(), lr, optimizer)
    gen = torch.Generator().manual_seed(int(seed))
    states = [w0] if record_states else []
    batches, losses = [], []
    for _ in range(local_epochs):
        order = torch.randperm(k, generator=gen)
        for start in range(0, k, batch_size):
            idx = order[start : start + batch_size]
            step.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            step.step()
            losses.append(loss.item())
            if record_states:
                batches.append(idx)
                states.append(OrderedDict((n, p.detach().cpu().clone()) for n, p in model.state_dict().items()))
    model.eval()
    wT = OrderedDict((n, p.detach().cpu().clone()) for n, p in model.state_dict().items())
    update = ObservedUpdate(w0, wT, metadata, dict(client or {}))
    return LocalResult(update=update, train_loss=float(sum(losses) / len(losses)), states=states, batches=batches)
