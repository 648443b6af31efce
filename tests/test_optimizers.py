"""Client optimizers: training as configured, and the attacks' model of the update it produces.

The references here are literal: each optimizer's recursion is written out below (textbook heavy
ball, Nesterov, Adam), not imported from fl_attack, and run on the paper's FEMNIST CNN and a real
writer's images. On that recursion the exact delta_w is known, and the step weights c_s of
``ClientOptimizer.step_weights`` must reproduce it (docs/PISME.md, "Optimizers").
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fl_attack import AttackConfig, reconstruct
from fl_attack.attacker.attacks import get_attack
from fl_attack.audit.settings import RunSettings
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.data import client_partition, get_spec, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import flatten, layout

LR = 0.01


@pytest.fixture(scope="module")
def writer():
    """FEMNIST writer 0, k=8: images (8,1,28,28) in [0,1] and labels (8,)."""
    split = client_partition(load_pool("femnist"), 0, 8)
    return split.train.images, split.train.labels


def _literal(model, x, y, batches, opt: ClientOptimizer, lr):
    """The optimizer's recursion written out (torch's conventions: v_1 = g_1, no dampening; L2 weight
    decay added to the gradient except AdamW's decoupled one). Returns (wT, [g_s], [w_{s-1}]) as flat
    float64 vectors, g_s the loss gradient alone (no weight-decay term) at w_{s-1}."""
    params = [p for p in model.parameters()]
    beta = opt.momentum
    b1, b2 = opt.adam_betas
    lam = opt.weight_decay
    v = [torch.zeros_like(p) for p in params]
    m = [torch.zeros_like(p) for p in params]
    sq = [torch.zeros_like(p) for p in params]
    grads, states = [], []
    for s, idx in enumerate(batches, start=1):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        g = torch.autograd.grad(loss, params)
        grads.append(torch.cat([gi.reshape(-1) for gi in g]))
        states.append(torch.cat([p.detach().reshape(-1) for p in params]))
        with torch.no_grad():
            for i, p in enumerate(params):
                gi = g[i] + (lam * p if opt.name != "adamw" else 0)
                if opt.name in ("sgd",):
                    p -= lr * gi
                elif opt.name in ("momentum", "nesterov"):
                    v[i] = gi.clone() if s == 1 else beta * v[i] + gi
                    p -= lr * (gi + beta * v[i] if opt.name == "nesterov" else v[i])
                else:
                    if opt.name == "adamw":
                        p *= 1 - lr * lam
                    m[i] = b1 * m[i] + (1 - b1) * gi
                    sq[i] = b2 * sq[i] + (1 - b2) * gi * gi
                    m_hat, v_hat = m[i] / (1 - b1**s), sq[i] / (1 - b2**s)
                    p -= lr * m_hat / (v_hat.sqrt() + 1e-8)
    wT = torch.cat([p.detach().reshape(-1) for p in params])
    return wT, grads, states


REGIMES = {
    "sgd+wd": ClientOptimizer("sgd", weight_decay=0.05),
    "momentum": ClientOptimizer("momentum", momentum=0.9),
    "momentum+wd": ClientOptimizer("momentum", momentum=0.9, weight_decay=0.05),
    "nesterov": ClientOptimizer("nesterov", momentum=0.8),
    "nesterov+wd": ClientOptimizer("nesterov", momentum=0.8, weight_decay=5e-4),
    "adam": ClientOptimizer("adam", weight_decay=1e-3, adam_betas=(0.8, 0.99)),
    "adamw": ClientOptimizer("adamw", weight_decay=0.01),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_train_local_follows_the_literal_recursion(writer, regime):
    """train_local's wT (float32, torch.optim) equals the written-out recursion (float64) on the
    same batches: the configured optimizer is the one that trains."""
    images, labels = writer
    opt = REGIMES[regime]
    model = build_model("femnist", seed=0)
    reference = copy.deepcopy(model).double()
    result = train_local(
        model, images, labels, dataset="femnist", lr=LR, batch_size=4, local_epochs=3, optimizer=opt, record_states=True
    )
    assert result.update.metadata.optimizer == opt and result.update.metadata.local_steps == 6
    x = get_spec("femnist").normalize(images.double())
    wT_ref, _, _ = _literal(reference, x, labels.long(), result.batches, opt, LR)
    wT = flatten(result.update.wT).double()
    w0 = flatten(result.update.w0).double()
    # relative to the update's size: float32 training against a float64 recursion
    assert (wT - wT_ref).norm() / (w0 - wT_ref).norm() < 1e-4


@pytest.mark.parametrize("regime", ["sgd+wd", "momentum", "momentum+wd", "nesterov", "nesterov+wd"])
def test_step_weights_give_the_exact_update(writer, regime):
    """delta_w = lr * sum_s c_s (g_s + lambda w_{s-1}) exactly (float64) for SGD, heavy ball and
    Nesterov, with and without weight decay, c_s from ClientOptimizer.step_weights."""
    images, labels = writer
    opt = REGIMES[regime]
    model = build_model("femnist", seed=0).double()
    w0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    x = get_spec("femnist").normalize(images.double())
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randperm(8, generator=gen)[:4] for _ in range(7)]
    wT, grads, states = _literal(model, x, labels.long(), batches, opt, LR)
    c = torch.as_tensor(opt.step_weights(len(batches)), dtype=torch.float64)
    model_of_update = LR * sum(ci * (g + opt.weight_decay * w) for ci, g, w in zip(c, grads, states))
    delta_w = w0 - wT
    assert (model_of_update - delta_w).norm() / delta_w.norm() < 1e-10
    # the naive model (c_s = 1, no weight decay) does not: the test can tell them apart
    naive = LR * sum(grads)
    assert (naive - delta_w).norm() / delta_w.norm() > 1e-2


def test_adam_step_weights_are_uniform():
    """Adam's step moves each coordinate by lr * m_hat / sqrt(v_hat), scale-free: uniform weights (the
    first moment's own weights measured worse, docs/real-federations.md)."""
    for name in ("adam", "adamw"):
        assert (ClientOptimizer(name, adam_betas=(0.8, 0.999)).step_weights(9) == 1).all()


def _momentum_victim(writer, opt, local_epochs=5):
    images, labels = writer
    result = train_local(
        build_model("femnist", seed=0),
        images,
        labels,
        dataset="femnist",
        lr=LR,
        batch_size=4,
        local_epochs=local_epochs,
        optimizer=opt,
    )
    return result.update, images, labels


@pytest.mark.parametrize("regime", ["momentum", "momentum+wd", "nesterov"])
def test_the_aware_surrogate_is_closer_to_the_observed_update(writer, regime):
    """At the true images and labels, on PI-SME's initial path (P1 at the midpoint, d = 1), the
    optimizer-aware surrogate G points closer to the observed delta_w than the naive one: what the
    attack matches is a better model of the update (T=10, lr 0.01)."""
    update, images, labels = _momentum_victim(writer, REGIMES[regime])
    model = build_model("femnist")
    for p in model.parameters():
        p.requires_grad_(False)
    w0, wT = flatten(update.w0).double(), flatten(update.wT).double()
    x = get_spec("femnist").normalize(images.double())
    lsim = {}
    for aware in (True, False):
        config = AttackConfig(nodes=7, optimizer_aware=aware)
        attack = get_attack("pisme")(model.double(), w0, wT, layout(update.w0), config, training=update.metadata)
        with torch.no_grad():
            g = attack.surrogate_gradient(x, labels.long()).detach()
        lsim[aware] = 1 - F.cosine_similarity(g, attack.delta_w, dim=0).item()
    assert lsim[True] < lsim[False]


def test_plain_sgd_attacks_are_unchanged_by_optimizer_awareness(writer):
    """For the paper's plain SGD every optimizer-aware term is 1 or 0: the reconstruction is the
    same bit for bit, for every method, and for Adam without weight decay; with momentum it is not
    (the option acts)."""
    plain, _, _ = _momentum_victim(writer, ClientOptimizer(), local_epochs=1)
    for method in ("pisme", "sme", "nlsme", "ig"):
        runs = [
            reconstruct(plain, method, iterations=3, nodes=3, device="cpu", optimizer_aware=a).images
            for a in (True, False)
        ]
        assert torch.equal(runs[0], runs[1]), method
    adam, _, _ = _momentum_victim(writer, ClientOptimizer("adam"), local_epochs=1)  # uniform weights, no decay
    runs = [reconstruct(adam, "pisme", iterations=3, nodes=3, device="cpu", optimizer_aware=a).images for a in (1, 0)]
    assert torch.equal(runs[0], runs[1])
    heavy, _, _ = _momentum_victim(writer, REGIMES["momentum+wd"], local_epochs=1)
    runs = [
        reconstruct(heavy, "pisme", iterations=3, nodes=3, device="cpu", optimizer_aware=a).images
        for a in (True, False)
    ]
    assert not torch.equal(runs[0], runs[1])


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"client-optimizer": "rmsprop"}, "client-optimizer must be one of"),
        ({"client-optimizer": "momentum", "client-momentum": 0.0}, "needs a momentum in (0, 1)"),
        ({"client-optimizer": "nesterov", "client-momentum": 1.0}, "needs a momentum in (0, 1)"),
        ({"client-weight-decay": -1e-4}, "weight decay must be a finite number >= 0"),
        ({"client-optimizer": "adam", "client-adam-betas": "0.9"}, "adam betas"),
        ({"client-optimizer": "adam", "client-adam-betas": "0.9,1.0"}, "adam betas"),
        ({"client-momentum": 0.5}, "client-momentum 0.5 applies to client-optimizer momentum and nesterov only"),
        ({"client-optimizer": "adamw", "client-momentum": 0.0}, "not 'adamw'"),
        ({"attack-options": "bn_stats_weight=1"}, "bn_stats_weight > 0 needs client-train-mode = true"),
    ],
)
def test_bad_optimizer_settings_are_refused_before_the_run(overrides, message):
    with pytest.raises(ValueError, match="invalid run config") as err:
        RunSettings.from_run_config(overrides).validate()
    assert message in str(err.value)


def test_run_config_optimizer_reaches_the_metadata():
    settings = RunSettings.from_run_config(
        {"client-optimizer": "momentum", "client-momentum": 0.9, "client-weight-decay": 5e-4}
    )
    assert settings.optimizer == ClientOptimizer("momentum", 0.9, 5e-4)
    # the run-config default client-momentum (0.9) is not applied to optimizers that have none
    assert RunSettings.from_run_config({"client-optimizer": "adam"}).optimizer.momentum == 0.0
    assert RunSettings.from_run_config({}).optimizer == ClientOptimizer()
