"""Group bounds (the 2020 group-quarters lower bounds and caps) in every solver: the least
squares and the full-information fit against an independent constrained solve (SciPy's SLSQP),
the rounding against brute force over every floor-or-ceiling choice."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import minimize

from censusdp_spark.topdown.solvers import (
    ChildrenProblem,
    PrecisionProblem,
    bounded,
    least_squares,
    round_children,
    rounding,
    solve_children,
    solve_to_targets,
)
from censusdp_spark.topdown.solvers.subproblem import GroupBounds
from tests.helpers.solvers import deviation, marginal_queries

DIMS = (2, 3)  # group 0: the first level's 3 cells, group 1: the second's
MEMBERS = np.array([[True] * 3 + [False] * 3, [False] * 3 + [True] * 3])


def bounds_of(rng: np.random.Generator, truth: np.ndarray) -> GroupBounds:
    """Bounds the truth meets, many of them tight: lower at the truth's group sum or 0, upper
    at the truth's group sum, one more, or none."""
    sums = truth @ MEMBERS.T.astype(float)
    lower = np.where(rng.random(sums.shape) < 0.5, sums, 0.0)
    upper = np.where(rng.random(sums.shape) < 0.3, sums + rng.integers(0, 2, sums.shape), np.inf)
    return GroupBounds(MEMBERS, lower, upper)


def bounded_problem(
    seed: int, with_totals: bool, subsets: list[tuple[int, ...]] | None = None
) -> ChildrenProblem:
    """Children whose noisy answers (sigma 3) pull them away from bounds their truth meets;
    every third problem with a forbidden entry per child, every fifth a root."""
    rng = np.random.default_rng(seed)
    root = seed % 5 == 0
    k = 1 if root else int(rng.integers(2, 4))
    maps, sizes = marginal_queries(DIMS, subsets or [(), (0,), (0, 1)])
    allowed = np.ones((k, 6), dtype=bool)
    if seed % 3 == 0:
        allowed[np.arange(k), rng.integers(0, 6, k)] = False
    truth = np.where(allowed, rng.poisson(2.0, (k, 6)), 0).astype(np.int64)
    noisy = tuple(
        np.stack([np.bincount(m, row, minlength=s) for row in truth]) + rng.normal(0.0, 3.0, (k, s))
        for m, s in zip(maps, sizes, strict=True)
    )
    return ChildrenProblem(
        marginals=maps,
        marginal_sizes=sizes,
        weights=np.array([1.0, 0.5, 0.25][: len(maps)]),
        noisy=noisy,
        parent=None if root else truth.sum(axis=0),
        child_totals=truth.sum(axis=1) if with_totals else None,
        allowed=None if seed % 3 else allowed,
        group_bounds=bounds_of(rng, truth),
    )


def objective(problem: ChildrenProblem, x: np.ndarray) -> float:
    total = 0.0
    for m, s, w, y in zip(
        problem.marginals, problem.marginal_sizes, problem.weights, problem.noisy, strict=True
    ):
        fitted = np.stack([np.bincount(m, row, minlength=s) for row in x])
        total += float(w * np.sum((fitted - y) ** 2))
    return total


def least_squares_form(problem: ChildrenProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(A, b)`` with the problem's objective ``||A vec(x) - b||^2``."""
    k, n = problem.n_children, problem.n_cells
    rows, rhs = [], []
    for m, s, w, y in zip(
        problem.marginals, problem.marginal_sizes, problem.weights, problem.noisy, strict=True
    ):
        query = np.zeros((s, n))
        query[m, np.arange(n)] = 1.0
        for c in range(k):
            block = np.zeros((s, k * n))
            block[:, c * n : (c + 1) * n] = np.sqrt(w) * query
            rows.append(block)
            rhs.append(np.sqrt(w) * y[c])
    return np.vstack(rows), np.concatenate(rhs)


def slsqp(problem: ChildrenProblem | PrecisionProblem, form: tuple[np.ndarray, np.ndarray]):
    """The minimiser of ``||A vec(x) - b||^2`` (``form``) under the problem's constraints by
    SLSQP, independently of the project's solvers, over the entries that may be positive,
    without redundant equalities."""
    design, target = form
    k, n = problem.n_children, problem.n_cells
    bounds = problem.group_bounds
    assert bounds is not None
    free = np.ones((k, n), dtype=bool) if problem.allowed is None else problem.allowed.copy()
    if problem.parent is not None:
        free &= problem.parent[None, :] > 0
    index = np.flatnonzero(free.ravel())

    def full(v: np.ndarray) -> np.ndarray:
        x = np.zeros(k * n)
        x[index] = v
        return x.reshape(k, n)

    constraints = []
    if problem.parent is not None:
        parent, cells = problem.parent, np.flatnonzero(problem.parent > 0)
        if problem.child_totals is not None:
            cells = cells[:-1]  # implied by the totals and the other cells
        constraints.append(
            {"type": "eq", "fun": lambda v: full(v).sum(axis=0)[cells] - parent[cells]}
        )
    if problem.child_totals is not None:
        totals = problem.child_totals
        constraints.append({"type": "eq", "fun": lambda v: full(v).sum(axis=1) - totals})
    low = bounds.lower > 0
    high = np.isfinite(bounds.upper)
    constraints.append(
        {
            "type": "ineq",
            "fun": lambda v: np.concatenate(
                [
                    (bounds.sums(full(v)) - bounds.lower)[low],
                    (bounds.upper - bounds.sums(full(v)))[high],
                ]
            ),
        }
    )
    a = design[:, index]
    result = minimize(
        lambda v: float(np.sum((a @ v - target) ** 2)),
        np.ones(index.size),
        jac=lambda v: 2.0 * a.T @ (a @ v - target),
        method="SLSQP",
        bounds=[(0.0, None)] * index.size,
        constraints=constraints,
        options={"ftol": 1e-12, "maxiter": 5_000},
    )
    # 8: no descent direction left at this precision, which is convergence here (checked).
    assert result.status in (0, 8), result.message
    x = full(result.x)
    assert meets_every_constraint(problem, x)
    return x


def meets_every_constraint(problem: ChildrenProblem | PrecisionProblem, x: np.ndarray) -> bool:
    bounds = problem.group_bounds
    assert bounds is not None
    tol = 1e-7
    sums = bounds.sums(x)
    ok = bool(np.all(x >= -tol)) and bool(np.all(sums >= bounds.lower - tol))
    ok &= bool(np.all(sums <= bounds.upper + tol))
    if problem.allowed is not None:
        ok &= bool(np.all(x[~problem.allowed] == 0))
    if problem.parent is not None:
        ok &= bool(np.allclose(x.sum(axis=0), problem.parent, atol=tol))
    if problem.child_totals is not None:
        ok &= bool(np.allclose(x.sum(axis=1), problem.child_totals, atol=tol))
    return ok


def unbounded(problem: ChildrenProblem) -> ChildrenProblem:
    return replace(problem, group_bounds=None)


SEEDS = range(40)


@pytest.fixture(params=["multipliers", "interior_point"])
def fallback(request, monkeypatch) -> str:
    """Each bounded fallback alone: the multipliers' Newton method where it succeeds (else
    the interior-point method), or the interior-point method only."""
    if request.param == "interior_point":
        monkeypatch.setattr(bounded, "MAX_MULTIPLIER_SOLVES", 0)
    return request.param


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_totals", [False, True])
def test_least_squares_meets_the_bounds_at_the_constrained_optimum(
    seed: int, with_totals: bool, fallback: str
) -> None:
    problem = bounded_problem(seed, with_totals)
    x = solve_children(problem)
    assert meets_every_constraint(problem, x)
    reference = slsqp(problem, least_squares_form(problem))
    # The detailed query makes the objective strictly convex: one minimiser.
    assert objective(problem, x) <= objective(problem, reference) + 1e-6
    np.testing.assert_allclose(x, reference, atol=1e-4)


def test_the_bounds_bind_in_most_of_these_problems(monkeypatch) -> None:
    """Without the bounds the least squares breaks one in most test problems, so the tests
    above fail if the solvers ignore them; and the multipliers' method settles many of them."""
    broken = settled = 0
    solve_by_multipliers = bounded.solve_by_multipliers

    def counted(*args):
        nonlocal settled
        found = solve_by_multipliers(*args)
        settled += found is not None
        return found

    monkeypatch.setattr(least_squares, "solve_by_multipliers", counted)
    for seed in SEEDS:
        problem = bounded_problem(seed, with_totals=False)
        assert problem.group_bounds is not None
        broken += problem.group_bounds.violation(solve_children(unbounded(problem))) > 1e-6
        solve_children(problem)
    assert broken >= len(SEEDS) // 2
    assert settled >= broken // 3  # the rest have too many binding bounds for its budget


@pytest.mark.parametrize("seed", range(20))
def test_full_information_fit_meets_the_bounds_at_the_constrained_optimum(
    seed: int, fallback: str
) -> None:
    base = bounded_problem(seed, with_totals=seed % 2 == 1)
    rng = np.random.default_rng(100 + seed)
    k, n = base.n_children, base.n_cells
    factors = rng.normal(size=(k, n, n))
    precisions = factors @ factors.transpose(0, 2, 1) + 0.5 * np.eye(n)
    targets = rng.normal(2.0, 3.0, (k, n))
    problem = PrecisionProblem(
        targets=targets,
        precisions=precisions,
        parent=base.parent,
        child_totals=base.child_totals,
        allowed=base.allowed,
        group_bounds=base.group_bounds,
    )

    def cost(v: np.ndarray) -> float:
        d = v - targets
        return float(np.einsum("ci,cij,cj->", d, precisions, d))

    x = solve_to_targets(problem)
    assert meets_every_constraint(problem, x)
    factor = np.linalg.cholesky(precisions)  # P_c = L_c L_c^T: cost = sum_c ||L_c^T (x - t)||^2
    design = np.zeros((k * n, k * n))
    for c in range(k):
        design[c * n : (c + 1) * n, c * n : (c + 1) * n] = factor[c].T
    reference = slsqp(problem, (design, design @ targets.ravel()))
    assert cost(x) <= cost(reference) + 1e-6
    np.testing.assert_allclose(x, reference, atol=1e-4)


def best_bounded_rounding(problem: ChildrenProblem, x_hat: np.ndarray) -> float:
    """The least deviation over every floor-or-ceiling choice meeting every constraint."""
    floor = np.floor(x_hat + 1e-9)
    moving = np.argwhere(x_hat - floor > 1e-9)
    grand_total = int(np.round(x_hat.sum()))
    best = np.inf
    for bits in itertools.product((0, 1), repeat=len(moving)):
        candidate = floor.copy()
        candidate[tuple(moving.T)] += bits
        free_total = problem.parent is None and problem.child_totals is None
        if free_total and int(candidate.sum()) != grand_total:
            continue
        if meets_every_constraint(problem, candidate):
            best = min(best, deviation(problem, candidate, x_hat))
    return best


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("queries", ["nested", "crossing"])
def test_rounding_meets_the_bounds_as_well_as_brute_force(seed: int, queries: str) -> None:
    subsets = [(), (0, 1)] if queries == "nested" else [(), (0,), (1,)]
    problem = bounded_problem(seed, with_totals=False, subsets=subsets)
    x_hat = solve_children(problem)
    if int((np.abs(x_hat - np.round(x_hat)) > 1e-9).sum()) > 14:
        pytest.skip("too many fractional entries to enumerate")
    x = round_children(problem, x_hat)
    assert meets_every_constraint(problem, x)
    assert deviation(problem, x, x_hat) == pytest.approx(
        best_bounded_rounding(problem, x_hat), abs=1e-9
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_cell_level_rounding_meets_the_bounds(seed: int, monkeypatch) -> None:
    """The fallback for large crossing families (no MILP): every constraint and bound held,
    each free total within a person of its fractional value."""
    monkeypatch.setattr(rounding, "MILP_SIZE_LIMIT", 0)
    problem = bounded_problem(seed, with_totals=seed % 2 == 1, subsets=[(), (0,), (1,)])
    x_hat = solve_children(problem)
    x = round_children(problem, x_hat)
    assert meets_every_constraint(problem, x)
    assert np.all(np.abs(x.sum(axis=1) - x_hat.sum(axis=1)) < 1)


def test_group_bounds_are_validated() -> None:
    members = MEMBERS
    with pytest.raises(ValueError, match="disjoint"):
        GroupBounds(np.ones((2, 6), dtype=bool), np.zeros((1, 2)), np.full((1, 2), np.inf))
    with pytest.raises(ValueError, match="integers"):
        GroupBounds(members, np.full((1, 2), 0.5), np.full((1, 2), np.inf))
    with pytest.raises(ValueError, match="upper < lower"):
        GroupBounds(members, np.full((1, 2), 2.0), np.full((1, 2), 1.0))
    problem = bounded_problem(1, with_totals=False)
    assert problem.parent is not None
    low = np.zeros((problem.n_children, 2))
    low[0, 0] = problem.parent[:3].sum() + 1
    with pytest.raises(ValueError, match="outside its children's bounds"):
        replace(problem, group_bounds=GroupBounds(members, low, np.full(low.shape, np.inf)))
    with pytest.raises(ValueError, match="lower bounds exceed its total"):
        root = bounded_problem(0, with_totals=True)  # a root with its invariant total
        assert root.child_totals is not None
        too_many = np.array([[float(root.child_totals[0]) + 1, 0.0]])
        replace(root, group_bounds=GroupBounds(members, too_many, np.full((1, 2), np.inf)))
    forbidden = np.ones((problem.n_children, 6), dtype=bool)
    forbidden[0, :3] = False
    one = np.zeros((problem.n_children, 2))
    one[0, 0] = 1
    with pytest.raises(ValueError, match="which it may not hold"):
        bounds = GroupBounds(members, one, np.full(one.shape, np.inf))
        replace(problem, allowed=forbidden, group_bounds=bounds)


def test_a_stalled_primal_step_gives_up_at_once(monkeypatch) -> None:
    """A crossing family (seed 38) whose Hessian is singular and whose multipliers' Newton
    method shifts the linear terms far: the primal active-set method meets a zero step that
    leaves the face as it was, which every later step would repeat. It gives up at once (the
    fallbacks then solve the family) instead of repeating the step to its limit: 126 calls ran
    out their 5,000 steps before, 328,261 face solves. The answer still meets every bound."""
    solves = 0
    face_solve = least_squares._solve_face

    def counted(face, sums):
        nonlocal solves
        solves += 1
        return face_solve(face, sums)

    monkeypatch.setattr(least_squares, "_solve_face", counted)
    problem = bounded_problem(38, with_totals=False, subsets=[(), (0,), (1,)])
    x_hat = solve_children(problem)
    assert solves < 5_000
    assert meets_every_constraint(problem, round_children(problem, x_hat))
