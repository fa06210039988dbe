"""Statistics for the sampling tests: an exact chi-square test without scipy."""

from __future__ import annotations

import math

import numpy as np


def chi_square_cdf(x: float, dof: int) -> float:
    """P(X <= x) for X ~ chi-square(dof): the regularized lower incomplete gamma P(dof/2, x/2), by its series."""
    if x <= 0:
        return 0.0
    s, z = dof / 2.0, x / 2.0
    term = total = 1.0 / s
    n = 0
    while term > total * 1e-17:  # terms decrease once n > z; the series converges for every z
        n += 1
        term *= z / (s + n)
        total += term
    return math.exp(s * math.log(z) - z - math.lgamma(s) + math.log(total))


def chi_square_quantile(dof: int, alpha: float) -> float:
    """The x with P(X > x) = alpha for X ~ chi-square(dof), by bisection on the exact CDF (no scipy needed)."""
    lo, hi = 0.0, float(dof) + 100.0 * math.sqrt(2.0 * dof) + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1.0 - chi_square_cdf(mid, dof) > alpha else (lo, mid)
    return (lo + hi) / 2


def chi_square_statistic(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; cells expecting < 5 draws are pooled into one."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


# Significance of each chi-square test: 1e-4. Inputs are derandomized (fixed seeds), so a
# test either always passes or always fails; with ~40 chi-square checks in this file the
# chance that a correct implementation fails one by bad luck is below 0.4%.
SIGNIFICANCE = 1e-4
