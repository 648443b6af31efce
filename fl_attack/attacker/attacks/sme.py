"""SME (Zhu, Yao and Blaschko, ICML 2023): the gradient at a learnable point on the line w0 -> wT.

SME's code differentiates alpha by hand; here autograd goes through the functional call.
"""

from __future__ import annotations

import torch

from fl_attack.attacker.attacks.base import Attack, register


@register
class SurrogateModelExtension(Attack):
    """G(X_hat, alpha) = grad_w CE(f_{w0 + alpha (wT - w0)}(X_hat), Y), alpha in [0,1], init 0.5."""

    name = "sme"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # alpha, one per client: shape batch_shape
        self.alpha = torch.full(self.batch_shape, 0.5, dtype=self.w0.dtype, device=self.w0.device).requires_grad_()

    def param_groups(self):
        return [{"params": [self.alpha], "lr": self.config.lr_position}]

    def surrogate_gradient(self, x, y):
        basis = torch.stack([1 - self.alpha, self.alpha], -1).unsqueeze(-2)  # w0 + alpha (wT - w0): (1, 2) or (N, 1, 2)
        return self.path_surrogate([self.w0, self.wT], basis, self.w0.new_ones(1), x, y)

    @torch.no_grad()
    def project(self):
        self.alpha.clamp_(0.0, 1.0)

    def summary(self):
        return {"alpha": self.alpha.detach()}
