"""The group-size post-processing solvers (pure numpy/scipy): exactness against brute force and
HiGHS, cost-table properties, the cumulative mechanism's guarantees, and the noise scales."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from censusdp_spark.engine.group_sizes import NoisePlan, noise_plan, noisy_node
from censusdp_spark.model.pgsr_config import load_pgsr_config
from censusdp_spark.solvers.group_sizes import (
    CostTable,
    GroupTree,
    add_tables,
    deviation_table,
    dp_release,
    merge_tables,
    node_tables,
    objective,
    relaxed_qp,
    round_naive,
    solve_exact_milp,
    solve_family,
    split_by_slopes,
    violations,
)
from censusdp_spark.solvers.group_sizes_cumulative import (
    cumulative_release,
    from_cumulative,
    solve_cumulative_family,
    to_cumulative,
)

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def random_tree(
    rng: np.random.Generator, shape: list[int], sizes: int, groups: int, noise: int
) -> GroupTree:
    """A tree with ``shape[i]`` children per node at depth i, random truth, uniform noise."""
    parent, frontier = [-1], [0]
    for fanout in shape:
        nxt = []
        for p in frontier:
            for _ in range(int(rng.integers(1, fanout + 1))):
                parent.append(p)
                nxt.append(len(parent) - 1)
        frontier = nxt
    parents = np.array(parent)
    truth = np.zeros((parents.size, sizes), dtype=np.int64)
    for r in reversed(range(parents.size)):
        kids = np.flatnonzero(parents == r)
        truth[r] = (
            truth[kids].sum(0)
            if kids.size
            else rng.multinomial(int(rng.integers(0, groups + 1)), [1 / sizes] * sizes)
        )
    noisy = truth + rng.integers(-noise, noise + 1, size=truth.shape)
    return GroupTree(parents, noisy, truth.sum(1))


def cost(tree: GroupTree, x: np.ndarray, norm: str) -> int:
    return objective(tree, x, norm)


def derive(tree: GroupTree, leaves: dict[int, np.ndarray]) -> np.ndarray:
    x = np.zeros_like(tree.noisy)
    for r in reversed(range(tree.parent.size)):
        kids = np.flatnonzero(tree.parent == r)
        x[r] = x[kids].sum(0) if kids.size else leaves[r]
    return x


def brute_force(tree: GroupTree, norm: str, faithful: str) -> int:
    """Least cost over every integer assignment of the leaves (the rest follows by consistency)."""
    n, m = tree.noisy.shape
    leaves = [r for r in range(n) if not (tree.parent == r).any()]
    if faithful == "node":
        options = [
            [
                c
                for c in itertools.product(range(tree.groups[r] + 1), repeat=m)
                if sum(c) == tree.groups[r]
            ]
            for r in leaves
        ]
    else:
        options = [list(itertools.product(range(tree.groups[r] + 1), repeat=m)) for r in leaves]
    best = None
    for combo in itertools.product(*options):
        x = derive(tree, {r: np.array(c) for r, c in zip(leaves, combo, strict=True)})
        if faithful == "root" and (
            x.sum(1)[0] != tree.groups[0] or (x > tree.groups[:, None]).any()
        ):
            continue
        if faithful == "node" and (x.sum(1) != tree.groups).any():
            continue
        value = cost(tree, x, norm)
        best = value if best is None or value < best else best
    assert best is not None
    return best


# --- cost tables --------------------------------------------------------------------------------


def values(table: CostTable) -> np.ndarray:
    return np.array([table.value(v) for v in range(table.lo, table.hi + 1)])


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_deviation_table_equals_the_norm_at_every_integer(norm):
    for noisy in (-3, 0, 4, 9):
        table = deviation_table(noisy, 7, norm)
        expected = [(v - noisy) ** 2 if norm == "l2" else abs(v - noisy) for v in range(8)]
        assert values(table).tolist() == expected


def test_tables_are_convex_with_strictly_increasing_slopes():
    rng = np.random.default_rng(0)
    tree = random_tree(rng, [3, 3], 3, 6, 4)
    for norm in ("l1", "l2"):
        kids = tree.children()
        tables: list[list[CostTable]] = [[] for _ in kids]
        for r in reversed(range(len(kids))):
            tables[r] = node_tables(
                tree.noisy[r], int(tree.groups[r]), [tables[c] for c in kids[r]], norm
            )
            for t in tables[r]:
                assert (np.diff(t.slopes) > 0).all() and (t.lengths > 0).all()
                assert (t.lo, t.hi) == (0, tree.groups[r])


def test_merge_is_the_min_plus_convolution():
    rng = np.random.default_rng(1)
    for _ in range(50):
        a = deviation_table(int(rng.integers(-3, 8)), int(rng.integers(0, 6)), "l2")
        b = add_tables(deviation_table(int(rng.integers(0, 5)), a.hi, "l1"), a)
        c = deviation_table(int(rng.integers(-2, 6)), int(rng.integers(0, 5)), "l1")
        merged = merge_tables([b, c])
        brute = [
            min(b.value(u) + c.value(v - u) for u in range(0, v + 1) if u <= b.hi and v - u <= c.hi)
            for v in range(merged.hi + 1)
        ]
        assert values(merged).tolist() == brute


def test_add_is_the_pointwise_sum():
    a, b = deviation_table(3, 9, "l1"), deviation_table(5, 9, "l2")
    assert (values(add_tables(a, b)) == values(a) + values(b)).all()


def test_l1_tables_stay_small_whatever_the_counts():
    """An l1 table's slopes are integers in [-(h+1), h+1] at height h: work is count-free."""
    tree = GroupTree(
        np.array([-1, 0, 0]),
        np.array([[10**6], [3 * 10**5], [7 * 10**5]]),
        np.array([10**6, 4 * 10**5, 6 * 10**5]),
    )
    tables = node_tables(
        tree.noisy[0],
        10**6,
        [node_tables(tree.noisy[c], int(tree.groups[c]), [], "l1") for c in (1, 2)],
        "l1",
    )
    assert tables[0].slopes.size <= 2 * 1 + 3


def test_split_by_slopes_is_optimal_and_breaks_ties_by_index():
    tables = [deviation_table(2, 5, "l1"), deviation_table(2, 5, "l1")]
    assert split_by_slopes(tables, 5).tolist() == [3, 2]
    rng = np.random.default_rng(2)
    for _ in range(30):
        ts = [
            deviation_table(int(rng.integers(-2, 7)), int(rng.integers(0, 5)), "l2")
            for _ in range(3)
        ]
        total = int(rng.integers(0, sum(t.hi for t in ts) + 1))
        got = split_by_slopes(ts, total)
        best = min(
            sum(t.value(v) for t, v in zip(ts, c, strict=True))
            for c in itertools.product(*[range(t.hi + 1) for t in ts])
            if sum(c) == total
        )
        assert (
            got.sum() == total
            and sum(t.value(int(v)) for t, v in zip(ts, got, strict=True)) == best
        )


# --- the dynamic program -----------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_dp_lower_bound_is_the_exact_optimum_of_p_dp_by_brute_force(norm):
    rng = np.random.default_rng(3)
    for _ in range(25):
        tree = random_tree(rng, [2, 2], 2, 2, 2)
        assert dp_release(tree, norm).lower_bound == brute_force(tree, norm, "root")


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_dp_lower_bound_equals_milp_on_small_trees(norm):
    rng = np.random.default_rng(4)
    for _ in range(20):
        tree = random_tree(rng, [3, 3, 3], 4, 8, 5)
        assert dp_release(tree, norm).lower_bound == solve_exact_milp(tree, norm, "root").objective


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_dp_release_is_valid_consistent_faithful_and_bracketed_by_the_exact_optimum(norm):
    rng = np.random.default_rng(5)
    for _ in range(20):
        tree = random_tree(rng, [3, 3, 3], 4, 8, 5)
        release = dp_release(tree, norm)
        exact = solve_exact_milp(tree, norm, "node")
        assert violations(tree, release.counts) == {
            "negative_or_fractional": 0,
            "inconsistent": 0,
            "unfaithful": 0,
        }
        assert release.lower_bound <= exact.objective <= release.objective


def test_dp_release_is_exact_when_no_family_needs_repair():
    """With one child per node, node faithfulness follows from the root's: P = P_dp."""
    rng = np.random.default_rng(6)
    for norm in ("l1", "l2"):
        for _ in range(10):
            tree = random_tree(rng, [1, 1, 1], 3, 6, 4)
            release = dp_release(tree, norm)
            assert release.objective == release.lower_bound == brute_force(tree, norm, "node")


def test_exact_milp_agrees_with_brute_force():
    rng = np.random.default_rng(7)
    for norm in ("l1", "l2"):
        for _ in range(10):
            tree = random_tree(rng, [2, 2], 2, 3, 2)
            assert solve_exact_milp(tree, norm, "node").objective == brute_force(tree, norm, "node")


def test_family_step_is_the_exact_transportation_optimum():
    rng = np.random.default_rng(8)
    for trial in range(60):
        norm = ("l1", "l2")[trial % 2]
        k, n = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        groups = rng.integers(0, 5, size=k)
        tables = [node_tables(rng.integers(-3, 8, size=n), int(g), [], norm) for g in groups]
        parent = rng.multinomial(int(groups.sum()), [1 / n] * n)
        got = solve_family(tables, parent, groups)
        assert (got.sum(0) == parent).all() and (got.sum(1) == groups).all() and (got >= 0).all()
        total = sum(tables[c][j].value(int(got[c, j])) for c in range(k) for j in range(n))
        rows = [
            [r for r in itertools.product(range(g + 1), repeat=n) if sum(r) == g] for g in groups
        ]
        best = min(
            sum(tables[c][j].value(combo[c][j]) for c in range(k) for j in range(n))
            for combo in itertools.product(*rows)
            if (np.array(combo).reshape(k, n).sum(0) == parent).all()
        )
        assert total == best


def test_dp_is_deterministic():
    tree = random_tree(np.random.default_rng(9), [4, 4], 3, 20, 6)
    assert (dp_release(tree, "l2").counts == dp_release(tree, "l2").counts).all()


# --- the relaxed baseline ----------------------------------------------------------------------


def test_relaxed_qp_is_feasible_and_below_the_integer_optimum():
    rng = np.random.default_rng(10)
    for _ in range(10):
        tree = random_tree(rng, [3, 3], 3, 8, 5)
        x = relaxed_qp(tree)
        sums = np.zeros_like(x)
        np.add.at(sums, tree.parent[1:], x[1:])
        internal = np.bincount(tree.parent[1:], minlength=tree.parent.size) > 0
        assert np.allclose(sums[internal], x[internal], atol=1e-6)
        assert np.allclose(x.sum(1), tree.groups, atol=1e-6) and (x >= 0).all()
        assert (
            float(np.square(x - tree.noisy).sum())
            <= solve_exact_milp(tree, "l2", "node").objective + 1e-6
        )


def test_relaxed_qp_with_a_fixed_root_keeps_it():
    tree = GroupTree(np.array([-1, 0, 0]), np.array([[0, 0], [5, -2], [1, 6]]), np.array([9, 4, 5]))
    x = relaxed_qp(tree, fixed_root=np.array([3.5, 5.5]))
    assert np.allclose(x[0], [3.5, 5.5]) and np.allclose(x[1:].sum(0), [3.5, 5.5], atol=1e-6)


def test_naive_rounding_can_break_consistency_and_violations_count_it():
    tree = GroupTree(np.array([-1, 0, 0]), np.zeros((3, 2), dtype=np.int64), np.array([3, 1, 2]))
    x = round_naive(np.array([[1.0, 2.0], [0.5, 0.5], [0.5, 1.5]]))
    assert x.tolist() == [[1, 2], [0, 0], [0, 2]]  # ties to even
    assert violations(tree, x) == {"negative_or_fractional": 0, "inconsistent": 1, "unfaithful": 1}


# --- the cumulative mechanism ------------------------------------------------------------------


def test_cumulative_round_trip():
    x = np.array([[3, 0, 2, 5], [0, 0, 0, 1]])
    assert (from_cumulative(to_cumulative(x), x.sum(1)) == x).all()


def test_cumulative_family_is_the_exact_integer_optimum():
    rng = np.random.default_rng(11)

    def chains(g: int, m: int) -> list[tuple[int, ...]]:
        return [
            c
            for c in itertools.product(range(g + 1), repeat=m)
            if all(a <= b for a, b in itertools.pairwise(c))
        ]

    for _ in range(60):
        k, m = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        groups = rng.integers(0, 5, size=k)
        noisy = rng.integers(-4, 9, size=(k, m))
        parent = (
            None
            if rng.random() < 0.3
            else to_cumulative(rng.multinomial(int(groups.sum()), [1 / (m + 1)] * (m + 1)))
        )
        got = solve_cumulative_family(noisy, groups, parent)
        best = min(
            int(np.square(np.array(c) - noisy).sum())
            for c in itertools.product(*[chains(int(g), m) for g in groups])
            if parent is None or (np.array(c).sum(0) == parent).all()
        )
        assert int(np.square(got - noisy).sum()) == best


def test_cumulative_release_is_monotone_consistent_valid_and_faithful():
    rng = np.random.default_rng(12)
    for _ in range(10):
        tree = random_tree(rng, [4, 4, 4], 5, 30, 0)
        truth = tree.noisy
        noisy = to_cumulative(truth) + rng.integers(
            -20, 21, size=(truth.shape[0], truth.shape[1] - 1)
        )
        x = cumulative_release(GroupTree(tree.parent, noisy, tree.groups))
        assert violations(tree, x) == {
            "negative_or_fractional": 0,
            "inconsistent": 0,
            "unfaithful": 0,
        }


def test_cumulative_pools_a_non_monotone_root_like_isotonic_regression():
    assert solve_cumulative_family(np.array([[500, -300, 40]]), np.array([100]), None).tolist() == [
        [80, 80, 80]
    ]


# --- noise scales -------------------------------------------------------------------------------


def test_scales_are_2l_over_epsilon_for_histograms_and_l_over_epsilon_for_cumulative():
    config = load_pgsr_config(ROOT / "conf" / "pgsr_calm.toml", ROOT)
    levels = len(config.hierarchy.names)
    eps = config.budget.total_epsilon
    assert set(noise_plan(config, "dp").scales.values()) == {Fraction(2 * levels) / eps}
    assert set(noise_plan(config, "relaxed").scales.values()) == {Fraction(2 * levels) / eps}
    assert set(noise_plan(config, "cumulative").scales.values()) == {Fraction(levels) / eps}


@pytest.mark.parametrize("measurement", ["histogram", "cumulative"])
def test_node_noise_has_the_planned_geometric_scale_and_not_30_percent_more(measurement):
    scale = Fraction(10)
    plan = NoisePlan(measurement, 2001, {"taz": scale})
    zeros = np.zeros(2001, dtype=np.int64)
    draws = np.concatenate(
        [noisy_node(b"\x07" * 32, plan, "taz", f"{i:04d}", zeros) for i in range(10)]
    )
    alpha = np.exp(-1 / float(scale))
    variance = 2 * alpha / (1 - alpha) ** 2
    wrong = 2 * np.exp(-1 / 13.0) / (1 - np.exp(-1 / 13.0)) ** 2
    observed = draws.astype(np.float64).var()
    assert abs(observed / variance - 1) < 0.06  # about 3.5 standard errors with 20,000 draws
    assert abs(observed / wrong - 1) > 0.2


def test_node_noise_is_keyed_and_reproducible():
    plan = NoisePlan("histogram", 4, {"taz": Fraction(10)})
    hist = np.array([5, 3, 0, 1])
    a = noisy_node(b"\x01" * 32, plan, "taz", "0001", hist)
    assert (a == noisy_node(b"\x01" * 32, plan, "taz", "0001", hist)).all()
    assert (a != noisy_node(b"\x01" * 32, plan, "taz", "0002", hist)).any()
