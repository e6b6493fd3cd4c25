"""zCDP to (ε, δ) conversions reproduce the Census certificates and never beat the loose bound."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from censusdp_spark.privacy import (
    approx_dp_to_zcdp,
    bounded_range_epsilon,
    bun_steinke_epsilon,
    zcdp_to_approx_dp,
)

PERSONS_RHO = Fraction(293764, 114921)
UNITS_RHO = Fraction(11417641, 152349649)
DELTA = 1e-10


def cks_objective(rho: float, delta: float, alpha: float) -> float:
    return rho * alpha + (
        math.log(1 / delta) + (alpha - 1) * math.log(1 - 1 / alpha) - math.log(alpha)
    ) / (alpha - 1)


def grid() -> list[tuple[float, float]]:
    rhos = np.concatenate([np.logspace(-6, 3, 19), np.random.default_rng(0).uniform(0, 20, 20)])
    deltas = [1e-3, 1e-6, 1e-10, 1e-15, 1e-30]
    return [(float(rho), delta) for rho in rhos for delta in deltas]


@pytest.mark.parametrize(
    "rho, tight, printed, loose",
    [(PERSONS_RHO, 17.1436, "17.14", 17.90), (UNITS_RHO, 2.4747, "2.475", 2.70)],
    ids=["persons", "units"],
)
def test_certificate_figures(rho, tight, printed, loose):
    assert zcdp_to_approx_dp(rho, DELTA) == pytest.approx(tight, abs=5e-5)
    assert f"{zcdp_to_approx_dp(rho, DELTA):.4g}" == printed
    assert round(bun_steinke_epsilon(rho, DELTA), 2) == loose


def test_both_files_together():
    assert round(zcdp_to_approx_dp(PERSONS_RHO + UNITS_RHO, DELTA), 2) == 17.44


def test_tight_conversion_is_never_looser_than_bun_steinke():
    for rho, delta in grid():
        assert zcdp_to_approx_dp(rho, delta) <= bun_steinke_epsilon(rho, delta) * (1 + 1e-12)


def test_tight_conversion_is_the_infimum_over_alpha():
    alphas = 1 + np.logspace(-5, 7, 20_001)
    for rho, delta in grid():
        on_grid = min(cks_objective(rho, delta, float(alpha)) for alpha in alphas[::50])
        found = zcdp_to_approx_dp(rho, delta)
        assert found <= max(on_grid, 0.0) + 1e-9 * max(1.0, on_grid)
    for rho, delta in [(2.5, 1e-10), (0.07, 1e-10), (1e-4, 1e-6)]:
        dense = min(cks_objective(rho, delta, float(alpha)) for alpha in alphas)
        assert zcdp_to_approx_dp(rho, delta) == pytest.approx(dense, rel=1e-6)


def test_inverse_returns_the_largest_rho_within_epsilon():
    for rho, delta in grid():
        epsilon = zcdp_to_approx_dp(rho, delta)
        if epsilon == 0:
            continue
        inverse = approx_dp_to_zcdp(epsilon, delta)
        assert inverse == pytest.approx(rho, rel=1e-9)
        assert zcdp_to_approx_dp(inverse, delta) <= epsilon
        assert zcdp_to_approx_dp(inverse * (1 + 1e-9), delta) > epsilon


def test_epsilon_grows_with_rho_and_shrinks_with_delta():
    rhos = np.logspace(-4, 2, 50)
    epsilons = [zcdp_to_approx_dp(float(rho), DELTA) for rho in rhos]
    assert all(a < b for a, b in zip(epsilons, epsilons[1:], strict=False))
    assert zcdp_to_approx_dp(1, 1e-6) < zcdp_to_approx_dp(1, 1e-12)


def test_zero_rho_is_zero_epsilon():
    assert zcdp_to_approx_dp(0, DELTA) == 0.0
    assert bun_steinke_epsilon(0, DELTA) == 0.0


@pytest.mark.parametrize(
    "rho, delta", [(-0.1, 1e-10), (1, 0.0), (1, 1.0), (1, -1e-3), (math.nan, 1e-10)]
)
def test_bad_inputs_are_refused_naming_them(rho, delta):
    for convert in (zcdp_to_approx_dp, bun_steinke_epsilon):
        with pytest.raises(ValueError, match="rho|delta"):
            convert(rho, delta)


def test_inverse_refuses_negative_epsilon():
    with pytest.raises(ValueError, match="epsilon must be non-negative, got -1"):
        approx_dp_to_zcdp(-1, DELTA)


@pytest.mark.parametrize(
    "rho",
    [Fraction(1, 8), Fraction(2, 455), Fraction(1, 3), Fraction(10**12), Fraction(0)],
    ids=str,
)
def test_bounded_range_epsilon_is_the_largest_dyadic_epsilon_within_rho(rho):
    """ε²/8 ≤ ρ always (never over-claim), and the next multiple of 2⁻⁶⁴ would exceed ρ."""
    epsilon = bounded_range_epsilon(rho)
    assert epsilon.denominator <= 2**64 and (2**64 % epsilon.denominator) == 0
    assert epsilon**2 / 8 <= rho
    assert (epsilon + Fraction(1, 2**64)) ** 2 / 8 > rho
    assert float(epsilon) == pytest.approx(math.sqrt(8 * rho), rel=1e-15, abs=1e-18)


def test_bounded_range_epsilon_is_exact_when_the_root_is_rational():
    assert bounded_range_epsilon(Fraction(1, 8)) == 1
    assert bounded_range_epsilon(Fraction(9, 32)) == Fraction(3, 2)


def test_bounded_range_epsilon_refuses_floats_and_negative_rho():
    with pytest.raises(TypeError):
        bounded_range_epsilon(0.125)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        bounded_range_epsilon(Fraction(-1, 8))
