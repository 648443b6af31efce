"""IG (Geiping et al., NeurIPS 2020): cosine matching of the single gradient at w0, plus TV."""

from __future__ import annotations

import torch

from fl_attack.attacker.attacks.base import Attack, register


@register
class InvertingGradients(Attack):
    """G(X_hat) = grad_w CE(f_w0(X_hat), Y): treats the multi-step update as one step at w0."""

    name = "ig"

    def surrogate_gradient(self, x, y):
        one = torch.ones(1, dtype=self.w0.dtype, device=self.w0.device)
        return self.path_surrogate([self.w0], None, one, x, y)
