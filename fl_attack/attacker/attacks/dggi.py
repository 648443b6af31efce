"""DGGI (Wu et al., "DGGI: Deep generative gradient inversion with diffusion model", Information Fusion
113 (2025) 102620): a diffusion model is the image prior that guides the gradient inversion.

The paper's text and code were not available to us offline; this is our reading of its one-line
description, documented in docs/attack-core.md ("DGGI"): X_hat is fitted to the update by IG's
objective (Lsim of grad_w CE(f_w0(X_hat), Y) against delta_w, plus TV; designed for a single-step
gradient, run on the multi-step update as is, as in the PI-SME paper's Table 1), and every
``prior_every`` iterations the diffusion prior pulls it onto the image manifold: X_hat is diffused to a
noise level and denoised back (SDEdit's projection, Meng et al. ICLR 2022) with the dataset's DDPM
(``fl_attack.attacker.diffusion``, trained by the server on its public pool), the level falling from
``prior_strength`` to 0 at 7/8 of the iterations, the last phase fitting the update alone
(``Attack.guide_images``). Labels are recovered from the update.
"""

from __future__ import annotations

from fl_attack.attacker.attacks.base import register
from fl_attack.attacker.attacks.ig import InvertingGradients


@register
class DGGI(InvertingGradients):
    """IG's surrogate and objective, with the diffusion prior's projection of X_hat (image_prior forced on)."""

    name = "dggi"
    uses_prior = True

    def summary(self):
        return {"prior_level": self.prior_level}
