"""DP's promised bound on reconstruction (fl_attack.privacy.rero), against the formulas written out here
with scipy and math only, against dp-accounting's PLD ε for the same Gaussian, and on real FEMNIST
images sent through Flower's own LocalDpMod noise, where the best attack must stay under the bound
and, on two antipodal images, meets it.

The formulas (module docstring of fl_attack.privacy.rero): (ε, δ)-DP: min(1, e^ε κ + δ) (Balle,
Cherubin & Hayes 2022); μ-GDP: Φ(Φ⁻¹(κ) + μ), μ = √T/z for T Gaussian releases of noise multiplier z
(Kaissis et al. 2023, Hayes et al. 2023; Dong, Roth & Su 2022, Def. 2.6, Thm. 2.7, Cor. 3.3);
δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2) (Dong, Roth & Su, Cor. 2.13).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from scipy.optimize import brentq
from scipy.stats import binom, binomtest, norm

from fl_attack.paths import asset
from fl_attack.privacy import (
    ReroBound,
    check_bound,
    kappa_upper,
    local_dp_rero_bound,
    rero_bound_eps_delta,
    rero_bound_gaussian,
)

DELTA = 1e-5


def z_of(epsilon: float, delta: float) -> float:
    """LocalDpMod's noise multiplier σ/C, as flwr's add_localdp_gaussian_noise_to_params computes σ."""
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def exact_epsilon(mu: float, delta: float) -> float:
    """The ε at which δ(ε) of μ-GDP equals delta, solved here."""

    def excess(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return brentq(excess, 0.0, mu * mu / 2 + 10 * mu, xtol=1e-13)


# --- the formulas ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "epsilon, delta, kappa",
    [(0.5, 1e-5, 0.0894), (1.0, 1e-5, 0.05), (2.0, 1e-3, 0.01), (3.0, 1e-5, 0.001), (0.0, 0.0, 0.3)],
)
def test_the_eps_delta_bound_is_e_eps_kappa_plus_delta(epsilon, delta, kappa):
    assert rero_bound_eps_delta(epsilon, delta, kappa) == pytest.approx(min(1.0, math.exp(epsilon) * kappa + delta))


def test_the_eps_delta_bound_saturates_without_overflow():
    assert rero_bound_eps_delta(5.0, 1e-5, 0.1) == 1.0  # e^5 * 0.1 = 14.8
    assert rero_bound_eps_delta(5000.0, 1e-5, 1e-9) == 1.0  # e^5000 is no float
    assert rero_bound_eps_delta(5000.0, 1e-5, 0.0) == 1e-5  # a guess that never succeeds: only δ is left


@pytest.mark.parametrize("mu, kappa", [(0.2, 0.0894), (1.0, 0.0894), (2.064, 0.0894), (0.5, 0.5), (3.0, 0.001)])
def test_the_gdp_bound_is_phi_of_phi_inverse_kappa_plus_mu(mu, kappa):
    assert rero_bound_gaussian(kappa, mu=mu) == pytest.approx(norm.cdf(norm.ppf(kappa) + mu), rel=1e-12)


@pytest.mark.parametrize("z, rounds", [(4.845, 1), (0.4845, 1), (0.4845, 10), (2.0, 7)])
def test_the_gdp_bound_composes_as_sqrt_rounds_over_z(z, rounds):
    expected = norm.cdf(norm.ppf(0.0894) + math.sqrt(rounds) / z)
    assert rero_bound_gaussian(0.0894, noise_multiplier=z, compositions=rounds) == pytest.approx(expected, rel=1e-12)


def test_the_gdp_bound_at_its_ends():
    assert rero_bound_gaussian(0.2, mu=0.0) == 0.2  # no release: the guess is all there is
    assert rero_bound_gaussian(0.2, noise_multiplier=0.0) == 1.0  # no noise
    assert rero_bound_gaussian(0.0, mu=3.0) == 0.0 and rero_bound_gaussian(1.0, mu=3.0) == 1.0


def test_kappa_is_the_exact_one_sided_upper_bound():
    assert kappa_upper(0, 32) == pytest.approx(1 - 0.05 ** (1 / 32), rel=1e-12)  # an observed 0 is not 0
    assert kappa_upper(0, 32) > 0.089
    for recovered, k in [(1, 32), (3, 16), (10, 48), (31, 32)]:
        upper = kappa_upper(recovered, k)
        assert binom.cdf(recovered, k, upper) == pytest.approx(0.05, rel=1e-9)  # the Clopper-Pearson end
        assert upper > recovered / k
    assert kappa_upper(32, 32) == 1.0
    assert kappa_upper(0, 32, confidence=0.99) == pytest.approx(1 - 0.01 ** (1 / 32), rel=1e-12)


# --- the properties -----------------------------------------------------------------------------------
def test_the_bounds_rise_with_epsilon_kappa_and_rounds():
    kappas = [0.001, 0.01, 0.0894, 0.2, 0.5]
    epsilons = [0.25, 0.5, 1.0, 2.0, 4.0, 10.0]
    for kappa in kappas:
        gdp = [
            local_dp_rero_bound(clip_norm=0.5, epsilon=e, delta=DELTA, compositions=1, kappa=kappa).gdp
            for e in epsilons
        ]
        eps_delta = [rero_bound_eps_delta(e, DELTA, kappa) for e in epsilons]
        assert all(a < b for a, b in zip(gdp, gdp[1:]))
        assert all(a <= b for a, b in zip(eps_delta, eps_delta[1:]))
    for epsilon in epsilons[:4]:
        by_kappa = [rero_bound_gaussian(k, noise_multiplier=z_of(epsilon, DELTA)) for k in kappas]
        assert all(a < b for a, b in zip(by_kappa, by_kappa[1:]))
        assert all(a < b for a, b in zip(kappas, by_kappa))  # the release always helps somewhat
    by_rounds = [rero_bound_gaussian(0.0894, noise_multiplier=4.845, compositions=t) for t in (1, 2, 5, 10, 50)]
    assert all(a < b for a, b in zip(by_rounds, by_rounds[1:]))


@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_the_gdp_bound_is_never_above_the_eps_delta_bound_of_the_same_gaussian(delta):
    # The same Gaussian mechanism (μ-GDP) is (ε, δ)-DP for ε = exact_epsilon(μ, δ) (Dong, Roth & Su,
    # Cor. 2.13): at that δ and ε, Φ(Φ⁻¹(κ) + μ) ≤ e^ε κ + δ, for every κ and μ.
    for mu in (0.1, 0.3, 1.0, 2.0, 4.0):
        epsilon = exact_epsilon(mu, delta)
        for kappa in (1e-4, 0.001, 0.01, 0.0894, 0.3, 0.9):
            assert norm.cdf(norm.ppf(kappa) + mu) <= min(1.0, math.exp(epsilon) * kappa + delta) + 1e-12
            assert rero_bound_gaussian(kappa, mu=mu) <= rero_bound_eps_delta(epsilon, delta, kappa) + 1e-12


@pytest.mark.parametrize("epsilon, rounds", [(1.0, 1), (10.0, 1), (10.0, 10), (2.0, 5)])
def test_the_local_dp_bound_uses_the_mechanisms_exact_epsilon_and_picks_the_tightest(epsilon, rounds):
    z = z_of(epsilon, DELTA)
    kappa = 1 - 0.05 ** (1 / 32)
    got = local_dp_rero_bound(clip_norm=0.05, epsilon=epsilon, delta=DELTA, compositions=rounds, kappa=kappa)
    mu = math.sqrt(rounds) / z
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_event.GaussianDpEvent(z), rounds)
    assert got.mu == pytest.approx(mu, rel=1e-12)
    assert got.epsilon == pytest.approx(pld.get_epsilon(DELTA), rel=1e-5)  # dp-accounting's PLD, told the same
    assert got.epsilon == pytest.approx(exact_epsilon(mu, DELTA), rel=1e-9)
    assert got.gdp == pytest.approx(norm.cdf(norm.ppf(kappa) + mu), rel=1e-12)
    assert got.eps_delta == pytest.approx(min(1.0, math.exp(got.epsilon) * kappa + DELTA), rel=1e-12)
    assert (got.name, got.bound) == ("gdp", got.gdp) and got.delta == DELTA and got.compositions == rounds
    assert got.vacuous == (got.bound >= 1)
    # C cancels (μ = C/σ = 1/z)
    assert local_dp_rero_bound(clip_norm=5.0, epsilon=epsilon, delta=DELTA, compositions=rounds, kappa=kappa) == got


def test_the_bound_is_vacuous_at_large_epsilon_and_not_at_small():
    kappa = kappa_upper(0, 32)
    for epsilon in (100.0, 1e3, 1e4):  # per-round settings of the frontier and the 2026-12-02 study
        got = local_dp_rero_bound(clip_norm=0.5, epsilon=epsilon, delta=DELTA, compositions=1, kappa=kappa)
        assert got.vacuous and got.bound == 1.0
    one = local_dp_rero_bound(clip_norm=0.5, epsilon=1.0, delta=DELTA, compositions=1, kappa=kappa)
    assert not one.vacuous and one.bound < 0.13


# --- the loud check -----------------------------------------------------------------------------------
def test_check_bound_names_the_accounting_when_a_measurement_breaks_the_promise(caplog):
    bound = local_dp_rero_bound(clip_norm=0.5, epsilon=2.0, delta=DELTA, compositions=1, kappa=kappa_upper(0, 32))
    assert check_bound(bound.bound - 0.01, bound) is None
    assert check_bound(bound.bound, bound) is None  # at the bound is no breach
    with caplog.at_level(logging.ERROR, logger="fl_attack.privacy.rero"):
        message = check_bound(bound.bound + 0.01, bound)
    assert message.startswith("accounting bug?") and "gdp bound" in message
    assert message in caplog.text
    assert "accounting bug?" in check_bound(0.5, 0.3)
    assert check_bound(1.0, 1.0) is None  # a vacuous bound promises nothing
    vacuous = local_dp_rero_bound(clip_norm=0.5, epsilon=100.0, delta=DELTA, compositions=1, kappa=0.01)
    assert check_bound(1.0, vacuous) is None


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kappa_upper(3, 2), "kappa_upper needs 0 <= recovered <= k"),
        (lambda: kappa_upper(0, 0), "kappa_upper needs 0 <= recovered <= k"),
        (lambda: rero_bound_eps_delta(1.0, 1e-5, 1.5), "kappa .* must be in \\[0, 1\\]"),
        (lambda: rero_bound_eps_delta(-1.0, 1e-5, 0.1), "needs epsilon >= 0"),
        (lambda: rero_bound_gaussian(0.1), "exactly one of mu and noise_multiplier"),
        (lambda: rero_bound_gaussian(0.1, mu=1.0, noise_multiplier=1.0), "exactly one of mu and noise_multiplier"),
        (lambda: rero_bound_gaussian(0.1, mu=-1.0), "needs mu >= 0"),
        (lambda: rero_bound_gaussian(0.1, noise_multiplier=-1.0), "gaussian_mu needs"),
        (
            lambda: local_dp_rero_bound(clip_norm=0.5, epsilon=1, delta=DELTA, compositions=0, kappa=0.1),
            "compositions >= 1",
        ),
        (lambda: local_dp_rero_bound(clip_norm=0, epsilon=1, delta=DELTA, compositions=1, kappa=0.1), "clip_norm > 0"),
        (lambda: check_bound(3.0, 0.5), "measured_low must be a fraction"),
    ],
)
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- on real images, through Flower's own LocalDpMod noise -----------------------------------------------
def flower_releases(clean: np.ndarray, clip_norm: float, epsilon: float, delta: float, seed: int) -> np.ndarray:
    """clean (N, d) updates, each already within norm C, noised by Flower's LocalDpMod noise function
    (flwr.supercore.differential_privacy.add_localdp_gaussian_noise_to_params, sensitivity C), which
    draws from numpy's global generator: seeded here and restored."""
    from flwr.supercore.differential_privacy import add_localdp_gaussian_noise_to_params

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        noised = add_localdp_gaussian_noise_to_params(ndarrays_to_parameters([clean]), clip_norm, epsilon, delta)
    finally:
        np.random.set_state(state)
    return parameters_to_ndarrays(noised)[0]


def femnist_ink(count: int) -> np.ndarray:
    """(count, 784) float64 ink (1 - pixel/255) of the bundled sample's first images of distinct classes."""
    data = np.load(asset("femnist_sample.npz"), allow_pickle=False)
    _, first = np.unique(data["labels"], return_index=True)
    images = data["images"][np.sort(first)[:count]]
    return 1.0 - images.reshape(count, -1).astype(np.float64) / 255.0


def best_attack_success(candidates: np.ndarray, epsilon: float, trials: int, seed: int) -> tuple[int, int]:
    """A client holds one of ``candidates`` (uniform prior, so the best guess succeeds 1/len), sends it
    (within norm C) through Flower's LocalDpMod noise at ``epsilon``; the Bayes-optimal attacker picks
    the nearest candidate. Returns (successes, trials)."""
    rng = np.random.default_rng(seed)
    secret = rng.integers(len(candidates), size=trials)
    releases = flower_releases(candidates[secret], CLIP, epsilon, DELTA, seed)
    distances = (candidates**2).sum(1)[None, :] - 2 * releases @ candidates.T  # ‖y - c‖² less ‖y‖²
    return int((distances.argmin(1) == secret).sum()), trials


CLIP = 0.5
EPSILON = z_of(1.0, DELTA)  # LocalDpMod's ε for z = 1: μ = 1 per round


def test_the_best_attack_on_real_images_stays_under_the_bound_and_a_wrong_noise_breaks_it():
    ink = femnist_ink(4)
    candidates = CLIP * ink / np.linalg.norm(ink, axis=1, keepdims=True)  # clipped: each exactly at norm C
    bound = local_dp_rero_bound(clip_norm=CLIP, epsilon=EPSILON, delta=DELTA, compositions=1, kappa=0.25)
    assert bound.bound == pytest.approx(norm.cdf(norm.ppf(0.25) + 1.0))  # 0.628
    hits, n = best_attack_success(candidates, EPSILON, trials=4000, seed=0)
    low = binomtest(hits, n).proportion_ci(0.95, method="exact").low
    assert 0.25 < hits / n and check_bound(low, bound) is None  # the release helps, within the promise
    # The accounting's fault: the client sends a fifth of the noise the ledger assumes (ε five times larger)
    hits, n = best_attack_success(candidates, 5 * EPSILON, trials=4000, seed=1)
    low = binomtest(hits, n).proportion_ci(0.95, method="exact").low
    assert (check_bound(low, bound) or "").startswith("accounting bug?")


def test_the_bound_is_met_by_the_best_attack_on_two_antipodal_images():
    # A client's update is +v or -v (v a real image at norm C): the nearest-candidate attack succeeds
    # with Φ(C/σ) = Φ(μ), and the bound at κ = 1/2 is Φ(Φ⁻¹(1/2) + μ) = Φ(μ): sensitivity C is the
    # right reading and the GDP bound is tight here.
    v = femnist_ink(1)[0]
    v = CLIP * v / np.linalg.norm(v)
    bound = local_dp_rero_bound(clip_norm=CLIP, epsilon=EPSILON, delta=DELTA, compositions=1, kappa=0.5)
    hits, n = best_attack_success(np.stack([v, -v]), EPSILON, trials=20000, seed=2)
    ci = binomtest(hits, n).proportion_ci(0.99, method="exact")
    assert ci.low <= bound.bound <= ci.high
    assert isinstance(bound, ReroBound) and bound.bound == pytest.approx(norm.cdf(1.0))
