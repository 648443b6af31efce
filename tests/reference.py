"""A literal, slow PI-SME (Algorithm 1), kept as the reference for tests and the benchmark.

One functional forward and one ``torch.autograd.grad`` call per node, parameters handled as a
dict per node (no flattening, no batching), exactly as the paper writes eq. 8 and eq. 10.

Like Opacus' reference for its per-sample gradients, this file imports nothing from ``fl_attack``:
the Gauss-Legendre rule (Golub-Welsch), Lsim, TV (both reductions), the projections, Adam and the
learning-rate schedule are all written out here from docs/PISME.md, so a bug in the shipped code
cannot hide in the reference as well (tests/test_reference.py checks each piece against the shipped
one, a few whole steps against ``fl_attack.reconstruct``, and that this file has no ``fl_attack``
import). Only the victim's model (its architecture, an input of the attack) and torch itself are
shared.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

# --- the pieces of eq. 10 ------------------------------------------------------------------------


def gauss_legendre_reference(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The m-point Gauss-Legendre rule on [0,1] (eqs. 6-7) by Golub-Welsch, float64 (m,) each.

    The nodes xi_i on [-1,1] are the eigenvalues of the symmetric tridiagonal Jacobi matrix of the
    Legendre polynomials (zero diagonal, off-diagonal k / sqrt(4k^2 - 1), k = 1..m-1), and the
    weights are w_i = 2 v_i[0]^2 with v_i the unit eigenvectors (2 = the integral of 1 on [-1,1]).
    Mapped to [0,1]: t_i = (xi_i + 1)/2, c_i = w_i/2.
    """
    k = np.arange(1, m, dtype=np.float64)
    beta = k / np.sqrt(4.0 * k * k - 1.0)
    jacobi = np.diag(beta, 1) + np.diag(beta, -1)
    xi, vectors = np.linalg.eigh(jacobi)
    w = 2.0 * vectors[0, :] ** 2
    return torch.from_numpy((xi + 1.0) / 2.0), torch.from_numpy(w / 2.0)


def lsim_reference(a: torch.Tensor, b: torch.Tensor, guard: float = 0.0) -> torch.Tensor:
    """Eq. 3: 1 - <a,b> / (||a|| ||b||) of two flat vectors; ``guard`` is added to the denominator
    (0: eq. 3 as written)."""
    return 1 - torch.dot(a, b) / (torch.sqrt(torch.dot(a, a)) * torch.sqrt(torch.dot(b, b)) + guard)


def total_variation_reference(x: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Anisotropic TV of (k,C,H,W) images (eq. 9): the absolute differences of vertical and of
    horizontal neighbours, each summed ("sum", eq. 9 as written) or averaged ("mean", SME's code)."""
    vertical = torch.diff(x, dim=2).abs()
    horizontal = torch.diff(x, dim=3).abs()
    if reduction == "sum":
        return vertical.sum() + horizontal.sum()
    if reduction == "mean":
        return vertical.sum() / vertical.numel() + horizontal.sum() / horizontal.numel()
    raise ValueError(f"unknown TV reduction {reduction!r}")


def project_calibration_reference(calibration: dict, lo: float = 0.1, hi: float = 10.0) -> dict:
    """d after its step: each coordinate put back into [lo, hi] (docs/PISME.md: [0.1, 10])."""
    out = {}
    for k, v in calibration.items():
        out[k] = torch.where(v < lo, torch.full_like(v, lo), torch.where(v > hi, torch.full_like(v, hi), v))
    return out


def project_position_reference(position: torch.Tensor) -> torch.Tensor:
    """SME's alpha and NL-SME's t after their step: put back into [0, 1]."""
    zero, one = torch.zeros_like(position), torch.ones_like(position)
    return torch.where(position < 0, zero, torch.where(position > 1, one, position))


def pixel_box_reference(mean, std, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """The valid normalised pixels [(0 - mean)/std, (1 - mean)/std], per channel, (1,C,1,1) each."""
    mean = torch.tensor(mean, dtype=dtype).view(1, -1, 1, 1)
    std = torch.tensor(std, dtype=dtype).view(1, -1, 1, 1)
    return (0 - mean) / std, (1 - mean) / std


def step_weights_reference(name: str, beta: float, T: int) -> torch.Tensor:
    """(T,) float64 c_r: how many times step r's gradient g~_r counts in delta_w / lr, found by
    running the optimizer's recursion (torch's conventions, docs/PISME.md "Optimizers") on a unit
    gradient at step r and zero at every other step, and summing the T displacements. "sgd": plain
    steps; "momentum": v_1 = g_1, v_s = beta v_(s-1) + g_s, step v_s; "nesterov": step g_s + beta v_s."""
    weights = []
    for r in range(1, T + 1):
        v, moved = 0.0, 0.0
        for s in range(1, T + 1):
            g = 1.0 if s == r else 0.0
            if name == "sgd":
                moved += g
                continue
            v = g if s == 1 else beta * v + g
            moved += g + beta * v if name == "nesterov" else v
        weights.append(moved)
    return torch.tensor(weights, dtype=torch.float64)


def path_weight_reference(step_weights: torch.Tensor, t: float) -> float:
    """a(t): the step weights normalised to mean 1, read at step t T + 1 (0-based index t T, at
    most T - 1), linear between two steps (docs/PISME.md, "Optimizers", "The surrogate")."""
    c = step_weights / step_weights.mean()
    T = c.shape[0]
    pos = min(max(t * T, 0.0), T - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, T - 1)
    return float(c[lo] * (1 - (pos - lo)) + c[hi] * (pos - lo))


# --- eq. 10 ------------------------------------------------------------------------------------


def pisme_objective_reference(
    model,
    w0: dict,
    wT: dict,
    control_point: dict,
    calibration: dict,
    x: torch.Tensor,
    y: torch.Tensor,
    m: int,
    tv_weight: float = 1e-2,
    control_point_weight: float = 1e-3,
    calibration_weight: float = 1e-6,
    tv_reduction: str = "mean",
    lsim_guard: float = 0.0,
    step_weights: torch.Tensor | None = None,
    weight_decay: float = 0.0,
) -> torch.Tensor:
    """Eq. 10 for PI-SME, computed node by node. All weight arguments are dicts name -> tensor.
    ``lsim_guard``: added to Lsim's denominator (``lsim_reference``). ``step_weights`` (T,) and
    ``weight_decay``: the client's optimizer (docs/PISME.md, "Optimizers"): node i's gradient is
    weighted by a(t_i) (``path_weight_reference``) and gets lambda w(t_i) added; None and 0 are
    plain SGD, the paper's eq. 8."""
    t, c = gauss_legendre_reference(m)
    keys = list(w0)
    grad_sum = {k: torch.zeros_like(w0[k]) for k in keys}
    for ti, ci in zip(t.tolist(), c.tolist()):
        w_t = {k: (1 - ti) ** 2 * w0[k] + 2 * (1 - ti) * ti * control_point[k] + ti**2 * wT[k] for k in keys}
        loss = F.cross_entropy(functional_call(model, w_t, (x,)), y)
        grads = torch.autograd.grad(loss, [w_t[k] for k in keys], create_graph=True)
        a = 1.0 if step_weights is None else path_weight_reference(step_weights, ti)
        for k, g in zip(keys, grads):
            grad_sum[k] = grad_sum[k] + ci * a * (g + weight_decay * w_t[k])
    G = torch.cat([grad_sum[k].reshape(-1) for k in keys])
    d = torch.cat([calibration[k].reshape(-1) for k in keys])
    delta_w = torch.cat([(w0[k] - wT[k]).reshape(-1) for k in keys])
    anchor = {k: (w0[k] + wT[k]) / 2 for k in keys}
    r_p = sum((control_point[k] - anchor[k]).pow(2).sum() for k in keys)
    r_d = sum((calibration[k] - 1).pow(2).sum() for k in keys)
    return (
        lsim_reference(d * G, delta_w, lsim_guard)
        + tv_weight * total_variation_reference(x, tv_reduction)
        + control_point_weight * r_p
        + calibration_weight * r_d
    )


# --- Algorithm 1: the optimisation -----------------------------------------------------------------


def lr_factor_reference(iteration: int, iterations: int) -> float:
    """SME's schedule: the learning-rate factor at 0-based ``iteration`` of ``iterations`` (K).

    The rates drop x0.1 at 3/8, 5/8 and 7/8 of the iterations: the drop at floor(K f) holds from
    iteration floor(K f) on. Two conventions that only matter for K <= 3: a drop at 0 holds from
    the first step, and drops that fall on the same iteration count once.
    """
    drops = {math.floor(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)}
    return 0.1 ** sum(1 for d in drops if d <= iteration)


def pisme_reconstruct_reference(model, w0: dict, wT: dict, x: torch.Tensor, y: torch.Tensor, m: int, **options):
    """``iterations`` steps of Algorithm 1 on one update: ``pisme_joint_reconstruct_reference`` with
    the one update at weight 1. Returns (X_hat, P1, d), the last two as dicts like w0."""
    x, (p,), (d,) = pisme_joint_reconstruct_reference(model, [(w0, wT)], [1.0], x, y, m, **options)
    return x, p, d


def pisme_joint_reconstruct_reference(
    model,
    updates: list,
    weights: list,
    x: torch.Tensor,
    y: torch.Tensor,
    m: int,
    *,
    mean,
    std,
    iterations: int,
    lr_images: float = 1.0,
    lr_control_point: float = 1e-5,
    lr_calibration: float = 2.5e-3,
    tv_weight: float = 1e-2,
    tv_reduction: str = "mean",
    control_point_weight: float = 1e-3,
    calibration_weight: float = 1e-6,
    calibration_min: float = 0.1,
    calibration_max: float = 10.0,
    lr_decay: bool = True,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    box_dtype: torch.dtype = torch.float64,
    lsim_guard: float = 0.0,
) -> tuple[torch.Tensor, dict, dict]:
    """``iterations`` steps of Algorithm 1 from X_hat = x, P1_j = (w0_j+wT_j)/2, d_j = 1 (docs/PISME.md,
    "Optimisation"), with Adam written out, SME's schedule, the pixel-box clamp and d's clamp, on
    the weighted sum of the objectives of several updates ``[(w0_j, wT_j)]`` of the same samples,
    each with its own P1_j and d_j (one X_hat; ``weights`` used as given).

    Each step: eq. 10 of each update by ``pisme_objective_reference``, their weighted sum, its
    gradient with respect to X_hat and every P1_j and d_j, one Adam step of each (at its own
    learning rate times the schedule's factor), then X_hat clamped to the box of ``mean``/``std``
    (its bounds computed in ``box_dtype``) and each d_j to [calibration_min, calibration_max].
    ``box_dtype`` and ``lsim_guard`` (see ``pisme_objective_reference``) let a test reproduce two
    rounding-level choices of an implementation; the defaults are the formulas as written.
    Returns (X_hat, [P1_j], [d_j]), the last two as lists of dicts like w0.
    """
    keys = list(updates[0][0])
    params = {"x": x.detach().clone()}
    for j, (w0, wT) in enumerate(updates):
        params.update({("p", j, k): ((w0[k] + wT[k]) / 2).detach().clone() for k in keys})
        params.update({("d", j, k): torch.ones_like(w0[k]) for k in keys})
    base_lr = {name: {"x": lr_images, "p": lr_control_point, "d": lr_calibration}[name[0]] for name in params}
    first = {name: torch.zeros_like(v) for name, v in params.items()}
    second = {name: torch.zeros_like(v) for name, v in params.items()}
    lo, hi = (b.to(x.dtype) for b in pixel_box_reference(mean, std, box_dtype))
    b1, b2 = betas
    for it in range(iterations):
        leaves = {name: v.detach().clone().requires_grad_(True) for name, v in params.items()}
        loss = 0.0
        for j, (w0, wT) in enumerate(updates):
            loss = loss + weights[j] * pisme_objective_reference(
                model,
                w0,
                wT,
                {k: leaves["p", j, k] for k in keys},
                {k: leaves["d", j, k] for k in keys},
                leaves["x"],
                y,
                m,
                tv_weight=tv_weight,
                control_point_weight=control_point_weight,
                calibration_weight=calibration_weight,
                tv_reduction=tv_reduction,
                lsim_guard=lsim_guard,
            )
        names = list(leaves)
        grads = dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names])))
        step = it + 1
        factor = lr_factor_reference(it, iterations) if lr_decay else 1.0
        for name in names:
            g = grads[name]
            first[name] = b1 * first[name] + (1 - b1) * g
            second[name] = b2 * second[name] + (1 - b2) * g * g
            m_hat = first[name] / (1 - b1**step)
            v_hat = second[name] / (1 - b2**step)
            params[name] = params[name] - base_lr[name] * factor * m_hat / (torch.sqrt(v_hat) + eps)
        params["x"] = torch.where(params["x"] < lo, lo, torch.where(params["x"] > hi, hi, params["x"]))
        for j in range(len(updates)):
            d_j = {k: params["d", j, k] for k in keys}
            clamped = project_calibration_reference(d_j, calibration_min, calibration_max)
            params.update({("d", j, k): v for k, v in clamped.items()})
    points = [{k: params["p", j, k] for k in keys} for j in range(len(updates))]
    calibrations = [{k: params["d", j, k] for k in keys} for j in range(len(updates))]
    return params["x"], points, calibrations
