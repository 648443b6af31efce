"""A literal, slow Algorithm 1 of PI-SME, kept as the reference for tests and the benchmark.

One functional forward and one ``torch.autograd.grad`` call per node, parameters handled as a
dict per node (no flattening, no batching), exactly as the paper writes eq. 8 and eq. 10.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fl_attack.attacks.base import lsim, total_variation
from fl_attack.quadrature import gauss_legendre


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
) -> torch.Tensor:
    """Eq. 10 for PI-SME, computed node by node. All weight arguments are dicts name -> tensor."""
    t, c = gauss_legendre(m)
    keys = list(w0)
    grad_sum = {k: torch.zeros_like(w0[k]) for k in keys}
    for ti, ci in zip(t.tolist(), c.tolist()):
        w_t = {k: (1 - ti) ** 2 * w0[k] + 2 * (1 - ti) * ti * control_point[k] + ti**2 * wT[k] for k in keys}
        loss = F.cross_entropy(functional_call(model, w_t, (x,)), y)
        grads = torch.autograd.grad(loss, [w_t[k] for k in keys], create_graph=True)
        for k, g in zip(keys, grads):
            grad_sum[k] = grad_sum[k] + ci * g
    G = torch.cat([grad_sum[k].reshape(-1) for k in keys])
    d = torch.cat([calibration[k].reshape(-1) for k in keys])
    delta_w = torch.cat([(w0[k] - wT[k]).reshape(-1) for k in keys])
    anchor = {k: (w0[k] + wT[k]) / 2 for k in keys}
    r_p = sum((control_point[k] - anchor[k]).pow(2).sum() for k in keys)
    r_d = sum((calibration[k] - 1).pow(2).sum() for k in keys)
    return (
        lsim(d * G, delta_w)
        + tv_weight * total_variation(x, tv_reduction)
        + control_point_weight * r_p
        + calibration_weight * r_d
    )
