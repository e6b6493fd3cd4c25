"""Accounting and mechanisms of the synthetic-data methods: exact splits, exact noise on counts
calibrated to ρ, selection that follows the exponential mechanism's law, and runs fixed by the
secret."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from censusdp_spark.privacy import discrete_gaussian_variance, keyed_rng
from censusdp_spark.synth.adaptive import (
    SCORE_ROUNDING,
    BudgetSplitError,
    adaptive_measurements,
    exact_counts,
    gaussian_measure,
    gaussian_sigma,
    l2_sensitivity,
    normaliser,
    plan_budget,
    select_workload,
    selection_sensitivity,
)
from censusdp_spark.synth.workloads import (
    GROUP,
    INDIVIDUAL,
    Totals,
    make_workload,
    marginal_workloads,
    normalise,
)
from tests.helpers.synth import small_domain

SECRET = bytes(range(32))
TOTALS = Totals(households=1000, individuals=2500, family_individuals=2000)


def test_plan_splits_rho_exactly_and_equally_over_the_rounds():
    plan = plan_budget(Fraction(1, 7), 13, Fraction(2, 5))
    assert plan.initial == () and len(plan.rounds) == 13 and plan.total() == Fraction(1, 7)
    assert {r.rho_select for r in plan.rounds} == {Fraction(2, 455)}
    assert {r.rho_measure for r in plan.rounds} == {Fraction(3, 455)}
    epsilon = plan.rounds[0].epsilon_select
    assert isinstance(epsilon, Fraction) and epsilon**2 / 8 <= Fraction(2, 455)
    assert float(epsilon) == pytest.approx(math.sqrt(8 * 2 / 455), rel=1e-15)


@pytest.mark.parametrize(
    ("rho", "share"),
    [(0.1, Fraction(1, 2)), (Fraction(1, 10), 0.5), (Fraction(-1), Fraction(1, 2))],
)
def test_plans_refuse_floats_and_non_positive_budgets(rho, share):
    with pytest.raises(BudgetSplitError):
        plan_budget(rho, 4, share)


def test_sensitivities_follow_the_change_one_person_neighbour():
    domain = small_domain()
    group = make_workload(domain, GROUP, (0,), (1,))
    person = make_workload(domain, INDIVIDUAL, (0,), (1,))
    assert selection_sensitivity(TOTALS) == Fraction(1, 1000) + SCORE_ROUNDING
    assert (normaliser(group, TOTALS), normaliser(person, TOTALS)) == (1000, 2500)
    assert l2_sensitivity(group, TOTALS) == pytest.approx(math.sqrt(2) / 1000)
    assert l2_sensitivity(person, TOTALS) == pytest.approx(math.sqrt(2) / 2500)
    sigma = gaussian_sigma(group, TOTALS, Fraction(1, 50))
    assert l2_sensitivity(group, TOTALS) ** 2 / (2 * sigma**2) == pytest.approx(1 / 50)


def test_gaussian_noise_on_counts_has_variance_one_over_rho_and_30_percent_off_would_fail():
    """Counts 500 of N = 1000 at ρ = 1/100: the count noise is N_Z(0, 100), an integer."""
    rng = keyed_rng(SECRET, "test", "gaussian")
    noisy = gaussian_measure(np.full(40_000, 0.5), 1000, Fraction(1, 100), rng)
    noise = np.rint(noisy * 1000) - 500
    assert np.allclose(noisy * 1000, noise + 500, rtol=0, atol=1e-9)  # whole counts over N
    variance = discrete_gaussian_variance(Fraction(100))
    se = variance * math.sqrt(2 / noise.size)  # standard error of a sample variance
    assert abs(noise.var() - variance) < 4 * se
    assert abs(noise.var() - variance * 1.69) > 4 * se  # a σ 30% too large would be caught
    assert gaussian_measure(np.array([0.0, 1.0]), 10, Fraction(1, 10**4), rng).min() >= 0.0


def test_counts_are_recovered_exactly_and_non_counts_are_refused():
    counts = np.array([0, 1, 7, 333, 999_999, 1_000_003])
    n = 1_000_003
    assert np.array_equal(exact_counts(counts / np.float64(n), n), counts)
    big = 2**49 - 1
    assert exact_counts(np.array([(big - 2) / big]), big)[0] == big - 2
    with pytest.raises(ValueError, match="not integer counts"):
        exact_counts(np.array([0.3]), 7)
    with pytest.raises(ValueError, match="not integer counts"):
        exact_counts(np.array([8 / 7]), 7)


def test_selection_picks_the_worst_workload_at_large_epsilon_and_never_a_measured_one():
    scores = np.array([0.01, 0.05, 0.30, 0.29, -np.inf])
    # A gap of 0.01 at epsilon / (2 Delta) = 5000 leaves the runner-up a chance of about exp(-50).
    picks = [
        select_workload(scores, Fraction(10), Fraction(1, 1000), keyed_rng(SECRET, "em", i))
        for i in range(300)
    ]
    assert picks == [2] * 300


def test_selection_follows_its_exact_law_and_would_fail_at_an_epsilon_30_percent_off():
    """χ² of the selection counts against exp(ε·s/(2Δ)) with ε = 2, Δ = 1, float scores with a
    non-dyadic one and a measured (−inf) one."""
    scores = np.array([0.0, 1.0, -np.inf, 2.0, 0.1])
    finite = scores[np.isfinite(scores)]
    rng = keyed_rng(SECRET, "em", "law")
    n = 30_000
    counts = np.bincount(
        [select_workload(scores, Fraction(2), Fraction(1), rng) for _ in range(n)], minlength=5
    )
    assert counts[2] == 0
    observed = counts[np.isfinite(scores)]

    def pvalue(epsilon: float) -> float:
        law = np.exp(epsilon * finite / 2)
        return float(stats.chisquare(observed, n * law / law.sum()).pvalue)

    assert pvalue(2.0) > 1e-6
    assert pvalue(2.0 * 1.3) < 1e-6 and pvalue(2.0 * 0.7) < 1e-6


def test_selection_refuses_nan_scores_and_all_measured():
    rng = keyed_rng(SECRET, "em", "refusals")
    with pytest.raises(ValueError):
        select_workload(np.array([0.1, np.nan]), Fraction(1), Fraction(1), rng)
    with pytest.raises(ValueError):
        select_workload(np.array([-np.inf, -np.inf]), Fraction(1), Fraction(1), rng)


class _Frozen:
    """A synthesiser whose answers never change: isolates the mechanisms."""

    def __init__(self, n: int) -> None:
        self.n, self.fits = n, 0

    def answers(self, workloads):
        return np.zeros(workloads.n_queries)

    def fit(self, targets):
        self.fits += 1


def count_truth(candidates, seed: int) -> np.ndarray:
    """Normalised answers that are integer counts over N, as real answers are."""
    counts = np.random.default_rng(seed).integers(0, 200, candidates.n_queries)
    return normalise(counts, candidates, TOTALS)


def run(secret: bytes):
    domain = small_domain()
    candidates = marginal_workloads(domain, 2)
    truth = count_truth(candidates, 0)
    return adaptive_measurements(
        _Frozen(candidates.n_queries),
        candidates,
        truth,
        TOTALS,
        plan_budget(Fraction(1, 2), 5, Fraction(1, 2)),
        secret,
        "t",
    )


def test_the_same_secret_reproduces_selections_and_noise_and_another_does_not():
    a, b, c = run(SECRET), run(SECRET), run(bytes(32))
    assert [m.workload for m in a.measurements] == [m.workload for m in b.measurements]
    for x, y in zip(a.measurements, b.measurements, strict=True):
        np.testing.assert_array_equal(x.noisy, y.noisy)
    assert any(
        not np.array_equal(x.noisy, y.noisy)
        for x, y in zip(a.measurements, c.measurements, strict=True)
    )
    assert a.rho_spent() == Fraction(1, 2)
    assert len({m.workload for m in a.measurements}) == 5  # no workload is measured twice


class _Learner:
    """A synthesiser whose answers become its measurements: the scores change every round."""

    def __init__(self, candidates) -> None:
        self.candidates, self.state = candidates, {}

    def answers(self, workloads):
        return np.concatenate(
            [self.state.get(w, np.full(w.n_cells, 0.9)) for w in workloads.workloads]
        )

    def fit(self, targets):
        self.state = {t.workload: t.noisy for t in targets}


def test_initial_measurements_and_rounds_spend_rho_exactly_as_recorded():
    domain = small_domain()
    candidates = marginal_workloads(domain, 1) + marginal_workloads(domain, 3)
    initial = len(marginal_workloads(domain, 1))
    truth = count_truth(candidates, 1)
    plan = plan_budget(Fraction(1, 2), 6, Fraction(1, 2), initial)
    result = adaptive_measurements(
        _Learner(candidates), candidates, truth, TOTALS, plan, SECRET, "learner"
    )
    assert [m.round for m in result.measurements] == [0] * initial + [1, 2, 3, 4, 5, 6]
    assert result.rho_spent() == plan.total() == Fraction(1, 2)
    assert [m.workload for m in result.measurements[:initial]] == list(
        candidates.workloads[:initial]
    )
    assert all(m.rho_select == 0 for m in result.measurements[:initial])


def test_plan_gives_each_initial_measurement_a_rounds_measurement_budget_and_sums_exactly():
    plan = plan_budget(Fraction(1, 10), 7, Fraction(1, 3), initial=5)
    assert plan.total() == Fraction(1, 10) and len(plan.initial) == 5
    assert set(plan.initial) == {r.rho_measure for r in plan.rounds}
    assert {r.rho_select for r in plan.rounds} == {plan.rounds[0].rho_measure / 2}
    with pytest.raises(BudgetSplitError):
        plan_budget(Fraction(1, 10), 7, Fraction(1, 3), initial=-1)


def test_measurement_noise_has_the_formula_sigma_in_the_loop_and_30_percent_off_would_fail():
    """Every measurement's σ is Δ₂/√(2ρ_measure) = 1/(N√ρ_measure) for its class, and the noise
    it adds is a whole count with variance 1/ρ_measure (truth 0.5, far from the clipping
    bounds); the discrete Gaussian's variance is below 1/ρ by less than 10⁻⁹ relative here."""
    domain = small_domain()
    candidates = marginal_workloads(domain, 1) + marginal_workloads(domain, 3)
    truth = np.full(candidates.n_queries, 0.5)
    initial = len(marginal_workloads(domain, 1))
    plan = plan_budget(Fraction(1, 3), len(candidates) - initial, Fraction(1, 2), initial)
    result = adaptive_measurements(
        _Learner(candidates), candidates, truth, TOTALS, plan, SECRET, "sigma"
    )
    assert result.rho_spent() == Fraction(1, 3)
    z = []
    for m in result.measurements:
        n = normaliser(m.workload, TOTALS)
        assert m.sigma == pytest.approx(
            l2_sensitivity(m.workload, TOTALS) / math.sqrt(2 * m.rho_measure)
        )
        assert m.sigma == pytest.approx(1 / (n * math.sqrt(m.rho_measure)))
        counts = np.rint(m.noisy * n)
        assert np.allclose(m.noisy * n, counts, rtol=0, atol=1e-9)  # whole counts over N
        noise = counts - n // 2
        z.append(noise * math.sqrt(m.rho_measure))
    z = np.concatenate(z)
    assert len(z) > 400
    se = 1 / math.sqrt(2 * len(z))  # standard error of a sample standard deviation
    assert abs(z.std() - 1) < 4 * se
    assert abs(z.std() / 1.3 - 1) > 4 * se  # a σ 30% too large would be caught


def test_truth_that_is_not_counts_over_n_is_refused():
    domain = small_domain()
    candidates = marginal_workloads(domain, 2)
    truth = np.random.default_rng(0).random(candidates.n_queries) * 0.2
    with pytest.raises(ValueError, match="not integer counts"):
        adaptive_measurements(
            _Frozen(candidates.n_queries),
            candidates,
            truth,
            TOTALS,
            plan_budget(Fraction(1, 2), 5, Fraction(1, 2)),
            SECRET,
            "t",
        )
