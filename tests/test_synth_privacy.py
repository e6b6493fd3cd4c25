"""Accounting and mechanisms of the synthetic-data methods: exact splits, calibrated noise,
selection that follows the exponential mechanism's law, and runs fixed by the secret."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from censusdp_spark.privacy import keyed_rng
from censusdp_spark.synth.adaptive import (
    BudgetSplitError,
    adaptive_measurements,
    exponential_mechanism,
    gaussian_measure,
    gaussian_sigma,
    l2_sensitivity,
    plan_budget,
    selection_sensitivity,
)
from censusdp_spark.synth.workloads import (
    GROUP,
    INDIVIDUAL,
    Totals,
    make_workload,
    marginal_workloads,
)
from tests.test_synth_workloads import small_domain

SECRET = bytes(range(32))
TOTALS = Totals(households=1000, individuals=2500, family_individuals=2000)


def test_plan_splits_rho_exactly_and_equally_over_the_rounds():
    plan = plan_budget(Fraction(1, 7), 13, Fraction(2, 5))
    assert plan.initial == () and len(plan.rounds) == 13 and plan.total() == Fraction(1, 7)
    assert {r.rho_select for r in plan.rounds} == {Fraction(2, 455)}
    assert {r.rho_measure for r in plan.rounds} == {Fraction(3, 455)}
    assert plan.rounds[0].epsilon_select == pytest.approx(math.sqrt(8 * 2 / 455))


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
    assert selection_sensitivity(TOTALS) == 1 / 1000
    assert l2_sensitivity(group, TOTALS) == pytest.approx(math.sqrt(2) / 1000)
    assert l2_sensitivity(person, TOTALS) == pytest.approx(math.sqrt(2) / 2500)
    sigma = gaussian_sigma(group, TOTALS, Fraction(1, 50))
    assert l2_sensitivity(group, TOTALS) ** 2 / (2 * sigma**2) == pytest.approx(1 / 50)


def test_gaussian_noise_has_the_calibrated_scale_and_answers_stay_in_range():
    rng = keyed_rng(SECRET, "test", "gaussian")
    noisy = gaussian_measure(np.full(40_000, 0.5), 0.01, rng)
    assert noisy.std() == pytest.approx(0.01, rel=0.03)  # 30% off would fail by a wide margin
    assert gaussian_measure(np.array([0.0, 1.0]), 10.0, rng).min() >= 0.0


def test_exponential_mechanism_picks_the_worst_workload_at_large_epsilon():
    scores = np.array([0.01, 0.05, 0.30, 0.29, -np.inf])
    # A gap of 0.01 at epsilon / (2 Delta) = 5000 leaves the runner-up a chance of about exp(-50).
    picks = [
        exponential_mechanism(scores, 10.0, 1 / 1000, keyed_rng(SECRET, "em", i))
        for i in range(300)
    ]
    assert picks == [2] * 300


def test_exponential_mechanism_follows_its_law_and_would_fail_at_the_wrong_epsilon():
    scores = np.array([0.0, 1.0, 2.0, -np.inf])
    rng = keyed_rng(SECRET, "em", "law")
    n = 30_000
    counts = np.bincount(
        [exponential_mechanism(scores, 2.0, 1.0, rng) for _ in range(n)], minlength=4
    )
    law = np.exp([0.0, 1.0, 2.0])
    law /= law.sum()
    stderr = np.sqrt(law * (1 - law) / n)
    assert counts[3] == 0
    assert np.all(np.abs(counts[:3] / n - law) < 4 * stderr)
    wrong = np.exp(1.3 * np.array([0.0, 1.0, 2.0]))
    wrong /= wrong.sum()
    assert np.any(np.abs(counts[:3] / n - wrong) > 8 * stderr)


class _Frozen:
    """A synthesiser whose answers never change: isolates the mechanisms."""

    def __init__(self, n: int) -> None:
        self.n, self.fits = n, 0

    def answers(self, workloads):
        return np.zeros(workloads.n_queries)

    def fit(self, targets):
        self.fits += 1


def run(secret: bytes):
    domain = small_domain()
    candidates = marginal_workloads(domain, 2)
    truth = np.random.default_rng(0).random(candidates.n_queries) * 0.2
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
    truth = np.random.default_rng(1).random(candidates.n_queries) * 0.2
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
    """Every measurement's σ is Δ₂/√(2ρ_measure) for its class, and the noise it adds has that
    standard deviation (truth 0.5, far from the clipping bounds)."""
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
        assert m.sigma == pytest.approx(
            l2_sensitivity(m.workload, TOTALS) / math.sqrt(2 * m.rho_measure)
        )
        z.append((m.noisy - 0.5) / m.sigma)
    z = np.concatenate(z)
    assert len(z) > 400
    se = 1 / math.sqrt(2 * len(z))  # standard error of a sample standard deviation
    assert abs(z.std() - 1) < 4 * se
    assert abs(z.std() / 1.3 - 1) > 4 * se  # a σ 30% too large would be caught
