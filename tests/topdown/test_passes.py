"""The two-pass estimate (``passes = ["total", "all"]``) and the multi-pass rounder: pass 1's
totals against an enumeration of its KKT points and an independent Clarabel solve in the
histograms; pass 2 holds them exactly (tolerance 0) with every constraint, and is the optimum
with them held; the rounder's totals are its first pass's, L1-optimal by brute force."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.estimate import level_plan
from censusdp_spark.topdown.solvers import (
    ChildrenProblem,
    PrecisionProblem,
    fit_totals,
    round_children,
    round_totals,
    rounding,
    solve_children,
    solve_to_targets,
    total_pass,
    total_pass_to_targets,
    weighted_squared_error,
)
from tests.helpers.release import with_method
from tests.helpers.solvers import (
    assert_feasible,
    assert_masked_feasible,
    clarabel_solution,
    deviation,
    enumerated_optimum,
    kkt_violation,
    masked_problem,
    random_precision_problem,
    random_problem,
)

TOTAL = 0  # random_problem's first query is the total (subset ())


def enumerated_totals(values: np.ndarray, weights: np.ndarray, total: float) -> np.ndarray:
    """``fit_totals`` by enumeration: for every set of positive children, the minimiser with
    the others at 0 (``t_c = values_c - nu / weights_c`` on the set); the one that is
    non-negative and whose multiplier keeps the others at 0 (KKT) is the optimum."""
    k = values.size
    found = []
    for size in range(1, k + 1):
        for chosen in itertools.combinations(range(k), size):
            on = np.zeros(k, dtype=bool)
            on[list(chosen)] = True
            nu = (values[on].sum() - total) / (1.0 / weights[on]).sum()
            t = np.where(on, values - nu / weights, 0.0)
            if t.min() >= -1e-12 and np.all(weights[~on] * values[~on] <= nu + 1e-12):
                found.append(t)
    assert found
    return found[0]


@pytest.mark.parametrize("seed", range(30))
def test_fit_totals_is_the_enumerated_kkt_point(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 7))
    values = rng.normal(3.0, 4.0, k)
    weights = rng.uniform(0.1, 5.0, k)
    total = int(rng.integers(1, 30))
    fitted = fit_totals(values, weights, total)
    np.testing.assert_allclose(fitted, enumerated_totals(values, weights, total), atol=1e-12)
    assert fitted.min() >= 0 and fitted.sum() == pytest.approx(total, abs=1e-12)


def test_fit_totals_at_the_root_and_for_an_empty_parent() -> None:
    np.testing.assert_array_equal(fit_totals(np.array([-2.5]), np.ones(1), None), [0.0])
    np.testing.assert_array_equal(fit_totals(np.array([7.25]), np.ones(1), None), [7.25])
    np.testing.assert_array_equal(fit_totals(np.array([3.0, -1.0]), np.ones(2), 0), [0.0, 0.0])
    with pytest.raises(ValueError, match="weights"):
        fit_totals(np.array([1.0, 2.0]), np.array([1.0, 0.0]), 3)


@pytest.mark.parametrize("seed", range(12))
def test_pass_one_totals_equal_an_independent_solve_of_the_total_query_alone(seed: int) -> None:
    """Clarabel fits the total query alone in the histograms (not the totals), under the
    parent's cell sums with its zero cells: its totals are ``total_pass``'s."""
    rng = np.random.default_rng(100 + seed)
    problem = random_problem(rng, int(rng.integers(2, 7)), dims=(2, 2, 3))
    _, x = clarabel_solution(problem, queries=[TOTAL])
    held = total_pass(problem, TOTAL).held_totals
    assert held is not None
    np.testing.assert_allclose(held, x.sum(axis=1), atol=1e-6)


def test_pass_one_weights_each_child_by_its_own_total_variance() -> None:
    """Children measured with different variances (bypassing): the fit weights each child's
    total by its own precision, the enumerated KKT point of ``fit_totals``."""
    rng = np.random.default_rng(7)
    problem = random_problem(rng, 4, dims=(2, 2, 3))
    by_child = np.array(problem.child_weights(), dtype=np.float64)
    by_child[:, TOTAL] = [0.5, 1.0, 2.0, 4.0]
    mixed = replace(problem, weights=by_child)
    held = total_pass(mixed, TOTAL).held_totals
    assert held is not None
    parent_total = None if problem.parent is None else int(problem.parent.sum())
    expected = fit_totals(problem.noisy[TOTAL][:, 0], by_child[:, TOTAL], parent_total)
    np.testing.assert_allclose(held, expected, atol=1e-12)
    assert not np.allclose(held, total_pass(problem, TOTAL).held_totals)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("method", ["exact", "first_order"])
def test_pass_two_holds_the_pass_one_totals_and_every_constraint(seed: int, method: str) -> None:
    rng = np.random.default_rng(200 + seed)
    problem = random_problem(rng, int(rng.integers(2, 8)), dims=(2, 2, 3))
    second = total_pass(problem, TOTAL)
    x = solve_children(second, method=method)  # type: ignore[arg-type]
    assert second.held_totals is not None
    # Tolerance 0: the totals are the pass-1 totals to round-off (and so sum to the parent).
    np.testing.assert_allclose(x.sum(axis=1), second.held_totals, rtol=0, atol=1e-9)
    assert_feasible(second, x)
    assert np.all(x[:, problem.parent == 0] == 0)
    assert np.all(x[second.held_totals == 0] == 0)


@pytest.mark.parametrize("seed", range(12))
def test_pass_two_is_the_optimum_with_the_totals_held(seed: int) -> None:
    """The whole two-pass chain solved independently (Clarabel pass 1, then Clarabel with its
    totals as equality rows) reaches the same objective; ours is a KKT point."""
    rng = np.random.default_rng(300 + seed)
    problem = random_problem(rng, int(rng.integers(2, 7)), dims=(2, 2, 3))
    _, first = clarabel_solution(problem, queries=[TOTAL])
    reference, _ = clarabel_solution(replace(problem, held_totals=first.sum(axis=1)))
    second = total_pass(problem, TOTAL)
    x = solve_children(second)
    assert weighted_squared_error(problem, x) == pytest.approx(reference, rel=1e-6)
    assert kkt_violation(second, x) < 1e-9
    # Holding the totals costs fit: one pass is at least as good on the full objective.
    assert weighted_squared_error(problem, solve_children(problem)) <= reference * (1 + 1e-9)


def test_the_root_holds_its_clipped_noisy_total() -> None:
    rng = np.random.default_rng(7)
    problem = random_problem(rng, 1, dims=(2, 3), root=True)
    second = total_pass(problem, TOTAL)
    assert second.held_totals is not None
    assert second.held_totals[0] == max(problem.noisy[TOTAL][0, 0], 0.0)
    x = solve_children(second)
    assert x.sum() == pytest.approx(second.held_totals[0], abs=1e-9)


def test_invariant_totals_leave_the_problem_as_it_is() -> None:
    problem = random_problem(np.random.default_rng(8), 4, with_totals=True)
    assert total_pass(problem, TOTAL) is problem


def test_held_totals_are_validated() -> None:
    problem = random_problem(np.random.default_rng(9), 3)
    assert problem.parent is not None
    share = np.full(3, problem.parent.sum() / 3.0)
    with pytest.raises(ValueError, match="held_totals: sum"):
        replace(problem, held_totals=share + 1.0)
    with pytest.raises(ValueError, match="held_totals: totals must be non-negative"):
        replace(problem, held_totals=share + np.array([-share[0] - 1.0, share[0] + 1.0, 0.0]))
    with pytest.raises(ValueError, match="held_totals: not with child_totals"):
        replace(random_problem(np.random.default_rng(9), 3, with_totals=True), held_totals=share)
    with pytest.raises(ValueError, match="total"):
        total_pass(problem, 1)  # a one-way marginal, not the total


# The full-information pass 1: bottom-up totals weighted by their own precision.


def total_variances(problem: PrecisionProblem) -> np.ndarray:
    return np.array([np.ones(problem.n_cells) @ np.linalg.inv(p) @ np.ones(problem.n_cells)
                     for p in problem.precisions])  # fmt: skip


@pytest.mark.parametrize("seed", range(10))
def test_full_information_pass_one_fits_the_bottom_up_totals_by_their_precision(seed):
    rng = np.random.default_rng(400 + seed)
    k = int(rng.integers(2, 6))
    problem = random_precision_problem(rng, k, 3, with_totals=False)
    second = total_pass_to_targets(problem)
    assert second.held_totals is not None and problem.parent is not None
    values, variances = problem.targets.sum(axis=1), total_variances(problem)
    np.testing.assert_allclose(
        second.held_totals,
        enumerated_totals(values, 1.0 / variances, float(problem.parent.sum())),
        atol=1e-9,
    )
    # The parent's deficit is spread in proportion to the totals' variances.
    positive = second.held_totals > 0
    shift = (values - second.held_totals)[positive] / variances[positive]
    np.testing.assert_allclose(shift, shift[0], atol=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_full_information_pass_two_is_the_enumerated_optimum_with_the_totals_held(seed):
    rng = np.random.default_rng(500 + seed)
    root = seed % 5 == 0
    k = 1 if root else int(rng.integers(2, 4))
    n = int(rng.integers(2, 4)) if k < 3 else 2
    second = total_pass_to_targets(random_precision_problem(rng, k, n, False, root=root))
    x = solve_to_targets(second)
    assert second.held_totals is not None
    np.testing.assert_allclose(x.sum(axis=1), second.held_totals, rtol=0, atol=1e-9)
    np.testing.assert_allclose(x, enumerated_optimum(second), atol=1e-7)


def test_full_information_with_invariant_totals_is_one_pass() -> None:
    problem = random_precision_problem(np.random.default_rng(3), 3, 3, with_totals=True)
    assert total_pass_to_targets(problem) is problem


# The multi-pass rounder.


def roundings(problem: ChildrenProblem, x_hat: np.ndarray):
    """Every floor-or-ceiling choice that meets the parent cell by cell."""
    floor = np.floor(x_hat + 1e-9)
    moving = np.argwhere(x_hat - floor > 1e-9)
    for bits in itertools.product((0, 1), repeat=len(moving)):
        candidate = floor.copy()
        for (c, j), bit in zip(moving, bits, strict=True):
            candidate[c, j] += bit
        if problem.parent is None or np.array_equal(candidate.sum(axis=0), problem.parent):
            yield candidate


def small_two_pass(seed: int) -> tuple[ChildrenProblem, np.ndarray]:
    """A family of 2-3 children over 2 x 2 cells, small enough to enumerate, and its pass-2
    estimate."""
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(2, 4)), dims=(2, 2), scale=6)
    second = total_pass(problem, TOTAL)
    return second, solve_children(second)


@pytest.fixture(params=["flow", "linear_program"])
def totals_path(request, monkeypatch) -> str:
    """``round_totals`` by the flow path, or (a flow table too large) the linear program."""
    if request.param == "linear_program":
        monkeypatch.setattr(rounding, "FLOW_SIZE_LIMIT", 0)
    return request.param


@pytest.mark.parametrize("seed", range(25))
def test_rounded_totals_are_the_l1_closest_of_all_roundings(seed: int, totals_path) -> None:
    problem, x_hat = small_two_pass(600 + seed)
    totals = round_totals(problem, x_hat)
    deviation_of = [
        np.abs(r.sum(axis=1) - x_hat.sum(axis=1)).sum() for r in roundings(problem, x_hat)
    ]
    best = min(deviation_of)
    assert np.abs(totals - x_hat.sum(axis=1)).sum() == pytest.approx(best, abs=1e-9)
    assert np.all(np.abs(totals - x_hat.sum(axis=1)) < 1.0)  # each rounded down or up


@pytest.mark.parametrize("seed", range(25))
def test_the_rounder_holds_the_rounded_totals_then_rounds_the_cells_optimally(
    seed: int, totals_path
) -> None:
    problem, x_hat = small_two_pass(600 + seed)
    x = round_children(problem, x_hat)
    totals = round_totals(problem, x_hat)
    assert problem.parent is not None
    assert x.dtype == np.int64 and x.min() >= 0
    np.testing.assert_array_equal(x.sum(axis=0), problem.parent)
    np.testing.assert_array_equal(x.sum(axis=1), totals)
    held = [r for r in roundings(problem, x_hat) if np.array_equal(r.sum(axis=1), totals)]
    best = min(deviation(problem, r, x_hat) for r in held)
    assert deviation(problem, x, x_hat) == pytest.approx(best, abs=1e-9)


def test_rounding_at_the_root_is_unchanged_by_the_passes() -> None:
    rng = np.random.default_rng(11)
    problem = random_problem(rng, 1, dims=(2, 3), root=True)
    second = total_pass(problem, TOTAL)
    x_hat = solve_children(second)
    x = round_children(second, x_hat)
    assert x.sum() == round_totals(second, x_hat)[0] == int(np.round(x_hat.sum()))
    one_pass = replace(problem, child_totals=np.array([int(x.sum())]))
    np.testing.assert_array_equal(x, round_children(one_pass, x_hat))


def test_larger_two_pass_families_keep_every_constraint(totals_path) -> None:
    rng = np.random.default_rng(12)
    for k in (5, 30):
        problem = random_problem(rng, k, dims=(2, 8), subsets=[(), (0,), (1,), (0, 1)], scale=400)
        second = total_pass(problem, TOTAL)
        x_hat = solve_children(second)
        x = round_children(second, x_hat)
        assert problem.parent is not None and x.min() >= 0
        np.testing.assert_array_equal(x.sum(axis=0), problem.parent)
        np.testing.assert_array_equal(x.sum(axis=1), round_totals(second, x_hat))
        assert np.all(np.abs(x.sum(axis=1) - second.held_totals) < 1.0)


@pytest.mark.parametrize("method", ["topdown", "full_information"])
def test_level_plans_fit_totals_first_where_there_is_a_total_to_fit(tmp_path, method):
    root = Path(__file__).resolve().parents[2]
    text = (root / "conf" / "ri_2010_demo.toml").read_text()
    path = tmp_path / "passes.toml"
    lines = '[estimation]\npasses = ["total", "all"]\n'
    path.write_text(with_method(text, method).replace("[estimation]\n", lines))
    config = load_topdown_config(path, root)
    plans = {level: level_plan(config, level).total_first for level in config.hierarchy.names}
    # topdown's nation measures no total (one pass there, as the Census's US level).
    assert plans == {level: method == "full_information" or level != "nation" for level in plans}
    one_pass = load_topdown_config(root / "conf" / "ri_2010_demo.toml", root)
    assert not any(level_plan(one_pass, lv).total_first for lv in one_pass.hierarchy.names)


# --- allowed masks: pass 1 refuses them; the multi-pass rounder keeps them -------------


def test_the_total_pass_refuses_a_mask_that_forbids_and_keeps_one_that_does_not() -> None:
    problem = masked_problem(np.random.default_rng(20), 3, (2, 3), with_totals=False)
    with pytest.raises(ValueError, match="allowed: the total-first pass"):
        total_pass(problem, TOTAL)
    everything = replace(problem, allowed=np.ones((3, 6), dtype=bool))
    second = total_pass(everything, TOTAL)
    assert second.allowed is everything.allowed and second.held_totals is not None
    precision = random_precision_problem(np.random.default_rng(21), 3, 3, with_totals=False)
    allowed = np.ones((3, 3), dtype=bool)
    assert total_pass_to_targets(replace(precision, allowed=allowed)).allowed is allowed
    allowed = allowed.copy()
    allowed[0, 0] = False
    with pytest.raises(ValueError, match="allowed: the total-first pass"):
        total_pass_to_targets(replace(precision, allowed=allowed))


@pytest.mark.parametrize("seed", range(15))
def test_masked_two_pass_rounding_keeps_forbidden_entries_zero_and_every_sum(
    seed: int, totals_path
) -> None:
    """Held totals of a masked L2 estimate (feasible on the mask by construction): the rounded
    totals are the L1-closest, and pass 2 meets them on the mask."""
    rng = np.random.default_rng(800 + seed)
    problem = masked_problem(rng, int(rng.integers(2, 4)), (2, 2), with_totals=False, scale=4)
    assert problem.allowed is not None
    held = replace(problem, held_totals=solve_children(problem).sum(axis=1))
    x_hat = solve_children(held)
    assert_masked_feasible(x_hat, held.parent, held.held_totals, problem.allowed)
    totals = round_totals(held, x_hat)
    x = round_children(held, x_hat)
    assert np.all(x[~problem.allowed] == 0) and x.min() >= 0
    np.testing.assert_array_equal(x.sum(axis=0), problem.parent)
    np.testing.assert_array_equal(x.sum(axis=1), totals)
    best = min(np.abs(r.sum(axis=1) - x_hat.sum(axis=1)).sum() for r in roundings(held, x_hat))
    assert np.abs(totals - x_hat.sum(axis=1)).sum() == pytest.approx(best, abs=1e-9)
