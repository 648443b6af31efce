"""What DP promises about reconstruction: an upper bound on the chance that any attack recovers an image
of a client, beside the rate the verdict measures (docs/defenses.md, "DP's promise beside the measurement").

Reconstruction robustness (ReRo; Balle, Cherubin & Hayes, IEEE S&P 2022): a mechanism M is (η, γ)-ReRo
for a prior π over the target Z when, for every reconstruction attack R, P_{Z~π, w~M(Z)}[R(w) succeeds
on Z] ≤ γ, where success is any event of (Z, R(w)) (here: an image recovered, docs/verdict.md), and
κ = sup over update-free guesses z0 of P_{Z~π}[z0 succeeds on Z] is the best guess made without the
release. The bounds below are derived here from the definitions of f-DP (Dong, Roth & Su, "Gaussian
differential privacy", JRSS-B 2022; cited as DRS): the ReRo papers' own theorem statements were not at
hand when this was written, so no theorem number of theirs is cited.

* Let P_z be the view with the target z and Q the view in which the target's contribution is replaced
  by one that carries nothing of z (so Q does not depend on z). For a fixed z the success event S_z is
  a test between Q (null) and P_z, with type-I error α(z) = Q(S_z) and type-II error 1 - P_z(S_z).
  If M is f-DP (DRS Def. 2.3, f a trade-off function, DRS Def. 2.1: convex, continuous,
  non-increasing), then 1 - P_z(S_z) ≥ f(α(z)), so P_z(S_z) ≤ 1 - f(α(z)). Averaging over Z ~ π and
  using the concavity of 1 - f (Jensen) and E_Z α(Z) = E_{w~Q} P_Z[S_Z] ≤ κ (w is independent of Z):
  success ≤ 1 - f(κ). This is the hypothesis-testing ReRo bound of Kaissis, Hayes, Ziller & Rueckert
  2023 and Hayes, Mahloujifar & Balle, NeurIPS 2023.
* (ε, δ)-DP is f_{ε,δ}-DP with f_{ε,δ}(α) = max{0, 1 - δ - e^ε α, e^{-ε}(1 - δ - α)} (DRS Sec. 2,
  after Wasserman & Zhou 2010 and Kairouz, Oh & Viswanath 2017), so 1 - f_{ε,δ}(κ) ≤ e^ε κ + δ: the
  (ε, δ) ReRo bound of Balle et al. 2022 (``rero_bound_eps_delta``).
* μ-GDP is G_μ-DP with G_μ(α) = Φ(Φ⁻¹(1 - α) - μ) (DRS Def. 2.6), so 1 - G_μ(κ) = Φ(Φ⁻¹(κ) + μ)
  (``rero_bound_gaussian``). A Gaussian mechanism of L2 sensitivity Δ and noise std σ is (Δ/σ)-GDP
  (DRS Thm. 2.7); T adaptive compositions of μ-GDP mechanisms are √T·μ-GDP (DRS Cor. 3.3). It is the
  exact trade-off of the Gaussian, so it is never looser than e^ε κ + δ at any (ε, δ(ε)) the same
  mechanism satisfies (DRS Cor. 2.13, ``gaussian_delta``).

The subsampled Gaussian (Poisson rate q < 1, Kaissis et al. 2023 bound it numerically) is not covered:
local-dp gets no amplification (the server knows who was sampled) and central-dp's promise does not
cover this server, which sees each update before the noise. scipy and the standard library only.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr, ndtri
from scipy.stats import beta

from fl_attack.privacy.accountant import gaussian_noise_multiplier

log = logging.getLogger(__name__)

BOUNDS = ("rero-eps-delta", "gdp")  # the names of ``ReroBound.name``


def _check_kappa(kappa: float) -> float:
    if not 0 <= kappa <= 1:
        raise ValueError(f"kappa (the best update-free guess's success rate) must be in [0, 1], got {kappa}")
    return float(kappa)


def kappa_upper(recovered: int, k: int, confidence: float = 0.95) -> float:
    """κ: the one-sided ``confidence`` upper bound of the best update-free guess's success rate, when it
    recovered ``recovered`` of ``k`` images (the verdict's ``guess_recovered`` of ``k``), exact
    (Clopper-Pearson: the p at which P[Binomial(k, p) ≤ recovered] = 1 - confidence, the ``confidence``
    quantile of Beta(recovered + 1, k - recovered); 1 when recovered = k). An observed 0 is not 0:
    0 of 32 at 95% gives 1 - 0.05^(1/32) ≈ 0.0893. A fraction in (0, 1].

    It covers the sampling of the k images only: κ is the best of the verdict's guesses, not of every
    update-free guess, so a better guess would raise it. ValueError unless 0 ≤ recovered ≤ k, k ≥ 1 and
    0 < confidence < 1."""
    if k < 1 or not 0 <= recovered <= k or not 0 < confidence < 1:
        raise ValueError(
            f"kappa_upper needs 0 <= recovered <= k, k >= 1 and confidence in (0, 1), got {recovered} of {k} "
            f"at {confidence}"
        )
    if recovered == k:
        return 1.0
    return float(beta.ppf(confidence, recovered + 1, k - recovered))


def rero_bound_eps_delta(epsilon: float, delta: float, kappa: float) -> float:
    """min(1, e^ε·κ + δ): the success probability of any reconstruction attack on an (ε, δ)-DP
    mechanism whose best update-free guess succeeds with probability κ (Balle, Cherubin & Hayes 2022,
    their (ε, δ)-DP ⇒ ReRo statement; derived in the module docstring). In [0, 1]; e^ε is never formed
    when it would overflow. ValueError unless ε ≥ 0, 0 ≤ δ ≤ 1 and 0 ≤ κ ≤ 1.

    Only for a mechanism that is (ε, δ)-DP: LocalDpMod's nominal (ε, δ) is not above ε ≈ 1 (its
    calibration is valid for ε < 1, docs/defenses.md); give the ε spent at δ (``gaussian_epsilon``)."""
    kappa = _check_kappa(kappa)
    if not (epsilon >= 0 and 0 <= delta <= 1):
        raise ValueError(f"rero_bound_eps_delta needs epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    if kappa == 0:
        return min(1.0, float(delta))
    if epsilon + math.log(kappa) >= 0:  # e^ε κ ≥ 1
        return 1.0
    return min(1.0, math.exp(epsilon + math.log(kappa)) + delta)


def gaussian_mu(noise_multiplier: float, compositions: int = 1) -> float:
    """μ = √compositions / z of ``compositions`` Gaussian mechanisms of noise multiplier z = σ/Δ (noise
    std over L2 sensitivity), each (1/z)-GDP (DRS Thm. 2.7), composed (DRS Cor. 3.3). inf for z = 0,
    0 for no composition. ValueError for z < 0 or compositions < 0."""
    if noise_multiplier < 0 or compositions < 0:
        raise ValueError(
            f"gaussian_mu needs noise_multiplier >= 0 and compositions >= 0, got {noise_multiplier}, {compositions}"
        )
    if compositions == 0:
        return 0.0
    return math.inf if noise_multiplier == 0 else math.sqrt(compositions) / noise_multiplier


def rero_bound_gaussian(
    kappa: float, *, mu: float | None = None, noise_multiplier: float | None = None, compositions: int = 1
) -> float:
    """Φ(Φ⁻¹(κ) + μ) = 1 - G_μ(κ): the success probability of any reconstruction attack on a μ-GDP
    mechanism whose best update-free guess succeeds with probability κ (the hypothesis-testing ReRo
    bound, Kaissis et al. 2023, Hayes et al. 2023, for the Gaussian's trade-off function G_μ, DRS
    Def. 2.6; module docstring). Give ``mu`` itself, or ``noise_multiplier`` z and ``compositions`` T
    for μ = √T/z (``gaussian_mu``). In [0, 1]: κ for μ = 0, 1 for μ = inf (unless κ = 0).

    ValueError unless exactly one of mu and noise_multiplier is given, mu ≥ 0 and 0 ≤ κ ≤ 1."""
    kappa = _check_kappa(kappa)
    if (mu is None) == (noise_multiplier is None):
        raise ValueError("rero_bound_gaussian needs exactly one of mu and noise_multiplier")
    if mu is None:
        mu = gaussian_mu(noise_multiplier, compositions)
    if not mu >= 0:
        raise ValueError(f"rero_bound_gaussian needs mu >= 0, got {mu}")
    if kappa in (0.0, 1.0) or mu == 0:
        return kappa
    if math.isinf(mu):
        return 1.0
    return float(ndtr(ndtri(kappa) + mu))


def gaussian_delta(mu: float, epsilon: float) -> float:
    """δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2): the least δ for which a μ-GDP mechanism (μ > 0, finite)
    is (ε, δ)-DP (DRS Cor. 2.13; Balle & Wang, ICML 2018, Thm. 8), e^ε Φ(·) in logs. ε ≥ 0."""
    tail = math.exp(epsilon + float(log_ndtr(-epsilon / mu - mu / 2)))
    return max(0.0, float(ndtr(-epsilon / mu + mu / 2)) - tail)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The least ε ≥ 0 with δ(ε) ≤ ``delta`` for a μ-GDP mechanism (``gaussian_delta`` solved by
    brentq to a relative 1e-12): the exact ε at δ of composed Gaussian mechanisms (the PLD accountant's
    figure up to its discretization; the RDP accountant's is larger). 0 for μ = 0, inf for μ = inf.
    ValueError unless μ ≥ 0 and 0 < δ < 1."""
    if not (mu >= 0 and 0 < delta < 1):
        raise ValueError(f"gaussian_epsilon needs mu >= 0 and delta in (0, 1), got {mu}, {delta}")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    if gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    # The privacy loss is N(μ²/2, μ²) and δ(ε) ≤ P[loss > ε], so δ(high) ≤ delta.
    high = mu * mu / 2 + mu * float(-ndtri(delta))
    return float(brentq(lambda e: gaussian_delta(mu, e) - delta, 0.0, high, xtol=1e-12, rtol=1e-12))


@dataclass(frozen=True)
class ReroBound:
    """DP's promised bound on one attack's success rate (a fraction in [0, 1]).

    bound: the tightest of the bounds computed; name: which ("gdp" or "rero-eps-delta", BOUNDS);
    vacuous: bound ≥ 1 (it promises nothing). kappa: the κ used. compositions: the Gaussian releases of
    the client the attacker is granted. mu: their μ (GDP). epsilon, delta: the (ε, δ) of the
    "rero-eps-delta" bound (the exact ε at δ of the same mechanism). gdp, eps_delta: both bounds.
    """

    bound: float
    name: str
    vacuous: bool
    kappa: float
    compositions: int
    mu: float
    epsilon: float
    delta: float
    gdp: float
    eps_delta: float


def local_dp_rero_bound(
    *, clip_norm: float, epsilon: float, delta: float, compositions: int, kappa: float, target_delta: float = 1e-5
) -> ReroBound:
    """DP's bound on the success rate of any reconstruction by a server that saw ``compositions`` of a
    client's local-dp updates, each sent through Flower's LocalDpMod (``clip_norm`` C, per-round
    ``epsilon`` and ``delta``; the run's "defense-clip-norm", "defense-epsilon", "defense-delta"), whose
    best update-free guess succeeds with probability ``kappa`` (``kappa_upper``).

    LocalDpMod (flwr 1.42, clients/defenses.py passes sensitivity = C) clips the update to L2 norm C and
    adds N(0, σ²) per coordinate, σ = C·√(2 ln(1.25/δ))/ε: the noise multiplier z = σ/C =
    √(2 ln(1.25/δ))/ε (``gaussian_noise_multiplier``). User-level: the unit is the client's whole data,
    one release per round it takes part in; against a client whose data gives no update the shift is at
    most C, so each release is (C/σ = 1/z)-GDP and T of them √T/z-GDP (C cancels; it is only checked).
    Two readings: ``compositions`` = 1, what one round's update promises (the attack of one round; a
    proven bound on it when that round is the client's first participation, since a later round's model
    carries its earlier updates), and ``compositions`` = the rounds the remembering server kept.

    Returns the tightest of Φ(Φ⁻¹(κ) + μ) ("gdp") and e^ε κ + δ at δ = ``target_delta`` with the exact ε
    of the same mechanism ("rero-eps-delta"); the first always wins for a Gaussian, the second is kept to
    show what the (ε, δ) reading promises. ValueError for a bad argument."""
    if not clip_norm > 0:
        raise ValueError(f"local_dp_rero_bound needs clip_norm > 0, got {clip_norm}")
    if compositions < 1:
        raise ValueError(f"local_dp_rero_bound needs compositions >= 1 (the releases seen), got {compositions}")
    kappa = _check_kappa(kappa)
    mu = gaussian_mu(gaussian_noise_multiplier(epsilon, delta), compositions)
    spent = gaussian_epsilon(mu, target_delta)
    gdp = rero_bound_gaussian(kappa, mu=mu)
    eps_delta = rero_bound_eps_delta(spent, target_delta, kappa)
    bound, name = (gdp, "gdp") if gdp <= eps_delta else (eps_delta, "rero-eps-delta")
    return ReroBound(bound, name, bound >= 1, kappa, int(compositions), mu, spent, target_delta, gdp, eps_delta)


def check_bound(measured_low: float, bound: ReroBound | float) -> str | None:
    """The alarm when a measurement breaks DP's promise: an error message when ``measured_low`` (the
    lower end of the measured success rate's interval, a fraction: the verdict's ``recovered_low / k``)
    exceeds a non-vacuous ``bound`` (a ReroBound or a bare fraction), else None.

    It returns the message (and logs it at ERROR) rather than raise, so that a study prints it beside
    the row and goes on: the caller must print it. Either the accounting is wrong (the noise added is
    not the noise accounted for) or κ is too low (a better update-free guess exists than the verdict's).
    ValueError for a measured_low outside [0, 1]."""
    if not 0 <= measured_low <= 1:
        raise ValueError(f"check_bound: measured_low must be a fraction in [0, 1], got {measured_low}")
    value, name = (bound.bound, bound.name) if isinstance(bound, ReroBound) else (float(bound), "bound")
    if value >= 1 or measured_low <= value:
        return None
    message = (
        f"accounting bug? the measured success rate's lower end {measured_low:.4f} exceeds DP's promised "
        f"{name} bound {value:.4f}: the noise sent is not the noise accounted for, or kappa is too low "
        f"(a better update-free guess exists)"
    )
    log.error(message)
    return message
