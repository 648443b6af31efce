"""The verdict's statistics, without torch (the report and analysis/ use them): exact binomial
intervals and the one-sided test a control must pass (scipy.stats.binomtest)."""

from __future__ import annotations

from scipy.stats import binomtest

__all__ = ["CONFIDENCE", "interval", "exceeds_chance"]

CONFIDENCE = 0.95  # the intervals' level


def interval(count: int, n: int, level: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``level`` interval of a rate seen ``count`` times in ``n`` trials,
    as fractions in [0, 1] (scipy.stats.binomtest). ValueError for n < 1 or count outside [0, n]."""
    if n < 1 or not 0 <= count <= n:
        raise ValueError(f"interval: needs 0 <= count <= n and n >= 1, got {count} of {n}")
    ci = binomtest(int(count), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def exceeds_chance(count: int, n: int, chance: float, alpha: float = 0.01) -> bool:
    """True when ``count`` of ``n`` images singled out is more than ``chance`` (a rate in (0, 1)) can
    explain: a one-sided exact binomial test at level ``alpha``. A control (another client's
    reconstructions, update-free outputs) must not exceed its chance; a leak makes it."""
    if not 0 < chance < 1:
        raise ValueError(f"exceeds_chance: chance must be in (0, 1), got {chance}")
    return bool(binomtest(int(count), int(n), float(chance), alternative="greater").pvalue < alpha)
