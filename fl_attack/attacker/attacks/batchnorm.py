"""Batch norm in the attacks: the surrogate in the client's mode, and the running statistics as a signal.

A client that trains in train mode (``TrainingMetadata.train_mode``, run-config key client-train-mode)
normalises each batch with that batch's statistics. ``surrogate_mode`` puts the attacker's private copy
of the model in the same mode: every batch-norm module (``torch.nn.modules.batchnorm._BatchNorm``) in
train mode with ``track_running_stats = False``, so the surrogate's forward passes normalise with the
batch statistics of X_hat and torch never updates a running statistic or ``num_batches_tracked`` (it
updates them only for a module that tracks them, and in train mode it then passes no running
statistics to ``F.batch_norm``). Its forward then computes exactly what torch's train-mode batch norm
does, (x - mean) / sqrt(biased var + eps) * weight + bias over the batch, with plain differentiable
ops instead of ``F.batch_norm``: torch.func.vmap's rule for the backward of batch norm gets the double
backward in the input wrong (functorch#534; measured here against finite differences), and the
batched attack (``fl_attack.reconstruct_batch``) differentiates that. Dropout and every other module
stay in eval mode: the client's dropout masks are random and unknown to the server, and eval mode's
identity is their expectation. An eval-mode update is attacked with everything in eval mode, the
running statistics of w0 included.

The change of the running statistics leaks the client's feature statistics (invertinggradients#6).
With momentum mu and T steps, running_T = (1-mu)^T running_0 + sum_s mu (1-mu)^(T-s) b_s, b_s step s's
batch statistic, so ``client_statistics`` recovers their weighted mean
m = (running_T - (1-mu)^T running_0) / (1 - (1-mu)^T), exactly; it is the client's feature mean
(variance: torch keeps the unbiased batch variance in running_var) when every batch's statistic is the
client's, e.g. B = k. ``statistics_loss`` is AttackConfig.bn_stats_weight's term: the squared distance
of X_hat's feature means and variances at each batch norm's input to those estimates (DeepInversion's
feature-statistics prior, Yin et al. CVPR 2020, here with the client's own statistics).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm

from fl_attack.federation.update import ObservedUpdate, unflatten


def batch_norms(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """(name, module) of every batch-norm module of ``model`` (BatchNorm1d/2d/3d and their
    subclasses), in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, _BatchNorm)]


def surrogate_mode(model: nn.Module, train_mode: bool) -> nn.Module:
    """Put the attacker's private copy ``model`` in the client's mode, in place, and return it.

    train_mode False: ``model.eval()`` (the paper's). True: ``model.eval()``, then each batch norm in
    train mode with ``track_running_stats = False`` and the forward ``batch_statistics_norm``: batch
    statistics, never a running-statistics update; dropout stays in eval mode (its masks are unknown
    to the server). Never call it on a model whose running statistics are still to be tracked (it is
    the attacker's copy only)."""
    model.eval()
    if train_mode:
        for _, module in batch_norms(model):
            module.train()
            module.track_running_stats = False
            module.forward = types.MethodType(batch_statistics_norm, module)
    return model


def batch_statistics_norm(module: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """torch's train-mode batch norm of ``x`` (N, C, ...) by ``module`` (its eps, weight and bias):
    normalised with the batch's per-channel mean and biased variance, over every dimension but 1;
    no running statistic is read or written. Differentiable to any order, under vmap too."""
    dims = [0, *range(2, x.dim())]
    mean = x.mean(dims, keepdim=True)
    var = x.var(dims, correction=0, keepdim=True)
    out = (x - mean) * torch.rsqrt(var + module.eps)
    if module.affine:
        shape = [1, -1] + [1] * (x.dim() - 2)
        out = out * module.weight.view(shape) + module.bias.view(shape)
    return out


@dataclass(frozen=True)
class LayerStatistics:
    """The client's feature statistics at the input of one batch norm, estimated from the update.

    name: the module's name; mean, var: (C,) float64, the weighted mean over the T local steps of the
    batches' per-channel means and unbiased variances (the client's, when every batch's statistic
    is); position: in [0, 1), the same weighted mean of the steps' places (s-1)/T on the path from
    w0 to wT, where ``statistics_loss`` evaluates X_hat's features.
    """

    name: str
    mean: torch.Tensor
    var: torch.Tensor
    position: float


def _prefix(name: str) -> str:
    return f"{name}." if name else ""


def client_statistics(update: ObservedUpdate, model: nn.Module) -> list[LayerStatistics]:
    """The client's feature statistics at each batch norm of ``model`` that tracks running statistics
    (those the update carries), from their change between w0 and wT, in float64.

    With momentum mu (the module's): m = (r_T - (1-mu)^T r_0) / (1 - (1-mu)^T), T the update's local
    steps, r the running mean (for the variance: the running variance). With momentum None (torch's
    cumulative average): m = ((n0 + T) r_T - n0 r_0) / T, n0 w0's num_batches_tracked. [] when the
    model has no such layer. Meaningful for a train-mode update only (eval mode changes nothing).
    """
    steps = update.metadata.local_steps
    s = torch.arange(1, steps + 1, dtype=torch.float64)
    out = []
    for name, module in batch_norms(model):
        key = _prefix(name)
        mean_key, var_key = key + "running_mean", key + "running_var"
        if not module.track_running_stats or mean_key not in update.w0 or var_key not in update.w0:
            continue
        if module.momentum is None:  # cumulative moving average over all num_batches_tracked batches
            n0 = float(update.w0[key + "num_batches_tracked"])

            def estimate(r0, rT, n0=n0):
                return ((n0 + steps) * rT - n0 * r0) / steps

            weights = torch.ones_like(s)
        else:
            mu = float(module.momentum)
            keep = (1 - mu) ** steps

            def estimate(r0, rT, keep=keep):
                return (rT - keep * r0) / (1 - keep)

            weights = (1 - mu) ** (steps - s)
        mean, var = (estimate(update.w0[k].double(), update.wT[k].double()) for k in (mean_key, var_key))
        position = float((weights * (s - 1) / steps).sum() / weights.sum())
        out.append(LayerStatistics(name, mean, var, position))
    return out


def check_statistics_use(update: ObservedUpdate, model: nn.Module, weight: float) -> list[LayerStatistics]:
    """The update's ``client_statistics`` when AttackConfig.bn_stats_weight ``weight`` > 0, else [].

    Raises ValueError, before any attack work, when weight > 0 and the update is of eval-mode
    training (its running statistics never changed) or the model has no batch norm with running
    statistics in the update.
    """
    if weight <= 0:
        return []
    if not update.metadata.train_mode:
        raise ValueError(
            "bn_stats_weight > 0 matches the change of batch norm's running statistics, but this update "
            "was trained in eval mode (train_mode False): they did not change"
        )
    layers = client_statistics(update, model)
    if not layers:
        raise ValueError(
            "bn_stats_weight > 0 needs batch-norm running statistics in the update; the model has no batch "
            "norm that tracks them"
        )
    return layers


def feature_statistics(model: nn.Module, state: dict, x: torch.Tensor, names) -> dict:
    """name -> (mean, unbiased var), each (C,), of the input of each batch norm in ``names`` in one
    forward pass of ``x`` (k, C, H, W) through ``model`` with ``state`` (``functional_call``'s
    weights and buffers); differentiable in x and state. Per channel: over every dimension but 1."""
    modules = dict(model.named_modules())
    captured = {}

    def hook(name):
        def capture(module, args):
            captured[name] = args[0]

        return capture

    handles = [modules[name].register_forward_pre_hook(hook(name)) for name in names]
    try:
        functional_call(model, state, (x,))
    finally:
        for handle in handles:
            handle.remove()
    out = {}
    for name in names:
        f = captured[name]
        dims = [0, *range(2, f.dim())]
        out[name] = (f.mean(dims), f.var(dims))
    return out


def statistics_loss(
    model: nn.Module,
    shapes,
    w0: torch.Tensor,
    wT: torch.Tensor,
    x: torch.Tensor,
    targets: list,
    buffers: dict | None = None,
) -> torch.Tensor:
    """sum over batch norms of ||mean(f(X_hat)) - m||^2 + ||var(f(X_hat)) - v||^2, f the layer's input
    (AttackConfig.bn_stats_weight's term), differentiable in x.

    model: in the client's mode (``surrogate_mode``: batch statistics, nothing tracked); shapes: the
    layout of its parameters. One client: w0, wT (P,), x (k,C,H,W), targets its list of
    LayerStatistics, buffers name -> tensor; returns a scalar. N clients: w0, wT (N, P), x (N,k,C,H,W),
    targets N such lists, buffers of shape (N, ...); returns (N,), each client's own. Each layer's
    features are taken at w0 + t (wT - w0), t its estimate's ``position``.
    """
    if w0.dim() == 2:
        return torch.stack(
            [
                statistics_loss(
                    model,
                    shapes,
                    w0[n],
                    wT[n],
                    x[n],
                    targets[n],
                    None if buffers is None else {k: v[n] for k, v in buffers.items()},
                )
                for n in range(w0.shape[0])
            ]
        )
    by_position: dict[float, list[LayerStatistics]] = {}
    for layer in targets:
        by_position.setdefault(layer.position, []).append(layer)
    total = x.new_zeros(())
    for t, layers in by_position.items():
        state = unflatten(w0 + t * (wT - w0), shapes)
        if buffers is not None:
            state = {**state, **buffers}
        found = feature_statistics(model, state, x, [layer.name for layer in layers])
        for layer in layers:
            mean, var = found[layer.name]
            total = total + (mean - layer.mean.to(mean)).pow(2).sum() + (var - layer.var.to(var)).pow(2).sum()
    return total
