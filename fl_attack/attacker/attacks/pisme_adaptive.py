"""pisme-adaptive: PI-SME with the number of nodes m chosen per phase from an error tolerance.

Beyond the paper, which fixes m by a sweep (docs/PISME.md, "Open question"). At the start of every phase
the attack estimates the quadrature error of G at the current X_hat and control point P1 by
comparing the m-node Gauss-Legendre rule with the (2m+1)-node one, in direction:

    error(m) = || G_m/||G_m|| - G_(2m+1)/||G_(2m+1)|| ||,

an a-posteriori estimate in the usual way (the (2m+1)-node rule is far more accurate, so the
difference is dominated by G_m's own error), measured on the unit vectors because the cosine loss
sees only G's direction (Lsim(G_m, G_(2m+1)) = error^2 / 2). It then uses the smallest m in
1..config.nodes with error(m) <= config.node_tolerance (config.nodes when none qualifies) until
the next phase. Phases: every ``config.node_check_every`` iterations, or, when that is 0, the phases of the
learning-rate schedule (iteration 0 and the drops at 3/8, 5/8 and 7/8 of the run).
Gauss-Legendre rules are not nested, so a check costs sum over the tried m of (m + 2m+1)
first-order gradients (orders shared between tried m are computed once); ``summary`` reports the
m in use, the last estimate and the node-gradient evaluations so far, checks included.

Measured on real FEMNIST and CIFAR-100 victims (docs/results.md, "adaptive m"): the estimate is
about 0.12 at m=1 and still about 0.02 at m=7. A ReLU network's gradient is only piecewise smooth
along the path, so the rule converges algebraically, not at its polynomial order. The default
tolerance of 0.05 therefore selects m of about 3-4 on a true batch.
"""

from __future__ import annotations

import math

import torch

from fl_attack.attacker.attacks.base import lr_milestones, register
from fl_attack.attacker.attacks.gradients import path_gradient
from fl_attack.attacker.attacks.pisme import PathIntegralSME
from fl_attack.attacker.quadrature import bezier_coefficients, gauss_legendre


def surrogate_at_order(
    model,
    shapes,
    w0: torch.Tensor,
    control_point: torch.Tensor,
    wT: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    m: int,
    buffers: dict | None = None,
) -> torch.Tensor:
    """G_m(X, P1) of eq. 8 with m Gauss-Legendre nodes, detached (no graph kept). Returns (P,).
    buffers: the model's buffers (``path_gradient``'s)."""
    t, c = gauss_legendre(m)
    basis = bezier_coefficients(t).to(w0)
    anchors = [w0, control_point.detach(), wT]
    return path_gradient(model, shapes, anchors, basis, c.to(w0), x.detach(), y, buffers).detach()


def direction_error(g: torch.Tensor, reference: torch.Tensor) -> float:
    """|| g/||g|| - reference/||reference|| ||, in [0, 2], accumulated in float64."""
    g, reference = g.double(), reference.double()
    return float((g / g.norm().clamp_min(1e-300) - reference / reference.norm().clamp_min(1e-300)).norm())


def quadrature_error(
    model, shapes, w0, control_point, wT, x, y, m: int, cache: dict | None = None, buffers: dict | None = None
) -> float:
    """The error estimate of the m-node rule at (X, P1): the distance between the unit vectors of
    G_m and G_(2m+1).

    ``cache`` (order -> G) lets several estimates at the same (X, P1) share their evaluations.
    """
    cache = {} if cache is None else cache
    for order in (m, 2 * m + 1):
        if order not in cache:
            cache[order] = surrogate_at_order(model, shapes, w0, control_point, wT, x, y, order, buffers)
    return direction_error(cache[m], cache[2 * m + 1])


def choose_nodes(
    model, shapes, w0, control_point, wT, x, y, tolerance: float, max_nodes: int, buffers: dict | None = None
) -> tuple[int, float, int]:
    """The smallest m in 1..max_nodes whose error estimate is <= tolerance (else max_nodes);
    buffers: the model's buffers (``path_gradient``'s).

    Returns (m, its error estimate, node-gradient evaluations spent on the check).
    """
    cache: dict = {}
    error = math.nan
    for m in range(1, max_nodes + 1):
        error = quadrature_error(model, shapes, w0, control_point, wT, x, y, m, cache, buffers)
        if error <= tolerance:
            break
    return m, error, sum(cache)


@register
class AdaptivePathIntegralSME(PathIntegralSME):
    """PI-SME whose m is re-chosen at each phase from ``config.node_tolerance`` (at most config.nodes)."""

    name = "pisme-adaptive"
    batchable = False  # each client would choose its own m

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c = self.config
        every = int(c.node_check_every)
        self.check_at = set(range(0, c.iterations, every)) if every > 0 else {0, *lr_milestones(c.iterations)}
        self.iteration = 0
        self.evaluations = 0
        self.error_estimate = math.nan
        self.checks = []  # (iteration, m, error estimate)

    @classmethod
    def gradients_per_iteration(cls, config, trace=None):
        """The mean m over the trace (the largest m, ``config.nodes``, without one)."""
        used = [r["nodes"] for r in trace or [] if "nodes" in r]
        return sum(used) / len(used) if used else super().gradients_per_iteration(config)

    def _set_nodes(self, m: int) -> None:
        t, c = gauss_legendre(m)
        self.nodes, self.node_weights = t.to(self.w0), c.to(self.w0)
        self.basis = bezier_coefficients(self.nodes)

    def surrogate_gradient(self, x, y):
        if self.iteration in self.check_at:
            m, self.error_estimate, cost = choose_nodes(
                self.model,
                self.shapes,
                self.w0,
                self.control_point,
                self.wT,
                x,
                y,
                self.config.node_tolerance,
                self.config.nodes,
                self.buffers,
            )
            self.evaluations += cost
            self._set_nodes(m)
            self.checks.append((self.iteration, m, self.error_estimate))
        self.iteration += 1
        self.evaluations += len(self.nodes)
        return super().surrogate_gradient(x, y)

    def summary(self):
        return {
            "nodes": len(self.nodes),
            "node_error": self.error_estimate,
            "gradient_evaluations": self.evaluations,
            **super().summary(),
        }
