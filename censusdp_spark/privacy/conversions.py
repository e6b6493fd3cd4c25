"""Conversions between ρ-zCDP and (ε, δ)-differential privacy.

Privacy claim
-------------
A ρ-zCDP mechanism is (ε, δ)-DP for every δ ∈ (0, 1) with

* ε = ρ + 2·√(ρ·ln(1/δ)) (Bun and Steinke 2016, Proposition 1.3): :func:`bun_steinke_epsilon`;
* ε = inf over α > 1 of αρ + (ln(1/δ) + (α−1)·ln(1 − 1/α) − ln α)/(α − 1) (Canonne, Kamath and
  Steinke 2020, Corollary 13): :func:`zcdp_to_approx_dp`, the figure on the Census certificates.

Every α > 1 gives a valid ε, so the numerical search below can only cost tightness, never
validity. The second bound is never above the first: the first is the minimum over α of
αρ + ln(1/δ)/(α − 1), and the second's objective adds two non-positive terms to it.
:func:`approx_dp_to_zcdp` is the inverse: the largest ρ whose tight ε at δ is within a target.

An ε-DP mechanism whose privacy loss has bounded range ε, such as the exponential mechanism, is
ε²/8-zCDP (Cesar and Rogers 2021, Lemma 3.2). :func:`bounded_range_epsilon` inverts that for an
exact sampler, which needs a rational ε: it returns the largest multiple of 2⁻⁶⁴ with
ε²/8 ≤ ρ, computed with integers only, so the ρ it is charged never understates what it spends.

Numerics: with a = α − 1 the derivative of the objective is ρ − (ln(1/δ) − ln(1 + a))/a², which
is negative below its only root and positive above it, and the root lies in
(0, √(ln(1/δ)/ρ)]. We find it with Brent's method and evaluate the objective there with log1p,
so results are float64-accurate (relative error about 1e-12).
"""

from __future__ import annotations

import math
from fractions import Fraction

Real = float | int | Fraction


def bun_steinke_epsilon(rho: Real, delta: float) -> float:
    """ε = ρ + 2√(ρ ln(1/δ)): the simple (loose) zCDP to (ε, δ)-DP conversion."""
    r, log_inverse_delta = _checked(rho, delta)
    return r + 2 * math.sqrt(r * log_inverse_delta)


def zcdp_to_approx_dp(rho: Real, delta: float) -> float:
    """The smallest ε that CKS20 Corollary 13 certifies for a ρ-zCDP mechanism at ``delta``."""
    r, log_inverse_delta = _checked(rho, delta)
    if r == 0:
        return 0.0
    a = _optimal_order_minus_one(r, log_inverse_delta)
    return max(0.0, _tight_epsilon(r, log_inverse_delta, a))


def approx_dp_to_zcdp(epsilon: Real, delta: float) -> float:
    """The largest ρ with ``zcdp_to_approx_dp(ρ, delta) ≤ epsilon``, by bisection on floats."""
    target = float(epsilon)
    if not target >= 0:
        raise ValueError(f"epsilon must be non-negative, got {epsilon!r}")
    _checked(0, delta)
    low, high = 0.0, max(target, 1.0)
    while zcdp_to_approx_dp(high, delta) <= target:
        low, high = high, 2 * high
    while True:
        middle = (low + high) / 2
        if middle in (low, high):
            return low
        if zcdp_to_approx_dp(middle, delta) <= target:
            low = middle
        else:
            high = middle


def bounded_range_epsilon(rho: Fraction | int, bits: int = 64) -> Fraction:
    """The largest ε = k/2**bits with ε²/8 ≤ ρ: the exponential mechanism's ε for ρ-zCDP.

    With x = ⌊8ρ·4**bits⌋ and k = isqrt(x): k² ≤ x ≤ 8ρ·4**bits, so (k/2**bits)²/8 ≤ ρ; and
    (k + 1)² ≥ x + 1 > 8ρ·4**bits, so ε falls short of √(8ρ) by less than 2**−bits.
    """
    if isinstance(rho, bool) or not isinstance(rho, int | Fraction):
        raise TypeError(f"rho must be an int or a fractions.Fraction, got {rho!r}")
    if rho < 0:
        raise ValueError(f"rho must be non-negative, got {rho!r}")
    scaled = Fraction(rho) * 8 * 4**bits
    return Fraction(math.isqrt(scaled.numerator // scaled.denominator), 2**bits)


def _checked(rho: Real, delta: float) -> tuple[float, float]:
    """(ρ, ln(1/δ)) as floats after checking ρ ≥ 0 and 0 < δ < 1."""
    r = float(rho)
    if not r >= 0:
        raise ValueError(f"rho must be non-negative, got {rho!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    return r, -math.log(delta)


def _optimal_order_minus_one(rho: float, log_inverse_delta: float) -> float:
    """The a = α − 1 > 0 where ρ·a² = ln(1/δ) − ln(1 + a), the objective's minimum."""

    def slope_sign(a: float) -> float:
        return rho * a * a - log_inverse_delta + math.log1p(a)

    # Imported here: a Spark worker that only draws noise loads the privacy core, not scipy.
    from scipy.optimize import brentq

    upper = math.sqrt(log_inverse_delta / rho)
    return float(brentq(slope_sign, 0.0, upper, xtol=1e-300, rtol=4 * 2.0**-52))


def _tight_epsilon(rho: float, log_inverse_delta: float, a: float) -> float:
    """αρ + (ln(1/δ) + (α−1)·ln(1 − 1/α) − ln α)/(α − 1) at α = 1 + a."""
    log_alpha = math.log1p(a)
    return rho * (1 + a) + (log_inverse_delta + a * (math.log(a) - log_alpha) - log_alpha) / a
