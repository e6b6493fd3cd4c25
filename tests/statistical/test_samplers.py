"""The exact samplers follow their laws, and the same tests reject a scale 30% off.

Goodness of fit is a χ² test against the exact pmf, with adjacent bins merged until each expects
at least 5 draws (tails pooled into the end bins). A test passes at p > 1e-6 and its power check
needs p < 1e-6 for draws made at σ 30% too large or too small.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from censusdp_spark.privacy import (
    bernoulli_exp_minus,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_gaussian_variance,
    discrete_laplace,
    exponential_mechanism,
    keyed_rng,
    samplers,
)

THRESHOLD = 1e-6
TEST_SECRET = bytes(range(32))
PRODUCTION_STATE_TOTAL = Fraction(114921 * 4099 * 4097, 293764 * 1440 * 3773)
PRODUCTION_BLOCK_TOTAL = Fraction(114921 * 4099 * 4097, 293764 * 165 * 5)
GAUSSIAN_CASES = [Fraction(1, 2), Fraction(1), Fraction(101, 10), Fraction(7956), Fraction(10**6)]
LAPLACE_CASES = [Fraction(1), Fraction(5, 2), Fraction(20)]
TOO_LARGE, TOO_SMALL = Fraction(169, 100), Fraction(49, 100)  # σ² factors for σ ± 30%


def rng_for(*key: str | int) -> np.random.Generator:
    return keyed_rng(TEST_SECRET, "tests/samplers", *key)


def gaussian_law(sigma2: Fraction) -> tuple[np.ndarray, np.ndarray]:
    half_width = math.ceil(12 * math.sqrt(sigma2)) + 5  # tails beyond hold < e⁻⁷²
    support = np.arange(-half_width, half_width + 1)
    return support, discrete_gaussian_pmf(sigma2, support)


def laplace_law(scale: Fraction) -> tuple[np.ndarray, np.ndarray]:
    half_width = math.ceil(60 * scale) + 5
    support = np.arange(-half_width, half_width + 1)
    ratio = math.exp(-1 / scale)
    return support, (1 - ratio) / (1 + ratio) * ratio ** np.abs(support)


def chi_square_pvalue(draws: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """χ² p-value of ``draws`` against ``pmf`` on a contiguous support; tails join the end bins.

    Cells are first summed in blocks so that at most 20 000 remain (only for very wide laws), then
    merged left to right until each bin expects at least 5 draws.
    """
    observed = np.bincount(np.clip(draws, support[0], support[-1]) - support[0], minlength=pmf.size)
    expected = draws.size * pmf / pmf.sum()
    starts = np.arange(0, pmf.size, max(1, pmf.size // 20_000))
    bins_observed, bins_expected = [0.0], [0.0]
    for count, mean in zip(
        np.add.reduceat(observed, starts), np.add.reduceat(expected, starts), strict=True
    ):
        if bins_expected[-1] >= 5:
            bins_observed.append(0.0)
            bins_expected.append(0.0)
        bins_observed[-1] += count
        bins_expected[-1] += mean
    if len(bins_expected) > 1 and bins_expected[-1] < 5:
        bins_observed[-2] += bins_observed.pop()
        bins_expected[-2] += bins_expected.pop()
    obs, exp = np.array(bins_observed), np.array(bins_expected)
    statistic = float(np.sum((obs - exp) ** 2 / exp))
    return float(stats.chi2.sf(statistic, obs.size - 1))


def assert_fits(draws: np.ndarray, law: tuple[np.ndarray, np.ndarray]) -> None:
    p_value = chi_square_pvalue(draws, *law)
    assert p_value > THRESHOLD, f"draws do not fit the law: p = {p_value:.3g}"


def assert_rejects(draws: np.ndarray, law: tuple[np.ndarray, np.ndarray]) -> None:
    p_value = chi_square_pvalue(draws, *law)
    assert p_value < THRESHOLD, f"test failed to reject a wrong scale: p = {p_value:.3g}"


def assert_variance_matches(draws: np.ndarray, law: tuple[np.ndarray, np.ndarray]) -> None:
    support, pmf = law
    variance = float(np.sum(support.astype(float) ** 2 * pmf))
    fourth = float(np.sum(support.astype(float) ** 4 * pmf))
    standard_error = math.sqrt((fourth - variance**2) / draws.size)
    assert abs(float(np.mean(draws.astype(float) ** 2)) - variance) < 5 * standard_error


# --- goodness of fit and power ----------------------------------------------------------------


@pytest.mark.parametrize("sigma2", GAUSSIAN_CASES + [PRODUCTION_STATE_TOTAL], ids=str)
def test_discrete_gaussian_fits_exact_pmf_and_variance(sigma2):
    draws = discrete_gaussian(sigma2, 200_000, rng_for("fit", str(sigma2)))
    assert_fits(draws, gaussian_law(sigma2))
    assert_variance_matches(draws, gaussian_law(sigma2))


@pytest.mark.parametrize("sigma2", [Fraction(1, 2), Fraction(101, 10), Fraction(7956)], ids=str)
@pytest.mark.parametrize("factor", [TOO_LARGE, TOO_SMALL], ids=["sigma+30%", "sigma-30%"])
def test_gaussian_fit_rejects_a_scale_thirty_percent_off(sigma2, factor):
    draws = discrete_gaussian(sigma2 * factor, 20_000, rng_for("power", str(sigma2), str(factor)))
    assert_rejects(draws, gaussian_law(sigma2))


@pytest.mark.parametrize("scale", LAPLACE_CASES, ids=str)
def test_discrete_laplace_fits_exact_pmf_and_variance(scale):
    draws = discrete_laplace(scale, 200_000, rng_for("laplace fit", str(scale)))
    assert_fits(draws, laplace_law(scale))
    assert_variance_matches(draws, laplace_law(scale))


@pytest.mark.parametrize("scale", LAPLACE_CASES, ids=str)
@pytest.mark.parametrize("factor", [Fraction(13, 10), Fraction(7, 10)], ids=["+30%", "-30%"])
def test_laplace_fit_rejects_a_scale_thirty_percent_off(scale, factor):
    draws = discrete_laplace(
        scale * factor, 20_000, rng_for("laplace power", str(scale), str(factor))
    )
    assert_rejects(draws, laplace_law(scale))


@pytest.mark.slow
@pytest.mark.parametrize(
    "sigma2", GAUSSIAN_CASES + [PRODUCTION_STATE_TOTAL, PRODUCTION_BLOCK_TOTAL], ids=str
)
def test_discrete_gaussian_fits_with_a_million_draws(sigma2):
    law = gaussian_law(sigma2)
    draws = discrete_gaussian(sigma2, 1_000_000, rng_for("big fit", str(sigma2)))
    assert_fits(draws, law)
    assert_variance_matches(draws, law)
    for factor in (TOO_LARGE, TOO_SMALL):
        wrong = discrete_gaussian(
            sigma2 * factor, 1_000_000, rng_for("big power", str(sigma2), str(factor))
        )
        assert_rejects(wrong, law)


@pytest.mark.slow
@pytest.mark.parametrize("scale", LAPLACE_CASES, ids=str)
def test_discrete_laplace_fits_with_a_million_draws(scale):
    law = laplace_law(scale)
    draws = discrete_laplace(scale, 1_000_000, rng_for("big laplace fit", str(scale)))
    assert_fits(draws, law)
    assert_variance_matches(draws, law)
    for factor in (Fraction(13, 10), Fraction(7, 10)):
        wrong = discrete_laplace(
            scale * factor, 1_000_000, rng_for("big laplace power", str(scale), str(factor))
        )
        assert_rejects(wrong, law)


# --- the rarely taken exact paths --------------------------------------------------------------


def test_production_budget_exponents_need_big_integers():
    """The acceptance exponent's denominator 2·p·q·t² of a production σ² is far beyond int64."""
    p, q = PRODUCTION_BLOCK_TOTAL.numerator, PRODUCTION_BLOCK_TOTAL.denominator
    t = math.isqrt(p // q) + 1
    assert 2 * p * q * t * t > 2**75
    draws = discrete_gaussian(PRODUCTION_BLOCK_TOTAL, 200_000, rng_for("production block"))
    assert_fits(draws, gaussian_law(PRODUCTION_BLOCK_TOTAL))


def test_large_sigma_tabulates_only_the_distinct_magnitudes():
    """Magnitudes past the dense-table limit (σ = 10⁵ here) take the distinct-values path."""
    sigma2 = Fraction(10**10)
    draws = discrete_gaussian(sigma2, 20_000, rng_for("large sigma"))
    assert np.abs(draws).max() >= samplers._DENSE_TABLE_LIMIT
    assert_fits(draws, gaussian_law(sigma2))


def test_distinct_values_path_is_exact_for_small_sigma(monkeypatch):
    monkeypatch.setattr(samplers, "_DENSE_TABLE_LIMIT", 2)
    for sigma2 in (Fraction(101, 10), PRODUCTION_STATE_TOTAL):
        draws = discrete_gaussian(sigma2, 50_000, rng_for("distinct values", str(sigma2)))
        assert_fits(draws, gaussian_law(sigma2))


def test_samplers_stay_exact_in_bounded_batches(monkeypatch):
    """A call of more draws than ``_BATCH_DRAWS`` concatenates batches of at most that many."""
    monkeypatch.setattr(samplers, "_BATCH_DRAWS", 997)
    for sigma2 in (Fraction(101, 10), PRODUCTION_STATE_TOTAL):
        draws = discrete_gaussian(sigma2, 50_000, rng_for("bounded", str(sigma2)))
        assert_fits(draws, gaussian_law(sigma2))
        assert_variance_matches(draws, gaussian_law(sigma2))
    draws = discrete_laplace(Fraction(5, 2), 50_000, rng_for("bounded laplace"))
    assert_fits(draws, laplace_law(Fraction(5, 2)))
    wrong = discrete_gaussian(Fraction(101, 10) * TOO_LARGE, 50_000, rng_for("bounded power"))
    assert_rejects(wrong, gaussian_law(Fraction(101, 10)))


@pytest.mark.parametrize("digit_bits", [2, 4])
def test_samplers_stay_exact_when_most_draws_tie_on_the_first_digit(monkeypatch, digit_bits):
    """With 2- or 4-bit digits, ties (settled with Python integers) decide much of each draw."""
    monkeypatch.setattr(samplers, "_DIGIT_BITS", digit_bits)
    for sigma2 in (Fraction(101, 10), PRODUCTION_STATE_TOTAL):
        draws = discrete_gaussian(sigma2, 30_000, rng_for("ties", digit_bits, str(sigma2)))
        assert_fits(draws, gaussian_law(sigma2))
    draws = discrete_laplace(Fraction(5, 2), 30_000, rng_for("ties laplace", digit_bits))
    assert_fits(draws, laplace_law(Fraction(5, 2)))
    wrong = discrete_gaussian(
        Fraction(101, 10) * TOO_LARGE, 30_000, rng_for("ties power", digit_bits)
    )
    assert_rejects(wrong, gaussian_law(Fraction(101, 10)))


@pytest.mark.parametrize(
    "scale",
    [Fraction(2**50 + 1, 2**48), Fraction(2**62 - 1, 2**60)],
    ids=["numerator-past-2^47", "numerator-near-2^62"],
)
def test_laplace_with_huge_numerator_and_denominator_is_exact(scale):
    """Scales t/s with t ≥ 2**47 take the object-integer paths for digits and for U + t·V."""
    draws = discrete_laplace(scale, 50_000, rng_for("huge laplace", str(scale)))
    assert_fits(draws, laplace_law(scale))


def test_words_are_the_raw_stream_in_order_each_used_once():
    words = samplers._Words(rng_for("words"), 256)
    taken = np.concatenate([words.take(size) for size in (3, 1000, 1, 7, 5000)])
    raw = rng_for("words").bit_generator.random_raw(2000).view(np.uint16)
    assert np.array_equal(taken, raw[: taken.size])


@pytest.mark.parametrize("bound", [2, 3, 5040, 40_000, 1 << 16, 100_003])
def test_bounded_draws_are_uniform(bound):
    """40 000 redraws 39% of words: without the redraw, residues below 25 536 come twice as often."""
    draws = samplers._Words(rng_for("below", bound), 0).below(bound, 200_000)
    assert draws.min() >= 0 and draws.max() < bound
    bins = min(bound, 50)
    observed = np.bincount(draws.astype(np.int64) * bins // bound, minlength=bins)
    edges = -(-np.arange(bins + 1) * bound // bins)  # first value of each bin
    expected = draws.size * np.diff(edges) / bound
    assert stats.chisquare(observed, expected).pvalue > THRESHOLD


def test_coins_and_digits_are_fair():
    words = samplers._Words(rng_for("coins"), 0)
    coins = words.coins(1_000_000)
    assert abs(coins.mean() - 0.5) < 5 * 0.5 / 1000
    digits = words.digits(1_000_000).astype(np.int64)
    observed = np.bincount(digits >> 10, minlength=64)
    assert stats.chisquare(observed).pvalue > THRESHOLD


@pytest.mark.parametrize("top", [2, 3, 7])
def test_bernoulli_exp_minus_one_is_exact_with_any_radix_cut(top):
    """Small cuts send a sixth or a half of the draws down the K loop that finishes them."""
    words = samplers._Words(rng_for("radix", top), 400_000)
    draws = samplers._bernoulli_exp_minus_one(400_000, words, top=top)
    standard_error = math.sqrt(math.exp(-1) * (1 - math.exp(-1)) / draws.size)
    assert abs(draws.mean() - math.exp(-1)) < 5 * standard_error


def test_geometric_count_has_ratio_exp_minus_one():
    counts = samplers._geometric_exp_minus_one(200_000, samplers._Words(rng_for("geometric"), 0))
    support = np.arange(0, 60)
    pmf = (1 - math.exp(-1)) * np.exp(-support.astype(float))
    assert_fits(counts, (support, pmf))


# --- Bernoulli(exp(−γ)) and the exponential mechanism -----------------------------------------

BERNOULLI_GAMMAS = [Fraction(0), Fraction(1, 3), Fraction(5, 7), Fraction(1), Fraction(22, 7)]
BERNOULLI_GAMMAS += [Fraction(5, 2), Fraction(10**12 + 1, 10**11)]  # a big non-dyadic one


def bernoulli_frequencies(gammas, per_gamma: int, *key) -> np.ndarray:
    draws = bernoulli_exp_minus(np.repeat(np.array(gammas, dtype=object), per_gamma), rng_for(*key))
    return draws.reshape(len(gammas), per_gamma).mean(axis=1)


def test_bernoulli_exp_minus_has_frequency_exp_minus_gamma_and_would_catch_gamma_30_percent_off():
    n = 60_000
    freq = bernoulli_frequencies(BERNOULLI_GAMMAS, n, "bernoulli")
    target = np.exp(-np.array([float(g) for g in BERNOULLI_GAMMAS]))
    stderr = np.sqrt(target * (1 - target) / n) + 1e-12
    assert freq[0] == 1.0  # γ = 0 always succeeds
    assert np.all(np.abs(freq - target) < 5 * stderr)
    for wrong in (1.3, 0.7):
        off = np.exp(-wrong * np.array([float(g) for g in BERNOULLI_GAMMAS[1:5]]))
        assert np.all(np.abs(freq[1:5] - off) > 5 * stderr[1:5])


@pytest.mark.parametrize("digit_bits", [2, 4])
def test_bernoulli_exp_minus_stays_exact_when_most_draws_tie_on_the_first_digit(
    monkeypatch, digit_bits
):
    monkeypatch.setattr(samplers, "_DIGIT_BITS", digit_bits)
    gammas = [Fraction(1, 3), Fraction(5, 7), Fraction(22, 7)]
    n = 40_000
    freq = bernoulli_frequencies(gammas, n, "bernoulli ties", digit_bits)
    target = np.exp(-np.array([float(g) for g in gammas]))
    assert np.all(np.abs(freq - target) < 5 * np.sqrt(target * (1 - target) / n))


def exponential_law(scores, epsilon) -> np.ndarray:
    weights = np.exp(float(epsilon) * np.array([float(s) for s in scores]))
    return weights / weights.sum()


EM_SCORES = [Fraction(1, 3), Fraction(-2, 7), Fraction(0), Fraction(5, 3), Fraction(3, 2)]


def test_exponential_mechanism_fits_its_exact_law_and_rejects_epsilon_30_percent_off():
    """Sensitivity 1/2 with ε = 3/4: weights exp(3/4 · s / (2 · 1/2)) = exp(3s/4)."""
    rng = rng_for("exponential mechanism")
    n = 20_000
    picks = [
        exponential_mechanism(EM_SCORES, Fraction(3, 4), Fraction(1, 2), rng) for _ in range(n)
    ]
    observed = np.bincount(picks, minlength=len(EM_SCORES))
    right = exponential_law(EM_SCORES, Fraction(3, 4))
    assert stats.chisquare(observed, n * right).pvalue > THRESHOLD
    for factor in (1.3, 0.7):
        wrong = exponential_law(EM_SCORES, Fraction(3, 4) * Fraction(factor))
        assert stats.chisquare(observed, n * wrong).pvalue < THRESHOLD


def test_exponential_mechanism_with_one_score_and_with_a_huge_gap():
    rng = rng_for("exponential mechanism edges")
    assert exponential_mechanism([Fraction(7, 3)], 1, 1, rng) == 0
    # ε/(2Δ) = 50: the runner-up has probability about exp(−50), the first exp(−5·10⁷).
    picks = {
        exponential_mechanism([0, 10**6, 10**6 - 1], 10, Fraction(1, 10), rng) for _ in range(50)
    }
    assert picks == {1}


def test_exponential_mechanism_refuses_floats_and_empty_scores():
    rng = rng_for("exponential mechanism refusals")
    with pytest.raises(TypeError, match="Fraction"):
        exponential_mechanism([0.5, 1], 1, 1, rng)
    with pytest.raises(TypeError, match="Fraction"):
        exponential_mechanism([0, 1], 0.5, 1, rng)
    with pytest.raises(ValueError, match="at least one"):
        exponential_mechanism([], 1, 1, rng)
    with pytest.raises(ValueError, match="non-negative"):
        bernoulli_exp_minus([Fraction(-1, 2)], rng)


# --- the exact law ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma2", [Fraction(1, 3), Fraction(1), Fraction(5, 2), Fraction(101, 10)], ids=str
)
def test_pmf_and_variance_match_direct_summation(sigma2):
    xs = range(-400, 401)
    weights = [math.exp(-(x * x) / (2 * float(sigma2))) for x in xs]
    normaliser = math.fsum(weights)
    variance = math.fsum(x * x * w for x, w in zip(xs, weights, strict=True)) / normaliser
    pmf = discrete_gaussian_pmf(sigma2, np.arange(-3, 4))
    assert pmf == pytest.approx([weights[400 + x] / normaliser for x in range(-3, 4)], rel=1e-12)
    assert discrete_gaussian_variance(sigma2) == pytest.approx(variance, rel=1e-12)


def test_variance_is_below_sigma2_and_approaches_it():
    assert discrete_gaussian_variance(Fraction(1, 2)) < 0.5
    assert discrete_gaussian_variance(Fraction(10**6)) == pytest.approx(10**6, rel=1e-12)
    assert discrete_gaussian_pmf(Fraction(7956), np.arange(-4000, 4001)).sum() == pytest.approx(
        1, rel=1e-12
    )


# --- the interface ------------------------------------------------------------------------------


def test_draws_are_int64_arrays_of_the_requested_size():
    rng = rng_for("shape")
    for draws in (discrete_gaussian(3, 1001, rng), discrete_laplace(Fraction(7, 3), 1001, rng)):
        assert draws.dtype == np.int64 and draws.shape == (1001,)
    assert discrete_gaussian(Fraction(1, 2), 0, rng).shape == (0,)


def test_same_generator_state_gives_the_same_noise():
    first = discrete_gaussian(PRODUCTION_STATE_TOTAL, 5000, rng_for("repeat"))
    again = discrete_gaussian(PRODUCTION_STATE_TOTAL, 5000, rng_for("repeat"))
    assert np.array_equal(first, again)


@pytest.mark.parametrize("sampler", [discrete_gaussian, discrete_laplace])
@pytest.mark.parametrize("value", [1.5, np.float64(2.0)])
def test_a_float_scale_is_refused_with_a_pointer_to_fraction(sampler, value):
    with pytest.raises(TypeError, match=rf"{value}.*fractions\.Fraction"):
        sampler(value, 10, rng_for("float"))


@pytest.mark.parametrize("sampler", [discrete_gaussian, discrete_laplace])
@pytest.mark.parametrize("value", [0, -3, Fraction(-1, 2)])
def test_a_non_positive_scale_is_refused_naming_it(sampler, value):
    with pytest.raises(
        ValueError, match=f"must be positive, got {value!r}".replace("(", r"\(").replace(")", r"\)")
    ):
        sampler(value, 10, rng_for("negative"))


@pytest.mark.parametrize("value", [True, "3", None])
def test_other_scale_types_are_refused(value):
    with pytest.raises(TypeError, match="int or a fractions.Fraction"):
        discrete_gaussian(value, 10, rng_for("type"))


def test_a_negative_size_is_refused():
    with pytest.raises(ValueError, match="size must be non-negative, got -1"):
        discrete_gaussian(1, -1, rng_for("size"))
