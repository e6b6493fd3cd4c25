"""solve_children: optimality against Clarabel, a KKT certificate, constraints, edge cases;
the first-order path for large families against the exact one; allowed masks (forbidden
entries) against an enumeration of active sets on the allowed entries."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from censusdp_spark.topdown.solvers import (
    ChildrenProblem,
    PrecisionProblem,
    least_squares,
    solve_children,
    solve_to_targets,
    weighted_squared_error,
)
from censusdp_spark.topdown.solvers.subproblem import masked_feasible_point
from tests.helpers.solvers import (
    assert_feasible,
    assert_masked_feasible,
    clarabel_solution,
    enumerated_optimum,
    kkt_violation,
    marginal_queries,
    masked_problem,
    random_precision_problem,
    random_problem,
)


def clarabel_optimum(problem: ChildrenProblem) -> float:
    """The optimum by Clarabel (``clarabel_solution``)."""
    return clarabel_solution(problem)[0]


@pytest.mark.parametrize("seed", range(12))
def test_objective_matches_clarabel_with_parent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, n_children=int(rng.integers(2, 7)), dims=(2, 2, 3))
    x = solve_children(problem)
    assert_feasible(problem, x)
    reference = clarabel_optimum(problem)
    assert weighted_squared_error(problem, x) == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("seed", range(12))
def test_objective_matches_clarabel_with_child_totals(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    problem = random_problem(
        rng, n_children=int(rng.integers(2, 7)), dims=(2, 2, 3), with_totals=True
    )
    x = solve_children(problem)
    assert_feasible(problem, x)
    reference = clarabel_optimum(problem)
    assert weighted_squared_error(problem, x) == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("with_total", [False, True])
def test_root_matches_clarabel(with_total: bool) -> None:
    rng = np.random.default_rng(7)
    problem = random_problem(rng, 1, dims=(3, 4), with_totals=with_total, root=True, scale=5)
    x = solve_children(problem)
    assert_feasible(problem, x)
    assert weighted_squared_error(problem, x) == pytest.approx(clarabel_optimum(problem), rel=1e-6)


def test_larger_problem_matches_clarabel_and_is_a_kkt_point() -> None:
    rng = np.random.default_rng(11)
    subsets = [(), (0,), (2,), (0, 1), (1, 2), (0, 1, 2)]
    problem = random_problem(rng, 12, dims=(2, 3, 6), subsets=subsets, with_totals=True, scale=300)
    x = solve_children(problem)
    assert_feasible(problem, x)
    assert kkt_violation(problem, x) < 1e-8
    assert weighted_squared_error(problem, x) == pytest.approx(clarabel_optimum(problem), rel=1e-6)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("with_totals", [False, True])
def test_solution_satisfies_kkt_conditions(seed: int, with_totals: bool) -> None:
    rng = np.random.default_rng(200 + seed)
    problem = random_problem(
        rng, int(rng.integers(2, 9)), dims=(2, 2, 4), with_totals=with_totals, scale=8
    )
    x = solve_children(problem)
    assert_feasible(problem, x)
    assert kkt_violation(problem, x) < 1e-8


def test_kkt_check_rejects_a_feasible_suboptimal_point() -> None:
    rng = np.random.default_rng(3)
    problem = random_problem(rng, 4, dims=(2, 2, 4))
    assert problem.parent is not None
    even_split = np.broadcast_to(problem.parent / 4.0, (4, problem.n_cells))
    assert kkt_violation(problem, even_split) > 1e-3


def test_zero_parent_cell_gives_zero_children() -> None:
    rng = np.random.default_rng(5)
    problem = random_problem(rng, 3, dims=(2, 3))
    assert problem.parent is not None
    parent = problem.parent.copy()
    parent[[0, 4]] = 0
    zeroed = ChildrenProblem(
        marginals=problem.marginals,
        marginal_sizes=problem.marginal_sizes,
        weights=problem.weights,
        noisy=problem.noisy,
        parent=parent,
        child_totals=None,
    )
    x = solve_children(zeroed)
    assert np.all(x[:, [0, 4]] == 0)
    assert_feasible(zeroed, x)
    assert kkt_violation(zeroed, x) < 1e-8


def test_single_child_equals_parent() -> None:
    rng = np.random.default_rng(6)
    problem = random_problem(rng, 1, dims=(2, 3), with_totals=True)
    assert problem.parent is not None
    np.testing.assert_array_equal(solve_children(problem), problem.parent[None, :])


def test_child_with_zero_total_is_all_zero() -> None:
    rng = np.random.default_rng(8)
    problem = random_problem(rng, 3, dims=(2, 3))
    assert problem.parent is not None
    totals = np.array([0, problem.parent.sum() - 5, 5], dtype=np.int64)
    constrained = ChildrenProblem(
        marginals=problem.marginals, marginal_sizes=problem.marginal_sizes, weights=problem.weights, noisy=problem.noisy,
        parent=problem.parent, child_totals=totals,
    )  # fmt: skip
    x = solve_children(constrained)
    assert np.all(x[0] == 0)
    assert_feasible(constrained, x)
    assert kkt_violation(constrained, x) < 1e-8


def test_marginal_cells_without_active_cells_are_harmless() -> None:
    rng = np.random.default_rng(9)
    problem = random_problem(rng, 4, dims=(2, 3))
    # Widen every query by two marginal cells that no active cell maps to.
    sizes = tuple(s + 2 for s in problem.marginal_sizes)
    noisy = tuple(np.hstack([y, rng.normal(5.0, 1.0, (4, 2))]) for y in problem.noisy)
    widened = ChildrenProblem(
        marginals=problem.marginals,
        marginal_sizes=sizes,
        weights=problem.weights,
        noisy=noisy,
        parent=problem.parent,
        child_totals=None,
    )
    x = solve_children(widened)
    np.testing.assert_allclose(x, solve_children(problem), atol=1e-9)


def test_all_zero_noisy_input_splits_the_parent_evenly() -> None:
    rng = np.random.default_rng(10)
    problem = random_problem(rng, 5, dims=(2, 3))
    assert problem.parent is not None
    zeros = tuple(np.zeros_like(y) for y in problem.noisy)
    blank = ChildrenProblem(
        marginals=problem.marginals,
        marginal_sizes=problem.marginal_sizes,
        weights=problem.weights,
        noisy=zeros,
        parent=problem.parent,
        child_totals=None,
    )
    np.testing.assert_allclose(solve_children(blank), np.tile(problem.parent / 5.0, (5, 1)))


def test_queries_that_do_not_identify_cells_still_reach_the_optimum() -> None:
    rng = np.random.default_rng(12)
    # Only the total and one margin: the Hessian is singular.
    problem = random_problem(rng, 4, dims=(3, 4), subsets=[(), (0,)], with_totals=True)
    x = solve_children(problem)
    assert_feasible(problem, x)
    assert weighted_squared_error(problem, x) == pytest.approx(clarabel_optimum(problem), rel=1e-6)


def _replace(problem: ChildrenProblem, **changes: object) -> ChildrenProblem:
    fields = {
        "marginals": problem.marginals,
        "marginal_sizes": problem.marginal_sizes,
        "weights": problem.weights,
        "noisy": problem.noisy,
        "parent": problem.parent,
        "child_totals": problem.child_totals,
        "allowed": problem.allowed,
    }
    fields.update(changes)
    return ChildrenProblem(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("noisy", lambda p: (p.noisy[0][:, :-1],) + p.noisy[1:]),
        ("marginals", lambda p: (p.marginals[0][:-1],) + p.marginals[1:]),
        ("marginals", lambda p: (p.marginals[0] + 99,) + p.marginals[1:]),
        ("weights", lambda p: -p.weights),
        ("parent", lambda p: p.parent - 100),
        ("parent", lambda p: p.parent.astype(float)),
        ("child_totals", lambda p: p.child_totals + 1),
    ],
)
def test_bad_problem_raises_naming_the_field(field: str, change) -> None:
    problem = random_problem(np.random.default_rng(1), 3, with_totals=True)
    with pytest.raises(ValueError, match=field):
        _replace(problem, **{field: change(problem)})


def test_root_with_several_children_is_rejected() -> None:
    problem = random_problem(np.random.default_rng(1), 3)
    with pytest.raises(ValueError, match="parent"):
        _replace(problem, parent=None)


# The first-order path (used above least_squares.EXACT_SIZE_LIMIT).

MEDIUM_SUBSETS = [(), (0,), (2,), (0, 1), (1, 2), (0, 1, 2)]


def frank_wolfe_gap(problem: ChildrenProblem, x: np.ndarray) -> float:
    """``<grad, x> - min <grad, s>`` over ``s >= 0`` with the parent's column sums: an upper
    bound on how far the feasible ``x`` is above the optimum (parent, no child totals)."""
    assert problem.parent is not None and problem.child_totals is None
    gradient = np.zeros_like(x)
    for m, s, w, y in zip(
        problem.marginals, problem.marginal_sizes, problem.weights, problem.noisy, strict=True
    ):
        fitted = np.stack([np.bincount(m, row, minlength=s) for row in x])
        gradient += 2.0 * w * (fitted - y)[:, m]
    return float(np.sum(gradient * x) - problem.parent @ gradient.min(axis=0))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_totals", [False, True])
def test_first_order_matches_the_exact_method(seed: int, with_totals: bool) -> None:
    rng = np.random.default_rng(300 + seed)
    problem = random_problem(
        rng, 20, dims=(5, 5, 6), subsets=MEDIUM_SUBSETS, with_totals=with_totals, scale=200
    )
    x = solve_children(problem, method="first_order")
    assert_feasible(problem, x)
    exact = weighted_squared_error(problem, solve_children(problem, method="exact"))
    assert weighted_squared_error(problem, x) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("with_total", [False, True])
def test_first_order_root_matches_the_exact_method(with_total: bool) -> None:
    rng = np.random.default_rng(13)
    problem = random_problem(
        rng, 1, dims=(5, 5, 6), subsets=MEDIUM_SUBSETS, with_totals=with_total, root=True
    )
    x = solve_children(problem, method="first_order")
    assert_feasible(problem, x)
    exact = weighted_squared_error(problem, solve_children(problem, method="exact"))
    assert weighted_squared_error(problem, x) == pytest.approx(exact, rel=1e-6)


def test_first_order_handles_zero_cells_and_zero_children() -> None:
    rng = np.random.default_rng(14)
    problem = random_problem(rng, 5, dims=(3, 4), with_totals=True)
    assert problem.parent is not None and problem.child_totals is not None
    parent = problem.parent.copy()
    parent[[1, 6]] = 0
    totals = problem.child_totals.copy()
    totals[0] = 0
    totals[1] = parent.sum() - totals[2:].sum()
    degenerate = _replace(problem, parent=parent, child_totals=totals)
    x = solve_children(degenerate, method="first_order")
    assert np.all(x[:, [1, 6]] == 0) and np.all(x[0] == 0)
    assert_feasible(degenerate, x)
    exact = weighted_squared_error(degenerate, solve_children(degenerate, method="exact"))
    assert weighted_squared_error(degenerate, x) == pytest.approx(exact, rel=1e-6)


def test_families_above_the_size_limit_use_the_first_order_method(monkeypatch) -> None:
    problem = random_problem(np.random.default_rng(15), 4, dims=(2, 2, 4))
    assert problem.parent is not None
    size = 4 * int(np.count_nonzero(problem.parent)) ** 2  # k * n**2 over the active cells
    calls = []
    monkeypatch.setattr(
        least_squares, "solve_children_first_order", lambda p: calls.append(p) or p.noisy[0]
    )
    monkeypatch.setattr(least_squares, "EXACT_SIZE_LIMIT", size)
    solve_children(problem)
    assert calls == []
    monkeypatch.setattr(least_squares, "EXACT_SIZE_LIMIT", size - 1)
    solve_children(problem)
    assert calls == [problem]


def test_unknown_method_is_rejected() -> None:
    problem = random_problem(np.random.default_rng(16), 3)
    with pytest.raises(ValueError, match="method"):
        solve_children(problem, method="newton")  # type: ignore[arg-type]


def test_large_family_is_solved_with_a_certified_gap() -> None:
    # k = 100 children over n = 1000 cells with 8 queries: far beyond the exact method.
    rng = np.random.default_rng(17)
    subsets = [(), (0,), (1,), (3,), (0, 1), (2, 3), (0, 1, 2), (0, 1, 2, 3)]
    problem = random_problem(rng, 100, dims=(2, 4, 5, 25), subsets=subsets, scale=100_000)
    x = solve_children(problem)
    assert_feasible(problem, x)
    assert frank_wolfe_gap(problem, x) <= 1e-6 * weighted_squared_error(problem, x)


@pytest.mark.parametrize("seed", range(40))
def test_per_child_precision_solves_equal_the_enumerated_optimum(seed):
    rng = np.random.default_rng(seed)
    root = seed % 5 == 0
    k = 1 if root else int(rng.integers(2, 4))
    n = int(rng.integers(2, 4)) if k < 3 else 2
    problem = random_precision_problem(rng, k, n, with_totals=bool(seed % 2), root=root)
    x = solve_to_targets(problem)
    np.testing.assert_allclose(x, enumerated_optimum(problem), atol=1e-7)


def test_shared_precision_is_the_least_squares_problem():
    """With every ``P_c`` equal to the least-squares Hessian and targets its unconstrained
    minimisers, the two objectives differ by a constant: same solution."""
    rng = np.random.default_rng(11)
    for with_totals in (False, True):
        problem = random_problem(rng, 6, dims=(2, 2, 2), with_totals=with_totals, scale=60)
        hessian, linear = least_squares._quadratic_model(problem)
        targets = np.linalg.solve(hessian, linear.T).T
        precisions = np.broadcast_to(hessian / 2.0, (6, *hessian.shape)).copy()
        targeted = solve_to_targets(
            PrecisionProblem(
                targets=targets,
                precisions=precisions,
                parent=problem.parent,
                child_totals=problem.child_totals,
            )
        )
        np.testing.assert_allclose(targeted, solve_children(problem), atol=1e-8)


def test_a_lone_child_with_a_parent_gets_the_parent():
    rng = np.random.default_rng(5)
    problem = random_precision_problem(rng, 1, 4, with_totals=True)
    np.testing.assert_array_equal(solve_to_targets(problem), problem.parent[None, :])


# --- children measured with different weights (bypassing) -------------------------------


def per_child(problem: ChildrenProblem, rng: np.random.Generator) -> ChildrenProblem:
    """``problem`` with every child's weights scaled by its own factor, and one child not
    asked its first query (weight 0), as a family with bypassed children is."""
    scale = rng.uniform(0.3, 4.0, (problem.n_children, 1))
    weights = scale * np.asarray(problem.weights)[None, :]
    weights[0, 0] = 0.0
    return _replace(problem, weights=weights)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("with_totals", [False, True])
def test_per_child_weights_reach_the_clarabel_optimum_at_a_kkt_point(seed, with_totals):
    rng = np.random.default_rng(900 + seed)
    problem = per_child(random_problem(rng, 4, with_totals=with_totals), rng)
    x = solve_children(problem)
    assert_feasible(problem, x)
    assert weighted_squared_error(problem, x) == pytest.approx(
        clarabel_optimum(problem), rel=1e-6, abs=1e-7
    )
    assert kkt_violation(problem, x) < 1e-7


def test_equal_per_child_weights_give_the_shared_solution():
    rng = np.random.default_rng(5)
    shared = random_problem(rng, 5, with_totals=True)
    same = _replace(shared, weights=np.tile(shared.weights, (5, 1)))
    np.testing.assert_allclose(solve_children(same), solve_children(shared), atol=1e-9)


@pytest.mark.parametrize("with_totals", [False, True])
def test_first_order_with_per_child_weights_matches_the_exact_method(with_totals):
    rng = np.random.default_rng(77)
    problem = per_child(
        random_problem(
            rng, 12, dims=(5, 5, 6), subsets=MEDIUM_SUBSETS, with_totals=with_totals, scale=200
        ),
        rng,
    )
    x = solve_children(problem, method="first_order")
    assert_feasible(problem, x)
    exact = weighted_squared_error(problem, solve_children(problem, method="exact"))
    assert weighted_squared_error(problem, x) == pytest.approx(exact, rel=1e-6)


def test_per_child_weights_of_the_wrong_shape_are_refused():
    problem = random_problem(np.random.default_rng(1), 3)
    with pytest.raises(ValueError, match=r"weights: shape \(2, 3\), expected \(3,\) or \(3, 3\)"):
        _replace(problem, weights=np.ones((2, 3)))


# --- allowed masks: entries forbidden child by child ------------------------------------

SMALL_DIMS = [(2,), (3,), (2, 2), (5,), (2, 3)]


def small_masked_problem(seed: int) -> ChildrenProblem:
    """A masked problem with at most 10 allowed entries (for enumeration); every fifth a root,
    every third with per-child weights."""
    rng = np.random.default_rng(seed)
    root = seed % 5 == 0
    while True:
        k = 1 if root else int(rng.integers(2, 5))
        dims = SMALL_DIMS[int(rng.integers(len(SMALL_DIMS)))]
        problem = masked_problem(rng, k, dims, with_totals=bool(seed % 2))
        if problem.allowed is not None and 0 < problem.allowed.sum() <= 10:
            return per_child(problem, rng) if seed % 3 == 0 and not root else problem


def query_quadratic(problem: ChildrenProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(H_c, g_c)`` (shapes ``(k, n, n)``, ``(k, n)``) of the objective
    ``sum_c 0.5 x_c^T H_c x_c - g_c^T x_c`` + constant, from explicit query matrices."""
    k, n = problem.n_children, problem.n_cells
    hessians, linear = np.zeros((k, n, n)), np.zeros((k, n))
    for m, s, w, y in zip(
        problem.marginals, problem.marginal_sizes, problem.child_weights().T, problem.noisy,
        strict=True,
    ):  # fmt: skip
        query = np.zeros((s, n))
        query[m, np.arange(n)] = 1.0
        hessians += 2.0 * w[:, None, None] * (query.T @ query)[None]
        linear += 2.0 * w[:, None] * (y @ query)
    return hessians, linear


def enumerated_masked_optimum(
    hessians: np.ndarray,
    linear: np.ndarray,
    parent: np.ndarray | None,
    row_sums: np.ndarray | None,
    allowed: np.ndarray,
) -> np.ndarray:
    """The minimiser of ``sum_c 0.5 x_c^T H_c x_c - g_c^T x_c`` by enumeration over the allowed
    entries only (forbidden ones are not variables: 0): for every subset of them fixed at 0,
    the equality-constrained QP's KKT system; the best feasible minimiser wins."""
    k, n = allowed.shape
    children, cells = np.nonzero(allowed)
    m = children.size
    hessian = hessians[children[:, None], cells[:, None], cells[None, :]]
    hessian = np.where(children[:, None] == children[None, :], hessian, 0.0)
    g = linear[children, cells]
    rows, rhs = [], []
    if parent is not None:
        rows.append((cells[None, :] == np.arange(n)[:, None]).astype(float))
        rhs.append(parent.astype(float))
    if row_sums is not None:
        rows.append((children[None, :] == np.arange(k)[:, None]).astype(float))
        rhs.append(np.asarray(row_sums, dtype=float))
    best, best_value = None, np.inf
    for fixed in itertools.product((False, True), repeat=m):
        a = np.vstack([*rows, np.eye(m)[list(fixed)]])
        b = np.concatenate([*rhs, np.zeros(sum(fixed))])
        kkt = np.block([[hessian, a.T], [a, np.zeros((a.shape[0], a.shape[0]))]])
        z = np.linalg.lstsq(kkt, np.concatenate([g, b]), rcond=None)[0][:m]
        if np.max(np.abs(a @ z - b), initial=0.0) > 1e-8 or z.min(initial=0.0) < -1e-9:
            continue
        value = 0.5 * z @ hessian @ z - g @ z
        if value < best_value:
            best, best_value = z, value
    assert best is not None
    x = np.zeros((k, n))
    x[children, cells] = best
    return x


def assert_masked_children_optimal(problem: ChildrenProblem, x: np.ndarray) -> None:
    assert problem.allowed is not None
    assert_masked_feasible(x, problem.parent, problem.row_sums, problem.allowed)
    reference = enumerated_masked_optimum(
        *query_quadratic(problem), problem.parent, problem.row_sums, problem.allowed
    )
    assert weighted_squared_error(problem, x) == pytest.approx(
        weighted_squared_error(problem, reference), rel=1e-7, abs=1e-9
    )
    np.testing.assert_allclose(x, reference, atol=1e-6)


@pytest.mark.parametrize("seed", range(60))
def test_masked_solves_equal_the_enumerated_optimum(seed: int) -> None:
    problem = small_masked_problem(seed)
    assert_masked_children_optimal(problem, solve_children(problem, method="exact"))


@pytest.mark.parametrize("seed", range(20))
def test_masked_primal_active_set_equals_the_enumerated_optimum(seed: int, monkeypatch) -> None:
    """With no primal-dual steps the primal method solves from ``_feasible_point_near``."""
    monkeypatch.setattr(least_squares, "_MAX_PDAS_STEPS", 0)
    problem = small_masked_problem(seed)
    assert_masked_children_optimal(problem, solve_children(problem, method="exact"))


def masked_precision_problem(seed: int) -> PrecisionProblem:
    """A ``PrecisionProblem`` on the mask, parent and totals of ``small_masked_problem``."""
    masked = small_masked_problem(seed)
    rng = np.random.default_rng(1000 + seed)
    k, n = masked.n_children, masked.n_cells
    factors = rng.normal(size=(k, n, n))
    return PrecisionProblem(
        targets=rng.normal(2.0, 3.0, (k, n)),
        precisions=factors @ factors.transpose(0, 2, 1) + 0.1 * np.eye(n),
        parent=masked.parent,
        child_totals=masked.child_totals,
        allowed=masked.allowed,
    )


def target_objective(problem: PrecisionProblem, x: np.ndarray) -> float:
    residual = x - problem.targets
    return float(np.einsum("ci,cij,cj->", residual, problem.precisions, residual))


@pytest.mark.parametrize("seed", range(60))
def test_masked_precision_solves_equal_the_enumerated_optimum(seed: int) -> None:
    problem = masked_precision_problem(seed)
    assert problem.allowed is not None
    x = solve_to_targets(problem)
    assert_masked_feasible(x, problem.parent, problem.row_sums, problem.allowed)
    reference = enumerated_masked_optimum(
        2.0 * problem.precisions,
        2.0 * np.einsum("cij,cj->ci", problem.precisions, problem.targets),
        problem.parent,
        problem.row_sums,
        problem.allowed,
    )
    assert target_objective(problem, x) == pytest.approx(
        target_objective(problem, reference), rel=1e-7, abs=1e-9
    )
    np.testing.assert_allclose(x, reference, atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_an_all_true_mask_is_no_mask(seed: int) -> None:
    rng = np.random.default_rng(400 + seed)
    problem = random_problem(rng, 4, dims=(2, 2, 3), with_totals=bool(seed % 2))
    everything = replace(problem, allowed=np.ones((4, problem.n_cells), dtype=bool))
    for method in ("exact", "first_order"):
        np.testing.assert_array_equal(
            solve_children(everything, method=method), solve_children(problem, method=method)
        )
    precision = random_precision_problem(rng, 3, 3, with_totals=bool(seed % 2))
    np.testing.assert_array_equal(
        solve_to_targets(replace(precision, allowed=np.ones((3, 3), dtype=bool))),
        solve_to_targets(precision),
    )


def test_children_and_cells_with_nothing_allowed_are_zero() -> None:
    problem = small_masked_problem(32)
    assert problem.allowed is not None and problem.parent is not None
    assert problem.child_totals is None
    allowed = problem.allowed.copy()
    allowed[0] = False
    orphans = ~allowed.any(axis=0)  # cells only child 0 could hold: parent 0 now
    assert orphans.any()
    stripped = replace(problem, parent=np.where(orphans, 0, problem.parent), allowed=allowed)
    x = solve_children(stripped, method="exact")
    assert np.all(x[0] == 0.0) and np.all(x[:, orphans] == 0.0)
    assert_masked_children_optimal(stripped, x)


@pytest.mark.parametrize(
    ("mask", "rows", "columns"),
    [
        # Entry (0, 1) is 0 in every feasible point: Sinkhorn stalls, the LP takes over.
        ([[True, True], [False, True]], [1.0, 1.0], [1.0, 1.0]),
        ([[True, False, True], [True, True, False]], [3.0, 2.0], [1.0, 2.0, 2.0]),
    ],
)
def test_the_masked_interior_point_is_feasible_and_zero_where_forbidden(mask, rows, columns):
    allowed = np.array(mask)
    x = masked_feasible_point(allowed, np.array(columns), np.array(rows))
    assert_masked_feasible(x, np.array(columns), np.array(rows), allowed)


def test_a_mask_that_no_point_meets_is_refused() -> None:
    # Child 0 may only hold cell 0 (count 1) but must hold 2 persons; validation cannot see it.
    allowed = np.array([[True, False], [True, True]])
    with pytest.raises(ValueError, match="allowed: no point on the mask"):
        masked_feasible_point(allowed, np.array([1.0, 2.0]), np.array([2.0, 1.0]))
    maps, sizes = marginal_queries((2,), [(), (0,)])
    noisy = tuple(np.ones((2, s)) for s in sizes)
    problem = ChildrenProblem(
        marginals=maps,
        marginal_sizes=sizes,
        weights=np.ones(2),
        noisy=noisy,
        parent=np.array([1, 2]),
        child_totals=np.array([2, 1]),
        allowed=allowed,
    )
    for method in ("exact", "first_order"):
        with pytest.raises(ValueError, match="allowed: no point on the mask"):
            solve_children(problem, method=method)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("with_totals", [False, True])
def test_masked_solves_with_a_singular_hessian_are_kkt_points(seed: int, with_totals: bool):
    """Only the total and one margin: the proximal-point path, certified by the LP check."""
    rng = np.random.default_rng(600 + seed)
    problem = masked_problem(rng, 4, (3, 4), with_totals, subsets=[(), (0,)], density=0.7)
    assert problem.allowed is not None
    x = solve_children(problem, method="exact")
    assert_masked_feasible(x, problem.parent, problem.row_sums, problem.allowed)
    assert kkt_violation(problem, x) < 1e-8


@pytest.mark.parametrize("with_totals", [False, True])
def test_first_order_honours_the_mask(with_totals: bool) -> None:
    rng = np.random.default_rng(500 + int(with_totals))
    problem = masked_problem(
        rng, 10, (3, 4, 5), with_totals, subsets=MEDIUM_SUBSETS, density=0.7, scale=20
    )
    assert problem.allowed is not None
    x = solve_children(problem, method="first_order")
    assert_masked_feasible(x, problem.parent, problem.row_sums, problem.allowed)
    exact = solve_children(problem, method="exact")
    assert_masked_feasible(exact, problem.parent, problem.row_sums, problem.allowed)
    assert kkt_violation(problem, exact) < 1e-8
    assert weighted_squared_error(problem, x) == pytest.approx(
        weighted_squared_error(problem, exact), rel=1e-6
    )


def test_first_order_honours_the_mask_at_the_root() -> None:
    problem = masked_problem(np.random.default_rng(510), 1, (3, 4, 5), True, MEDIUM_SUBSETS)
    assert problem.allowed is not None
    x = solve_children(problem, method="first_order")
    assert_masked_feasible(x, None, problem.row_sums, problem.allowed)
    exact = weighted_squared_error(problem, solve_children(problem, method="exact"))
    assert weighted_squared_error(problem, x) == pytest.approx(exact, rel=1e-6)


def _masked_base() -> ChildrenProblem:
    return random_problem(np.random.default_rng(1), 3, dims=(2, 3), with_totals=True)


@pytest.mark.parametrize(
    ("allowed", "message"),
    [
        (np.ones((3, 5), dtype=bool), r"allowed: expected an array of shape \(3, 6\)"),
        (np.ones((3, 6), dtype=np.int64), "allowed: dtype int64 is not bool"),
        (np.zeros((3, 6), dtype=bool), "allowed: cell .* of the parent .* has no child allowed"),
    ],
)
def test_bad_masks_are_refused_naming_the_field(allowed: np.ndarray, message: str) -> None:
    problem = _masked_base()
    with pytest.raises(ValueError, match=message):
        replace(problem, allowed=allowed)
    precision = PrecisionProblem(
        targets=np.zeros((3, 6)),
        precisions=np.broadcast_to(np.eye(6), (3, 6, 6)).copy(),
        parent=problem.parent,
        child_totals=None,
    )
    with pytest.raises(ValueError, match=message):
        replace(precision, allowed=allowed)


def test_a_child_whose_total_has_no_allowed_cell_is_refused() -> None:
    problem = _masked_base()
    assert problem.parent is not None and problem.child_totals is not None
    allowed = np.ones((3, 6), dtype=bool)
    child = int(np.argmax(problem.child_totals))
    allowed[child, problem.parent > 0] = False
    allowed[(child + 1) % 3, problem.parent > 0] = True
    with pytest.raises(ValueError, match=rf"allowed: child {child} \(total .*\) has no allowed"):
        replace(problem, allowed=allowed)
    root = random_problem(np.random.default_rng(2), 1, with_totals=True, root=True)
    with pytest.raises(ValueError, match="allowed: child 0"):
        replace(root, allowed=np.zeros((1, root.n_cells), dtype=bool))


def test_the_masked_kkt_check_rejects_a_feasible_suboptimal_point() -> None:
    problem = masked_problem(np.random.default_rng(3), 4, (2, 2, 4), True, density=0.8)
    assert problem.allowed is not None and problem.parent is not None
    assert problem.row_sums is not None
    scaled_mask = masked_feasible_point(
        problem.allowed, problem.parent.astype(float), problem.row_sums
    )
    assert kkt_violation(problem, scaled_mask) > 1e-3
    assert kkt_violation(problem, solve_children(problem)) < 1e-8


def _ill_conditioned_root(n: int, cond: float, seed: int) -> tuple[PrecisionProblem, np.ndarray]:
    """A root fitted to a target of many negative entries under a precision of condition
    number ``cond`` (an allocation that gives some queries 1e-5 of another's weight), its
    total held; and the precision."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    spectrum = np.logspace(0, np.log10(cond), n)
    precision = q @ np.diag(spectrum) @ q.T
    truth = rng.poisson(0.3, n).astype(float)
    target = truth + 30 * q @ (rng.standard_normal(n) / np.sqrt(spectrum))
    problem = PrecisionProblem(
        targets=target[None],
        precisions=precision[None],
        parent=None,
        child_totals=np.array([int(truth.sum())]),
    )
    return problem, precision


def _assert_kkt_of_root(problem: PrecisionProblem, precision: np.ndarray, x: np.ndarray) -> None:
    assert problem.child_totals is not None
    total = int(problem.child_totals[0])
    assert x.min() >= 0 and x.sum() == pytest.approx(total, rel=1e-12)
    gradient = 2 * precision @ (x - problem.targets[0])
    free = x > 1e-9 * total
    multiplier = -gradient[free].mean()
    scale = np.abs(gradient).max()
    assert np.abs(gradient[free] + multiplier).max() <= 1e-7 * scale
    assert (gradient[~free] + multiplier).min() >= -1e-7 * scale


ILL_CONDITIONED = [(60, 1e5, 1), (60, 1e6, 0), (120, 1e5, 0)]


def _counted(monkeypatch, name: str) -> list[int]:
    """Calls of ``least_squares.<name>`` from now on, one entry each."""
    from censusdp_spark.topdown.solvers import least_squares

    calls: list[int] = []
    method = getattr(least_squares, name)
    monkeypatch.setattr(least_squares, name, lambda *a: calls.append(1) or method(*a))
    return calls


@pytest.mark.parametrize(("n", "cond", "seed"), ILL_CONDITIONED)
def test_ill_conditioned_fits_settle_by_primal_dual_steps_alone(n, cond, seed, monkeypatch) -> None:
    """With its inverses kept accurate (``_Face._drifted``), the primal-dual iteration reaches
    the KKT point itself: neither the primal method nor the interior point is called."""
    fallbacks = _counted(monkeypatch, "_primal_active_set")
    fallbacks += _counted(monkeypatch, "_interior_point_guess")
    problem, precision = _ill_conditioned_root(n, cond, seed)
    _assert_kkt_of_root(problem, precision, solve_to_targets(problem)[0])
    assert not fallbacks


@pytest.mark.parametrize(("n", "cond", "seed"), ILL_CONDITIONED)
def test_when_the_primal_dual_steps_run_out_the_primal_method_reaches_the_kkt_point(
    n, cond, seed, monkeypatch
) -> None:
    """With one primal-dual step allowed, the primal method started on that iterate's
    support ends at a KKT point with the total held, without the interior point."""
    from censusdp_spark.topdown.solvers import least_squares

    monkeypatch.setattr(least_squares, "_MAX_PDAS_STEPS", 1)
    primal = _counted(monkeypatch, "_primal_active_set")
    interior = _counted(monkeypatch, "_interior_point_guess")
    problem, precision = _ill_conditioned_root(n, cond, seed)
    _assert_kkt_of_root(problem, precision, solve_to_targets(problem)[0])
    assert primal and not interior


@pytest.mark.parametrize(("n", "cond", "seed"), ILL_CONDITIONED)
def test_when_the_primal_steps_run_out_too_the_interior_point_support_leads_to_the_kkt_point(
    n, cond, seed, monkeypatch
) -> None:
    """With one primal-dual step and one primal step allowed, the interior-point answer's
    support is where the exact steps restart; the answer is still a KKT point."""
    from censusdp_spark.topdown.solvers import least_squares

    monkeypatch.setattr(least_squares, "_MAX_PDAS_STEPS", 1)
    monkeypatch.setattr(least_squares, "_MAX_PRIMAL_STEPS", 1)
    interior = _counted(monkeypatch, "_interior_point_guess")
    problem, precision = _ill_conditioned_root(n, cond, seed)
    _assert_kkt_of_root(problem, precision, solve_to_targets(problem)[0])
    assert interior


@pytest.mark.parametrize(("n", "cond", "seed"), ILL_CONDITIONED)
def test_the_face_inverses_stay_inverses_through_many_fixes_and_releases(n, cond, seed) -> None:
    """Bordered updates on an ill-conditioned Hessian lose accuracy at every release (a small
    Schur complement); after a hundred random moves of the free set every child's kept
    inverse still inverts its Hessian's free block to 1e-8."""
    from censusdp_spark.topdown.solvers.least_squares import _Face

    rng = np.random.default_rng(seed)
    _, precision = _ill_conditioned_root(n, cond, seed)
    hessians = np.stack([2 * precision, 2 * precision[::-1, ::-1]])
    face = _Face(hessians, rng.standard_normal((2, n)), np.ones((2, n), dtype=bool))
    for _ in range(100):
        flip = rng.random((2, n)) < 0.1
        free = face.free ^ flip
        free[:, 0] = True
        face.move_to(free)
    for c in range(2):
        cells = np.flatnonzero(face.free[c])
        product = hessians[c][np.ix_(cells, cells)] @ face.inverses[c][np.ix_(cells, cells)]
        assert np.abs(product - np.eye(cells.size)).max() <= 1e-8
