"""round_children: optimal against brute force, constraints always hold, integral input kept,
forbidden entries (allowed masks) stay 0."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import milp

from censusdp_spark.topdown.solvers import ChildrenProblem, round_children, solve_children
from censusdp_spark.topdown.solvers.laminar_rounding import is_laminar, round_laminar
from censusdp_spark.topdown.solvers.rounding import MilpLimits
from tests.helpers.solvers import deviation, masked_problem


def small_problem(
    rng: np.random.Generator, n_children: int, with_totals: bool, root: bool = False
) -> ChildrenProblem:
    """A 2x2 histogram per child with total, one-way and detailed queries, Gaussian noise."""
    maps = (np.zeros(4, dtype=np.int64), np.array([0, 0, 1, 1]), np.arange(4))
    sizes = (1, 2, 4)
    parent = rng.integers(0, 6, size=4).astype(np.int64)
    share = rng.dirichlet(np.ones(n_children))
    children = np.stack([rng.multinomial(count, share) for count in parent], axis=1)
    noisy = tuple(
        np.stack([np.bincount(m, child, minlength=s) for child in children])
        + rng.normal(0.0, 1.5, (n_children, s))
        for m, s in zip(maps, sizes, strict=True)
    )
    return ChildrenProblem(
        marginals=maps,
        marginal_sizes=sizes,
        weights=np.array([1.0, 0.7, 0.4]),
        noisy=noisy,
        parent=None if root else parent,
        child_totals=children.sum(axis=1).astype(np.int64) if with_totals else None,
    )


def meets_constraints(problem: ChildrenProblem, x: np.ndarray, grand_total: int) -> bool:
    if problem.parent is not None and not np.array_equal(x.sum(axis=0), problem.parent):
        return False
    if problem.child_totals is not None:
        return bool(np.array_equal(x.sum(axis=1), problem.child_totals))
    return problem.parent is not None or int(x.sum()) == grand_total


def brute_force_best(problem: ChildrenProblem, x_hat: np.ndarray, grand_total: int) -> float:
    """The least deviation over every floor-or-ceiling choice that meets the constraints."""
    floor = np.floor(x_hat + 1e-9)
    moving = np.argwhere(x_hat - floor > 1e-9)
    best = np.inf
    for bits in itertools.product((0, 1), repeat=len(moving)):
        candidate = floor.copy()
        for (c, j), bit in zip(moving, bits, strict=True):
            candidate[c, j] += bit
        if meets_constraints(problem, candidate, grand_total):
            best = min(best, deviation(problem, candidate, x_hat))
    return best


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("with_totals", [False, True])
def test_rounding_is_as_good_as_brute_force(seed: int, with_totals: bool) -> None:
    rng = np.random.default_rng(seed)
    problem = small_problem(rng, int(rng.integers(2, 4)), with_totals)
    x_hat = solve_children(problem)
    x = round_children(problem, x_hat)
    assert x.dtype == np.int64
    assert meets_constraints(problem, x, 0)
    assert np.all((x == np.floor(x_hat + 1e-9)) | (x == np.floor(x_hat + 1e-9) + 1))
    best = brute_force_best(problem, x_hat, 0)
    assert deviation(problem, x, x_hat) == pytest.approx(best, abs=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_root_rounds_to_the_rounded_grand_total(seed: int) -> None:
    rng = np.random.default_rng(50 + seed)
    problem = small_problem(rng, 1, with_totals=False, root=True)
    x_hat = solve_children(problem)
    x = round_children(problem, x_hat)
    grand_total = int(np.round(x_hat.sum()))
    assert int(x.sum()) == grand_total
    assert deviation(problem, x, x_hat) == pytest.approx(
        brute_force_best(problem, x_hat, grand_total), abs=1e-9
    )


def test_root_with_invariant_total_meets_it() -> None:
    problem = small_problem(np.random.default_rng(3), 1, with_totals=True, root=True)
    x = round_children(problem, solve_children(problem))
    assert problem.child_totals is not None
    assert int(x.sum()) == int(problem.child_totals[0])


def test_constraints_hold_on_a_larger_problem() -> None:
    rng = np.random.default_rng(4)
    n_children, n_cells = 8, 24
    maps = (np.zeros(n_cells, dtype=np.int64), np.arange(n_cells) // 6, np.arange(n_cells))
    parent = rng.integers(0, 30, n_cells).astype(np.int64)
    children = np.stack(
        [rng.multinomial(c, rng.dirichlet(np.ones(n_children))) for c in parent], axis=1
    )
    noisy = tuple(
        np.stack([np.bincount(m, child, minlength=s) for child in children])
        + rng.normal(0.0, 2.0, (n_children, s))
        for m, s in zip(maps, (1, 4, n_cells), strict=True)
    )
    problem = ChildrenProblem(
        marginals=maps,
        marginal_sizes=(1, 4, n_cells),
        weights=np.ones(3),
        noisy=noisy,
        parent=parent,
        child_totals=children.sum(axis=1).astype(np.int64),
    )
    x = round_children(problem, solve_children(problem))
    np.testing.assert_array_equal(x.sum(axis=0), parent)
    np.testing.assert_array_equal(x.sum(axis=1), problem.child_totals)
    assert np.all(x >= 0)


def test_integral_input_is_returned_unchanged() -> None:
    rng = np.random.default_rng(5)
    problem = small_problem(rng, 3, with_totals=True)
    assert problem.parent is not None and problem.child_totals is not None
    integral = np.zeros((3, 4), dtype=np.int64)
    # Any integer table with the right margins: fill greedily.
    rows, cols = problem.child_totals.copy(), problem.parent.copy()
    for c in range(3):
        for j in range(4):
            integral[c, j] = min(rows[c], cols[j])
            rows[c] -= integral[c, j]
            cols[j] -= integral[c, j]
    np.testing.assert_array_equal(round_children(problem, integral.astype(float)), integral)


def test_values_within_tolerance_of_an_integer_are_that_integer() -> None:
    rng = np.random.default_rng(6)
    problem = small_problem(rng, 2, with_totals=False)
    assert problem.parent is not None
    exact = np.vstack([problem.parent, np.zeros(4, dtype=np.int64)]).astype(float)
    noisy = exact + np.array([[1e-10, -1e-10, 5e-11, -3e-10], [-1e-10, 1e-10, -5e-11, 3e-10]])
    noisy[1] = np.maximum(noisy[1], 0.0)
    np.testing.assert_array_equal(round_children(problem, noisy), exact.astype(np.int64))


def test_estimate_that_misses_the_parent_is_rejected() -> None:
    rng = np.random.default_rng(7)
    problem = small_problem(rng, 2, with_totals=False)
    x_hat = solve_children(problem) + 1.0
    with pytest.raises(ValueError, match="parent"):
        round_children(problem, x_hat)


def test_estimate_of_the_wrong_shape_is_rejected() -> None:
    problem = small_problem(np.random.default_rng(8), 2, with_totals=False)
    with pytest.raises(ValueError, match="x_hat"):
        round_children(problem, np.zeros((3, 4)))


def _roundings(problem, x_hat, totals=None):
    """Every rounding of ``x_hat`` (floor or floor + 1 per entry) meeting the parent and the
    child totals (``totals``, else the problem's), by enumeration."""
    import itertools

    floor = np.floor(x_hat + 1e-12).astype(np.int64)
    k, n = x_hat.shape
    totals = problem.child_totals if totals is None else totals
    for bits in itertools.product((0, 1), repeat=k * n):
        x = floor + np.array(bits, dtype=np.int64).reshape(k, n)
        if problem.parent is not None and not np.array_equal(x.sum(axis=0), problem.parent):
            continue
        if totals is not None and not np.array_equal(x.sum(axis=1), totals):
            continue
        yield x


def _cell_level_brute_force(problem, x_hat, totals=None):
    """Least sum |x - x_hat| over all roundings meeting the sums (independent enumeration)."""
    return min(float(np.abs(x - x_hat).sum()) for x in _roundings(problem, x_hat, totals))


def _total_deviation(x, x_hat):
    return float(np.abs(x.sum(axis=1) - x_hat.sum(axis=1)).sum())


@pytest.mark.parametrize("seed", range(20))
def test_cell_level_rounding_holds_the_closest_totals_and_is_cell_optimal_under_them(
    seed, monkeypatch
):
    import censusdp_spark.topdown.solvers.rounding as rounding
    from censusdp_spark.topdown.solvers import ChildrenProblem, solve_children

    monkeypatch.setattr(rounding, "MILP_SIZE_LIMIT", 0)
    monkeypatch.setattr(rounding, "is_laminar", lambda *_: False)
    rng = np.random.default_rng(seed)
    k, n = 3, 3
    parent = rng.integers(1, 6, n)
    totals = None
    if seed % 2:
        split = rng.multinomial(parent.sum(), np.ones(k) / k)
        totals = split.astype(np.int64)
    problem = ChildrenProblem(
        marginals=(np.arange(n), np.zeros(n, dtype=np.int64)),
        marginal_sizes=(n, 1),
        weights=np.array([1.0, 0.5]),
        noisy=(rng.normal(parent / k, 1.0, (k, n)), rng.normal(parent.sum() / k, 1.0, (k, 1))),
        parent=parent.astype(np.int64),
        child_totals=totals,
    )
    x_hat = solve_children(problem)
    x = rounding.round_children(problem, x_hat)
    assert np.array_equal(x.sum(axis=0), parent)
    if totals is not None:
        assert np.array_equal(x.sum(axis=1), totals)
    assert np.all((x == np.floor(x_hat + 1e-9)) | (x == np.floor(x_hat + 1e-9) + 1))
    if totals is None:  # the children's totals are the L1-closest of any rounding's
        best_totals = min(_total_deviation(r, x_hat) for r in _roundings(problem, x_hat))
        assert _total_deviation(x, x_hat) == pytest.approx(best_totals, abs=1e-9)
    assert float(np.abs(x - x_hat).sum()) == pytest.approx(
        _cell_level_brute_force(problem, x_hat, x.sum(axis=1)), abs=1e-9
    )


# The flow path for nested (laminar) queries, checked against the MILP on the same instances.

NESTED_QUERY_SETS = {
    "total_detailed": lambda n: (np.zeros(n, dtype=np.int64), np.arange(n)),
    "chain": lambda n: (np.zeros(n, dtype=np.int64), np.arange(n) // 3, np.arange(n)),
    # Nested but neither refines the other: {0,1},{2},{3},... against {0},{1},{2,3},...
    "nested_not_refining": lambda n: (
        np.concatenate([[0, 0], np.arange(1, n - 1)]),
        np.concatenate([[0, 1], np.arange(2, n - 1), [n - 2]]),
        np.zeros(n, dtype=np.int64),
    ),
    "no_total": lambda n: (np.arange(n) // 2, np.arange(n)),
}


def random_estimate(
    rng: np.random.Generator, maps: tuple[np.ndarray, ...], k: int, parent: bool, totals: bool
) -> tuple[ChildrenProblem, np.ndarray]:
    """``x_hat`` a random mixture of integer tables that share their margins (so it meets every
    sum exactly), fractional where the tables differ."""
    n = maps[0].shape[0]
    table = rng.integers(0, 4, size=(k, n))
    tables = [table]
    for _ in range(2):
        table = table.copy()
        for _ in range(3 * n):
            (c, d), (i, j) = rng.choice(k, 2), rng.choice(n, 2, replace=False)
            if c != d and table[c, j] > 0 and table[d, i] > 0:
                table[c, i] += 1
                table[d, j] += 1
                table[c, j] -= 1
                table[d, i] -= 1
        tables.append(table)
    x_hat = np.tensordot(rng.dirichlet(np.ones(3)), np.array(tables, dtype=float), axes=1)
    if not parent and not totals:  # the root rounds its grand total: let it be fractional
        x_hat = x_hat + rng.uniform(-0.4, 0.4, size=(1, n)) * (x_hat > 0.5)
    sizes = tuple(int(m.max()) + 1 for m in maps)
    problem = ChildrenProblem(
        marginals=maps,
        marginal_sizes=sizes,
        weights=np.ones(len(maps)),
        noisy=tuple(np.zeros((k, s)) for s in sizes),
        parent=tables[0].sum(axis=0) if parent else None,
        child_totals=tables[0].sum(axis=1) if totals else None,
    )
    return problem, x_hat


def milp_rounding(problem: ChildrenProblem, x_hat: np.ndarray, monkeypatch) -> np.ndarray:
    import censusdp_spark.topdown.solvers.rounding as rounding

    with monkeypatch.context() as patch:
        patch.setattr(rounding, "is_laminar", lambda *_: False)
        return round_children(problem, x_hat)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("queries", sorted(NESTED_QUERY_SETS))
def test_nested_queries_round_as_well_as_the_milp(seed: int, queries: str, monkeypatch) -> None:
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(4, 9))
    maps = NESTED_QUERY_SETS[queries](n)
    root = seed % 4 == 0
    k = 1 if root else int(rng.integers(2, 9))
    totals = seed % 3 == 1
    problem, x_hat = random_estimate(rng, maps, k, parent=not root, totals=totals)
    grand_total = int(np.round(x_hat.sum()))
    x = round_children(problem, x_hat)
    best = milp_rounding(problem, x_hat, monkeypatch)
    assert meets_constraints(problem, x, grand_total)
    floor = np.floor(x_hat + 1e-9)
    assert np.all((x == floor) | (x == floor + 1))
    assert deviation(problem, x, x_hat) == pytest.approx(deviation(problem, best, x_hat), abs=1e-9)


def crossing_queries() -> tuple[np.ndarray, ...]:
    """votingage (2) x hisprace (3) cells with both one-way marginals: they cross."""
    cells = np.arange(6)
    return (cells // 3, cells % 3, cells)


def test_crossing_queries_are_not_laminar_unless_the_moving_entries_avoid_the_crossing() -> None:
    everywhere = np.ones((2, 6), dtype=bool)
    assert not is_laminar(crossing_queries(), everywhere)
    one_age_group = np.array([[True, True, False, False, False, False]] * 2)
    assert is_laminar(crossing_queries(), one_age_group)
    assert is_laminar(NESTED_QUERY_SETS["chain"](6), everywhere)


@pytest.mark.parametrize(
    ("queries", "flow_size_limit", "path"),
    [("crossing", None, "milp"), ("nested", None, "flow"), ("nested", 2 * 7**2 - 1, "milp")],
)
def test_crossing_queries_and_huge_families_take_the_milp_and_nested_ones_the_flow(
    queries: str, flow_size_limit: int | None, path: str, monkeypatch
) -> None:
    import censusdp_spark.topdown.solvers.rounding as rounding

    calls: list[str] = []
    monkeypatch.setattr(
        rounding, "round_laminar", lambda *args: calls.append("flow") or round_laminar(*args)
    )
    monkeypatch.setattr(rounding, "milp", lambda *a, **kw: calls.append("milp") or milp(*a, **kw))
    if flow_size_limit is not None:
        monkeypatch.setattr(rounding, "FLOW_SIZE_LIMIT", flow_size_limit)
    maps = crossing_queries() if queries == "crossing" else NESTED_QUERY_SETS["chain"](6)
    sizes = tuple(int(m.max()) + 1 for m in maps)
    problem = ChildrenProblem(
        marginals=maps,
        marginal_sizes=sizes,
        weights=np.ones(3),
        noisy=tuple(np.zeros((2, s)) for s in sizes),
        parent=np.ones(6, np.int64),
        child_totals=None,
    )
    x = round_children(problem, np.full((2, 6), 0.5))
    assert calls == [path]
    assert meets_constraints(problem, x, 0)


@pytest.mark.parametrize("seed", [11, 16])  # families whose LP relaxation is fractional
def test_a_node_limit_reaches_every_milp_call_and_the_rounding_meets_every_constraint(
    seed: int, monkeypatch
) -> None:
    """A release rounds with a node limit, not a clock, so a rerun rounds alike: HiGHS gets it
    on the branch and bound (scipy pops it from the options it is given, so each call needs
    its own), and the rounding it stops at still meets every sum, is the same every time, and
    is within the gap of the optimum."""
    import censusdp_spark.topdown.solvers.rounding as rounding

    options: list[dict] = []

    def recording_milp(*args, **kwargs):
        if np.any(kwargs["integrality"]):
            options.append(dict(kwargs["options"]))
        return milp(*args, **kwargs)

    monkeypatch.setattr(rounding, "milp", recording_milp)
    rng = np.random.default_rng(seed)
    problem, x_hat = random_estimate(
        rng, crossing_queries(), int(rng.integers(4, 12)), parent=True, totals=seed % 2 == 0
    )
    runs = [round_children(problem, x_hat, MilpLimits(node_limit=1, abs_gap=2.0)) for _ in range(3)]
    assert options == [{"mip_rel_gap": 0.0, "mip_abs_gap": 2.0, "node_limit": 1}] * 3
    assert all(np.array_equal(run, runs[0]) for run in runs)
    assert meets_constraints(problem, runs[0], 0)
    floor = np.floor(x_hat + 1e-9)
    assert np.all((runs[0] == floor) | (runs[0] == floor + 1))
    best = round_children(problem, x_hat)
    excess = deviation(problem, runs[0], x_hat) - deviation(problem, best, x_hat)
    assert -1e-9 <= excess <= 2.0 + 1e-9


def test_a_cycle_through_one_child_twice_is_split_into_a_negative_exact_one() -> None:
    """Each child gives up two round-ups and takes two, through its total: the two passes share
    the total's node, so the cycle is split; the part kept must still gain, by its cost."""
    import censusdp_spark.topdown.solvers.laminar_rounding as laminar

    maps = NESTED_QUERY_SETS["total_detailed"](4)
    fraction = np.array([[0.9, 0.1, 0.8, 0.2], [0.1, 0.9, 0.2, 0.8]])
    b = np.array([[0, 1, 0, 1], [1, 0, 1, 0]])
    network = laminar._Network(
        maps, fraction, np.ones((2, 4), bool), np.ones(4, np.int64), np.full(2, 2)
    )
    costs = np.full((2, network.size, network.size), np.inf)
    network.update_costs(costs, b, np.arange(2))
    crossing = [(0, 1, 0), (1, 2, 1), (2, 3, 0), (3, 0, 1)]
    assert sum(costs[c, u, v] for u, v, c in crossing) < 0

    kept, gain = network.untangle(crossing, costs)

    assert len(kept) < len(crossing)
    before = b.copy()
    network.apply(kept, b)
    change = sum(
        np.abs(np.bincount(m, row - f, minlength=m.max() + 1)).sum()
        - np.abs(np.bincount(m, old - f, minlength=m.max() + 1)).sum()
        for m in maps
        for row, old, f in zip(b, before, fraction, strict=True)
    )
    assert gain < 0
    assert change == pytest.approx(gain, abs=1e-12)
    np.testing.assert_array_equal(b.sum(axis=0), np.ones(4))
    np.testing.assert_array_equal(b.sum(axis=1), np.full(2, 2))


def test_sums_that_no_rounding_meets_together_are_rejected() -> None:
    """Each cell and each child can be met alone, but not both: the estimate misses them."""
    maps = NESTED_QUERY_SETS["total_detailed"](2)
    problem = ChildrenProblem(
        marginals=maps,
        marginal_sizes=(1, 2),
        weights=np.ones(2),
        noisy=(np.zeros((2, 1)), np.zeros((2, 2))),
        parent=np.array([1, 0]),
        child_totals=np.array([0, 1]),
    )
    with pytest.raises(ValueError, match="parent and child_totals"):
        round_children(problem, np.array([[0.5, 0.0], [0.0, 0.5]]))


# --- allowed masks -----------------------------------------------------------------------


def small_masked(seed: int, with_totals: bool) -> ChildrenProblem:
    """2-3 children over 2 x 2 cells with some entries forbidden (few enough to enumerate)."""
    rng = np.random.default_rng(seed)
    return masked_problem(rng, int(rng.integers(2, 4)), (2, 2), with_totals, scale=4)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("with_totals", [False, True])
def test_a_masked_estimate_rounds_optimally_and_keeps_forbidden_entries_zero(
    seed: int, with_totals: bool
) -> None:
    problem = small_masked(700 + seed, with_totals)
    assert problem.allowed is not None
    x_hat = solve_children(problem)
    x = round_children(problem, x_hat)
    assert np.all(x[~problem.allowed] == 0)
    assert meets_constraints(problem, x, 0)
    assert deviation(problem, x, x_hat) == pytest.approx(
        brute_force_best(problem, x_hat, 0), abs=1e-9
    )


def test_an_estimate_not_zero_on_a_forbidden_entry_is_rejected() -> None:
    problem = small_masked(720, with_totals=False)
    assert problem.allowed is not None
    x_hat = solve_children(problem)
    c, j = np.argwhere(~problem.allowed)[0]
    donor = int(np.flatnonzero(problem.allowed[:, j] & (x_hat[:, j] > 0.5))[0])
    x_hat[c, j] += 0.5
    x_hat[donor, j] -= 0.5
    with pytest.raises(ValueError, match="allowed forbids"):
        round_children(problem, x_hat)
