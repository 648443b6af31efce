"""PI-SME (Ghosh & Bhattacharya, arXiv 2610.03597; eqs. 4-10, Alg. 1).

The update delta_w = w0 - wT is a path integral of the gradient. PI-SME approximates it with an
m-node Gauss-Legendre rule along a learnable quadratic Bezier path and matches it under cosine
loss with a calibration vector d, plus TV, R_p and R_d.
"""

from __future__ import annotations

from fl_attack.attacker.attacks.base import Attack, BezierMixin, register
from fl_attack.attacker.quadrature import bezier_coefficients, gauss_legendre


@register
class PathIntegralSME(BezierMixin, Attack):
    """G(X_hat, P1) = sum_i c_i grad_w CE(f_{w(t_i)}(X_hat), Y) (eq. 8), m = config.nodes."""

    name = "pisme"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_bezier()
        t, c = gauss_legendre(self.config.nodes)
        self.nodes = t.to(self.w0)
        self.node_weights = c.to(self.w0)
        self.basis = bezier_coefficients(self.nodes)  # (m, 3): weights of (w0, P1, wT) at each node

    @classmethod
    def gradients_per_iteration(cls, config, trace=None):
        return config["nodes"] if isinstance(config, dict) else config.nodes

    def param_groups(self):
        return self._bezier_groups()

    def surrogate_gradient(self, x, y):
        anchors = [self.w0, self.control_point, self.wT]
        return self.path_surrogate(anchors, self.basis, self.node_weights, x, y, nodes=self.nodes)

    def project(self):
        self._project_calibration()

    def summary(self):
        return self._bezier_summary()
