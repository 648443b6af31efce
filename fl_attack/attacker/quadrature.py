"""Gauss-Legendre quadrature on [0,1] and the surrogate weight paths (PI-SME paper, eqs. 4-7).

Weights are handled as flat parameter vectors of length P (see ``fl_attack.federation.update.flatten``).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch


def check_nodes(m, allow_auto: bool = False) -> int:
    """``m`` when it is a number of Gauss-Legendre nodes: an integer >= 1 (with ``allow_auto``, 0 too:
    a run config's "chosen per update by a rule"). ValueError otherwise: the one check of m
    (``AttackConfig``, the run config's attack-nodes, ``fl-attack attack`` / ``replay`` --nodes, the
    experiments' grids)."""
    floor = 0 if allow_auto else 1
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < floor:
        auto = " (0: chosen per update)" if allow_auto else ""
        raise ValueError(f"the number of quadrature nodes m must be an integer >= {floor}{auto}, got {m!r}")
    return int(m)


def gauss_legendre(m: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """The m-point Gauss-Legendre rule mapped to [0,1] (eqs. 6-7).

    Returns (t, c), each of shape (m,): nodes t_i = (xi_i + 1)/2 in (0,1) and weights c_i = w_i/2,
    which sum to 1. The rule integrates polynomials of degree <= 2m-1 on [0,1] exactly.
    Raises ValueError if m < 1 (``check_nodes``).
    """
    xi, w = np.polynomial.legendre.leggauss(check_nodes(m))
    return torch.tensor((xi + 1) / 2, dtype=dtype), torch.tensor(w / 2, dtype=dtype)


def bezier_coefficients(t: torch.Tensor) -> torch.Tensor:
    """Bernstein coefficients of the quadratic Bezier path (eq. 4), shape (len(t), 3).

    Row i is ((1-t)^2, 2(1-t)t, t^2), the weights of (w0, P1, wT) at t_i.
    """
    t = torch.as_tensor(t)
    return torch.stack([(1 - t) ** 2, 2 * (1 - t) * t, t**2], dim=-1)


def bezier_path(t: torch.Tensor, w0: torch.Tensor, control_point: torch.Tensor, wT: torch.Tensor) -> torch.Tensor:
    """Points of w(t) = (1-t)^2 w0 + 2(1-t)t P1 + t^2 wT (eq. 4).

    ``t`` is a scalar or shape (m,); w0, control_point (P1) and wT are flat (P,) vectors.
    Returns (P,) for a scalar t, else (m, P). Differentiable in t and P1.
    """
    t = torch.as_tensor(t, dtype=w0.dtype, device=w0.device)
    coef = bezier_coefficients(t.reshape(-1))  # (m, 3)
    out = coef @ torch.stack([w0, control_point, wT])  # one GEMM, no per-parameter loop
    return out[0] if t.dim() == 0 else out


def linear_path(alpha: torch.Tensor, w0: torch.Tensor, wT: torch.Tensor) -> torch.Tensor:
    """SME's straight-line surrogate w0 + alpha (wT - w0), alpha in [0,1]; flat (P,) vectors."""
    return w0 + alpha * (wT - w0)


def midpoint(w0: torch.Tensor, wT: torch.Tensor) -> torch.Tensor:
    """(w0 + wT)/2, the initial control point and the anchor of the regulariser R_p (eq. 10)."""
    return (w0 + wT) / 2
