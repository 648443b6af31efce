"""NL-SME (Xia et al., arXiv 2509.22082): one gradient at a learnable point of a Bezier path.

There is no public code. Our reading of the paper, documented in docs/attack-core.md:
- the path is the quadratic Bezier curve of eq. 4 with learnable control point P1 (init midpoint);
- one learnable position t in [0,1] (init 0.5, Adam at lr_position, clamped after each step);
- the same calibration d, R_p and R_d regularisers and learning rates as PI-SME (eq. 10).
"""

from __future__ import annotations

import torch

from fl_attack.attacker.attacks.base import Attack, BezierMixin, register
from fl_attack.attacker.quadrature import bezier_coefficients


@register
class NonLinearSME(BezierMixin, Attack):
    """G(X_hat, P1, t) = grad_w CE(f_{w(t)}(X_hat), Y) with w(t) the Bezier path of eq. 4."""

    name = "nlsme"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_bezier()
        # t, one per client: shape batch_shape
        self.position = torch.full(self.batch_shape, 0.5, dtype=self.w0.dtype, device=self.w0.device).requires_grad_()

    def param_groups(self):
        return self._bezier_groups() + [{"params": [self.position], "lr": self.config.lr_position}]

    def surrogate_gradient(self, x, y):
        basis = bezier_coefficients(self.position.unsqueeze(-1))  # (1, 3) or (N, 1, 3), differentiable in t
        return self.path_surrogate([self.w0, self.control_point, self.wT], basis, self.w0.new_ones(1), x, y)

    @torch.no_grad()
    def project(self):
        self.position.clamp_(0.0, 1.0)
        self._project_calibration()

    def summary(self):
        return {"position": self.position.detach(), **self._bezier_summary()}
