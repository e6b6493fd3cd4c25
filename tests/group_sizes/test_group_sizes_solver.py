"""The group-size post-processing solvers (pure numpy/scipy): exactness against brute force and
HiGHS, cost-table properties, the cumulative mechanism's guarantees, and the noise scales."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy import sparse
from scipy.optimize import linprog

from censusdp_spark.group_sizes.config import load_group_sizes_config
from censusdp_spark.group_sizes.measure import NoisePlan, noise_plan, noisy_group
from censusdp_spark.group_sizes.solvers import batch, cumulative, relaxed
from censusdp_spark.group_sizes.solvers.batch import LeafFamilies, TableFamilies, Tables
from censusdp_spark.group_sizes.solvers.cost_tables import (
    CostTable,
    add_tables,
    deviation_table,
    merge_family,
    merge_tables,
    node_tables,
    solve_family,
    split_by_slopes,
)
from censusdp_spark.group_sizes.solvers.cumulative import (
    cumulative_release,
    from_cumulative,
    solve_cumulative_family,
    solve_family_certified,
    to_cumulative,
)
from censusdp_spark.group_sizes.solvers.reference_milp import solve_exact_milp
from censusdp_spark.group_sizes.solvers.relaxed import (
    RelaxedTooLarge,
    RelaxedUnreliable,
    check_relaxed_size,
    relaxed_qp,
    round_naive,
    solve_relaxed,
)
from censusdp_spark.group_sizes.solvers.tree import GroupTree, dp_release, objective, violations

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


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


def brute_force_node(tree: GroupTree, norm: str) -> int:
    """P_node's least cost over every leaf histogram summing to the leaf's G^r."""
    n, m = tree.noisy.shape
    leaves = [r for r in range(n) if not (tree.parent == r).any()]
    options = [
        [
            c
            for c in itertools.product(range(tree.groups[r] + 1), repeat=m)
            if sum(c) == tree.groups[r]
        ]
        for r in leaves
    ]
    best = None
    for combo in itertools.product(*options):
        x = derive(tree, {r: np.array(c) for r, c in zip(leaves, combo, strict=True)})
        value = cost(tree, x, norm)
        best = value if best is None or value < best else best
    assert best is not None
    return best


def brute_force_level(tree: GroupTree, norm: str) -> int:
    """P_level's least cost by enumeration: every way of putting the G groups into the
    (leaf, size) cells (stars and bars), the other nodes by summation. Shares nothing with
    the dynamic program but the objective."""
    n, m = tree.noisy.shape
    total = int(tree.groups[0])
    leaves = [r for r in range(n) if not (tree.parent == r).any()]
    cells = len(leaves) * m
    ways = list(itertools.combinations(range(total + cells - 1), total))
    stars = np.array(ways, dtype=np.int64).reshape(len(ways), total) - np.arange(total)
    leaf_x = np.zeros((len(ways), cells), dtype=np.int64)  # stars[u, i]: the cell of group i
    for i in range(total):
        np.add.at(leaf_x, (np.arange(len(ways)), stars[:, i]), 1)
    above = np.zeros((n, len(leaves)), dtype=np.int64)  # node r contains leaf l
    for col, leaf in enumerate(leaves):
        r = leaf
        while r >= 0:
            above[r, col] = 1
            r = tree.parent[r]
    x = np.einsum("rl,ulj->urj", above, leaf_x.reshape(-1, len(leaves), m))
    diff = x - tree.noisy[None]
    costs = (np.square(diff) if norm == "l2" else np.abs(diff)).sum(axis=(1, 2))
    return int(costs.min())


HOLDS = {"negative_or_fractional": 0, "inconsistent": 0, "unfaithful": 0}


# --- cost tables --------------------------------------------------------------------------------


def values(table: CostTable) -> np.ndarray:
    return np.array([table.value(v) for v in range(table.lo, table.hi + 1)])


def leaf_tables(noisy: np.ndarray, upper: int, norm: str) -> list[CostTable]:
    zeros = np.zeros(noisy.size, dtype=np.int64)
    return node_tables(noisy, zeros, np.full(noisy.size, upper), None, norm)


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_deviation_table_equals_the_norm_at_every_integer_of_its_domain(norm):
    for noisy in (-3, 0, 4, 9):
        for lo, hi in ((0, 7), (2, 5), (5, 12)):
            table = deviation_table(noisy, lo, hi, norm)
            expected = [
                (v - noisy) ** 2 if norm == "l2" else abs(v - noisy) for v in range(lo, hi + 1)
            ]
            assert values(table).tolist() == expected


def test_tables_are_convex_with_strictly_increasing_slopes():
    rng = np.random.default_rng(0)
    tree = random_tree(rng, [3, 3], 3, 6, 4)
    for norm in ("l1", "l2"):
        kids = tree.children()
        tables: list[list[CostTable]] = [[] for _ in kids]
        for r in reversed(range(len(kids))):
            merged = merge_family([tables[c] for c in kids[r]]) if kids[r].size else None
            zeros = np.zeros(3, dtype=np.int64)
            tables[r] = node_tables(tree.noisy[r], zeros, np.full(3, tree.groups[r]), merged, norm)
            for t in tables[r]:
                assert (np.diff(t.slopes) > 0).all() and (t.lengths > 0).all()
                assert (t.lo, t.hi) == (0, tree.groups[r])


def test_merge_is_the_min_plus_convolution():
    rng = np.random.default_rng(1)
    for _ in range(50):
        a = deviation_table(int(rng.integers(-3, 8)), 0, int(rng.integers(0, 6)), "l2")
        b = add_tables(deviation_table(int(rng.integers(0, 5)), 0, a.hi, "l1"), a)
        c = deviation_table(int(rng.integers(-2, 6)), 0, int(rng.integers(0, 5)), "l1")
        merged = merge_tables([b, c])
        brute = [
            min(b.value(u) + c.value(v - u) for u in range(0, v + 1) if u <= b.hi and v - u <= c.hi)
            for v in range(merged.hi + 1)
        ]
        assert values(merged).tolist() == brute


def test_a_table_on_a_sub_range_keeps_its_values():
    t = add_tables(deviation_table(3, 0, 9, "l1"), deviation_table(5, 0, 9, "l2"))
    for lo, hi in ((0, 9), (2, 6), (4, 4), (8, 9)):
        assert values(t.on(lo, hi)).tolist() == values(t)[lo : hi + 1].tolist()


def test_add_is_the_pointwise_sum():
    a, b = deviation_table(3, 0, 9, "l1"), deviation_table(5, 0, 9, "l2")
    assert (values(add_tables(a, b)) == values(a) + values(b)).all()


def test_implicit_l2_leaves_are_the_merge_of_the_listed_tables():
    """Closed-form ranks, sums and splits of l2 leaf families (several per batch) equal the
    explicit slope merge of the listed tables, for every rank up to G."""
    rng = np.random.default_rng(13)
    for _ in range(60):
        upper = int(rng.integers(1, 30))
        ks = rng.integers(1, 6, size=int(rng.integers(1, 5)))
        noisy = rng.integers(-6, 25, size=int(ks.sum()))
        family = np.repeat(np.arange(ks.size), ks)
        leaves = LeafFamilies(family, noisy.astype(np.int64), ks.size)
        for f in range(ks.size):
            kids = noisy[family == f]
            tables = [deviation_table(int(c), 0, upper, "l2") for c in kids]
            merged = merge_tables(tables)
            dense = np.repeat(merged.slopes, merged.lengths)[:upper]
            ranks = np.arange(1, upper + 1)
            slopes, _ = leaves.slope_at(np.full(upper, f), ranks)
            assert slopes.tolist() == dense.tolist()
            counts = np.arange(upper + 1)
            sums = leaves.smallest_sum(np.full(counts.size, f), counts)
            assert sums.tolist() == np.concatenate(([0], np.cumsum(dense))).tolist()
        totals = rng.integers(0, upper + 1, size=ks.size)
        split = leaves.split(totals)
        for f in range(ks.size):
            tables = [deviation_table(int(c), 0, upper, "l2") for c in noisy[family == f]]
            assert split[family == f].tolist() == split_by_slopes(tables, int(totals[f])).tolist()


def test_batched_tables_and_splits_equal_the_listed_ones():
    """Internal families: dense tables merged in one batch equal ``merge_tables`` family by
    family, and the batch split equals ``split_by_slopes``."""
    rng = np.random.default_rng(17)
    for _ in range(40):
        ks = rng.integers(1, 5, size=int(rng.integers(1, 4)))
        kids = [  # l2 tables (a slope per unit) and l1 ones (long segments), on any range
            deviation_table(int(rng.integers(-3, 12)), lo, lo + int(rng.integers(0, 9)), str(norm))
            for lo, norm in zip(
                rng.integers(0, 6, size=int(ks.sum())),
                rng.choice(["l1", "l2"], size=int(ks.sum())),
                strict=True,
            )
        ]
        family = np.repeat(np.arange(ks.size), ks)
        tables = Tables.of_segments(
            np.array([t.lo for t in kids]),
            np.array([t.base for t in kids]),
            [t.lengths for t in kids],
            [t.slopes for t in kids],
        )
        batch = TableFamilies(family, tables, ks.size)
        parent_noisy = rng.integers(-3, 30, size=ks.size)
        low, high = batch.merged_domain()
        merged = batch.parent_tables(parent_noisy, low, high)
        for f in range(ks.size):
            mine = [kids[i] for i in np.flatnonzero(family == f)]
            want = add_tables(
                deviation_table(int(parent_noisy[f]), int(low[f]), int(high[f]), "l2"),
                merge_tables(mine),
            )
            assert values(merged.cost_table(f)).tolist() == values(want).tolist()
        totals = rng.integers(low, high + 1)
        split = batch.split(totals)
        for f in range(ks.size):
            mine = [kids[i] for i in np.flatnonzero(family == f)]
            assert split[family == f].tolist() == split_by_slopes(mine, int(totals[f])).tolist()


def test_l1_tables_stay_small_whatever_the_counts():
    """An l1 table's slopes are integers in [-(h+1), h+1] at height h: work is count-free."""
    kids = [
        leaf_tables(np.array([3 * 10**5]), 10**6, "l1"),
        leaf_tables(np.array([7 * 10**5]), 10**6, "l1"),
    ]
    tables = node_tables(
        np.array([10**6]), np.array([0]), np.array([10**6]), merge_family(kids), "l1"
    )
    assert tables[0].slopes.size <= 2 * 1 + 3


def test_split_by_slopes_is_optimal_and_breaks_ties_by_index():
    tables = [deviation_table(2, 0, 5, "l1"), deviation_table(2, 0, 5, "l1")]
    assert split_by_slopes(tables, 5).tolist() == [3, 2]
    rng = np.random.default_rng(2)
    for _ in range(30):
        ts = [
            deviation_table(int(rng.integers(-2, 7)), 0, int(rng.integers(0, 5)), "l2")
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


# --- the dynamic program, level faithfulness (the paper's): exact ------------------------------


def small_tree(rng: np.random.Generator) -> GroupTree:
    """2 or 3 levels, 1..4 children per node, N <= 3, at most 4 groups, noise in -3..3."""
    shape = [int(rng.integers(1, 5)) for _ in range(int(rng.integers(1, 3)))]
    sizes = int(rng.integers(1, 4))
    for _ in range(100):
        tree = random_tree(rng, shape, sizes, 2, 3)
        if tree.groups[0] <= 4:
            return tree
    raise AssertionError("no small tree drawn")


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_dp_is_the_exact_integer_optimum_by_brute_force_on_200_random_hierarchies(norm):
    rng = np.random.default_rng(20 if norm == "l1" else 21)
    for trial in range(200):
        tree = small_tree(rng)
        release = dp_release(tree, norm, "level", width=1 if trial % 2 else 16)
        assert release.objective == brute_force_level(tree, norm), trial
        assert release.objective == release.lower_bound
        assert violations(tree, release.counts, "level") == HOLDS
        assert release.counts.dtype.kind == "i"


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_dp_equals_milp_on_larger_trees_with_larger_counts(norm):
    rng = np.random.default_rng(4)
    for _ in range(10):
        tree = random_tree(rng, [3, 3, 3], 4, 12, 6)
        release = dp_release(tree, norm, "level", width=2)
        assert release.objective == solve_exact_milp(tree, norm, "level").objective
        assert violations(tree, release.counts, "level") == HOLDS


@pytest.mark.parametrize("shift", [0, 25, -25])
def test_narrow_or_misplaced_windows_widen_until_none_binds(monkeypatch, shift):
    """Windows are a speed device only: centred anywhere, the certificate widens the cells that
    bind until the release is the exact optimum (the one of windows wider than any count)."""
    rng = np.random.default_rng(14)
    centres = batch.window_centres
    for _ in range(20):
        tree = random_tree(rng, [4, 4, 3], 3, 60, 12)
        wide = dp_release(tree, "l2", "level", 10**6)
        monkeypatch.setattr(batch, "window_centres", lambda *a: centres(*a) + shift)
        narrow = dp_release(tree, "l2", "level", width=1)
        monkeypatch.undo()
        assert narrow.objective == wide.objective == wide.lower_bound
        assert (narrow.counts == wide.counts).all()
        if shift:
            assert narrow.width > 1


def other_group_counts(tree: GroupTree, rng: np.random.Generator) -> GroupTree:
    """The same tree and noisy counts with other per-node group counts, the same G."""
    kids = tree.children()
    leaves = [r for r in range(len(kids)) if kids[r].size == 0]
    groups = np.zeros_like(tree.groups)
    groups[leaves] = rng.multinomial(int(tree.groups[0]), [1 / len(leaves)] * len(leaves))
    for r in reversed(range(len(kids))):
        if kids[r].size:
            groups[r] = groups[kids[r]].sum()
    return GroupTree(tree.parent, tree.noisy, groups)


def test_level_faithfulness_reads_no_per_node_group_count():
    rng = np.random.default_rng(15)
    tree = random_tree(rng, [3, 3], 3, 10, 4)
    other = other_group_counts(tree, rng)
    assert (other.groups != tree.groups).any()
    for norm in ("l1", "l2"):
        assert (dp_release(tree, norm).counts == dp_release(other, norm).counts).all()


def test_families_in_small_runs_give_what_one_run_gives(monkeypatch):
    """Leaf and table families cut into runs of a few items (``BLOCK_ITEMS``; a family larger
    than a run is a run of its own) give the same tables, splits and noisy values largest
    first as one run, and so does the whole DP."""
    rng = np.random.default_rng(23)
    ks = rng.integers(1, 12, size=40)
    family = np.repeat(np.arange(ks.size), ks)
    leaves = rng.integers(-8, 30, size=int(ks.sum()))
    tree = random_tree(np.random.default_rng(5), [3, 4, 5], 4, 40, 6)

    def run() -> tuple[list[np.ndarray], np.ndarray]:
        cut = LeafFamilies(family, leaves, ks.size)
        lo = rng_lo.integers(0, 20, size=ks.size)
        tables = cut.parent_tables(rng_lo.integers(-3, 40, size=ks.size), lo, lo + 6)
        internal = TableFamilies(family, tables.take(family), ks.size)
        low, high = internal.merged_domain()
        above = internal.parent_tables(np.zeros(ks.size, dtype=np.int64), low, high)
        totals = rng_lo.integers(low, high + 1)
        out = [tables.slopes, tables.base, above.slopes, above.base, above.lo]
        out += [cut.split(rng_lo.integers(0, 60, size=ks.size)), cut.largest_first()]
        out += [internal.split(totals)]
        return out, dp_release(tree, "l2").counts

    rng_lo = np.random.default_rng(1)
    whole, whole_dp = run()
    monkeypatch.setattr(batch, "BLOCK_ITEMS", 7)
    assert LeafFamilies(family, leaves, ks.size)._runs is not None
    rng_lo = np.random.default_rng(1)
    cut, cut_dp = run()
    for a, b in zip(whole, cut, strict=True):
        assert a.tolist() == b.tolist()
    assert (whole_dp == cut_dp).all()


def test_dp_is_deterministic():
    tree = random_tree(np.random.default_rng(9), [4, 4], 3, 20, 6)
    assert (dp_release(tree, "l2").counts == dp_release(tree, "l2").counts).all()


# --- dp_release's windows: centres and the level layout -----------------------------------------


def pinned_least_squares(tree: GroupTree) -> np.ndarray:
    """The centres' estimate node by node (n x N): consistent least squares summing to G at the
    root, leaf cells that come out below -1/2 held at 0 and the estimate redone until none
    does (equal variances, a held cell has variance 0)."""
    kids = tree.children()
    n, m = tree.noisy.shape
    leaf = np.array([k.size == 0 for k in kids])
    held = np.zeros((n, m), dtype=bool)
    while True:
        up = tree.noisy.astype(np.float64)
        var = np.ones((n, m))
        up[held], var[held] = 0.0, 0.0
        for r in reversed(range(n)):
            if kids[r].size:
                spread = var[kids[r]].sum(0)
                up[r] = (spread * up[r] + up[kids[r]].sum(0)) / (1 + spread)
                var[r] = spread / (1 + spread)
        x = up.copy()
        x[0] += var[0] / var[0].sum() * (tree.groups[0] - up[0].sum())
        for r in range(n):
            if kids[r].size:
                spread = var[kids[r]].sum(0)
                share = np.zeros_like(var[kids[r]])
                np.divide(var[kids[r]], spread, out=share, where=spread > 0)
                x[kids[r]] += share * (x[r] - up[kids[r]].sum(0))
        negative = leaf[:, None] & ~held & (x < -0.5)
        if not negative.any():
            return x
        held |= negative


def test_window_centres_are_the_pinned_least_squares_estimate():
    """The centres' leaf families summed up by where their free leaves end (sorted) give the
    estimate of the plain node-by-node active-set rounds."""
    rng = np.random.default_rng(17)
    for _ in range(30):
        tree = random_tree(rng, [4, 3, 3], 3, 30, 15)
        problem = batch.TreeProblem.of(tree.noisy, tree.parent, int(tree.groups[0]))
        want = problem.levels.to_levels(pinned_least_squares(tree))[:, problem.windowed]
        clear = np.abs(want - np.floor(want) - 0.5) > 1e-6  # not a rounding tie
        got = batch.window_centres(problem)
        assert (got[clear] == np.rint(want[clear])).all()


def depth_first(tree: GroupTree) -> GroupTree:
    """The same tree with its nodes numbered depth first (parents still before children)."""
    kids = tree.children()
    order, stack = [], [0]
    while stack:
        r = stack.pop()
        order.append(r)
        stack.extend(reversed(kids[r].tolist()))
    new = np.empty(len(order), dtype=np.int64)
    new[order] = np.arange(len(order))
    parent = np.where(tree.parent[order] >= 0, new[tree.parent[order]], -1)
    return GroupTree(parent, tree.noisy[order], tree.groups[order])


def test_dp_is_exact_on_trees_not_numbered_level_by_level():
    rng = np.random.default_rng(18)
    renumbered = 0
    for _ in range(10):
        tree = random_tree(rng, [3, 3, 3], 4, 12, 6)
        other = depth_first(tree)
        renumbered += (other.parent != tree.parent).any()
        release = dp_release(other, "l2", "level", width=2)
        assert release.objective == solve_exact_milp(other, "l2", "level").objective
        assert release.objective == dp_release(tree, "l2", "level").objective
        assert violations(other, release.counts, "level") == HOLDS
    assert renumbered > 0


def test_unconverged_centres_are_widened_to_the_exact_optimum(monkeypatch):
    """With no active-set round the centres ignore non-negativity and the first pass is not
    certified on these instances; the certificate still ends at the exact optimum."""
    rng = np.random.default_rng(19)
    widened = 0
    for _ in range(10):
        tree = random_tree(rng, [5, 4, 4], 4, 20, 25)
        wide = dp_release(tree, "l2", "level", 10**6)
        monkeypatch.setattr(batch, "ACTIVE_SET_ROUNDS", 0)
        narrow = dp_release(tree, "l2", "level", width=1)
        monkeypatch.undo()
        assert narrow.objective == wide.objective == wide.lower_bound
        assert (narrow.counts == wide.counts).all()
        widened += narrow.width > 1
    assert widened > 0


# --- node faithfulness (Kuo et al.): feasible, with a certificate -------------------------------


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_node_release_is_valid_consistent_node_faithful_and_bracketed_by_the_optimum(norm):
    rng = np.random.default_rng(5)
    for _ in range(20):
        tree = random_tree(rng, [3, 3, 3], 4, 8, 5)
        release = dp_release(tree, norm, "node")
        exact = solve_exact_milp(tree, norm, "node")
        assert violations(tree, release.counts, "node") == HOLDS
        assert release.lower_bound <= exact.objective <= release.objective


def test_node_release_is_exact_when_no_family_needs_repair():
    """With one child per node, node faithfulness follows from the root's."""
    rng = np.random.default_rng(6)
    for norm in ("l1", "l2"):
        for _ in range(10):
            tree = random_tree(rng, [1, 1, 1], 3, 6, 4)
            release = dp_release(tree, norm, "node")
            assert release.objective == release.lower_bound == brute_force_node(tree, norm)


def test_exact_milp_agrees_with_brute_force():
    rng = np.random.default_rng(7)
    for norm in ("l1", "l2"):
        for _ in range(10):
            tree = random_tree(rng, [2, 2], 2, 3, 2)
            assert solve_exact_milp(tree, norm, "node").objective == brute_force_node(tree, norm)
            assert solve_exact_milp(tree, norm, "level").objective == brute_force_level(tree, norm)


def test_family_step_is_the_exact_transportation_optimum():
    rng = np.random.default_rng(8)
    for trial in range(60):
        norm = ("l1", "l2")[trial % 2]
        k, n = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        groups = rng.integers(0, 5, size=k)
        tables = [leaf_tables(rng.integers(-3, 8, size=n), int(g), norm) for g in groups]
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


# --- the relaxed baseline ----------------------------------------------------------------------


@pytest.mark.parametrize("faithfulness", ["level", "node"])
def test_relaxed_qp_is_feasible_and_below_the_integer_optimum(faithfulness):
    rng = np.random.default_rng(10)
    for _ in range(10):
        tree = random_tree(rng, [3, 3], 3, 8, 5)
        x = relaxed_qp(tree, faithfulness)
        sums = np.zeros_like(x)
        np.add.at(sums, tree.parent[1:], x[1:])
        internal = np.bincount(tree.parent[1:], minlength=tree.parent.size) > 0
        assert np.allclose(sums[internal], x[internal], atol=1e-6) and (x >= 0).all()
        if faithfulness == "node":
            assert np.allclose(x.sum(1), tree.groups, atol=1e-6)
        else:
            assert abs(x[0].sum() - tree.groups[0]) < 1e-6
        assert (
            float(np.square(x - tree.noisy).sum())
            <= solve_exact_milp(tree, "l2", faithfulness).objective + 1e-6
        )


def test_relaxed_qp_with_a_fixed_root_keeps_it():
    tree = GroupTree(np.array([-1, 0, 0]), np.array([[0, 0], [5, -2], [1, 6]]), np.array([9, 4, 5]))
    for faithfulness in ("level", "node"):
        x = relaxed_qp(tree, faithfulness, fixed_root=np.array([3.5, 5.5]))
        assert np.allclose(x[0], [3.5, 5.5]) and np.allclose(x[1:].sum(0), [3.5, 5.5], atol=1e-6)


def big_tree(rng: np.random.Generator, factor: int) -> GroupTree:
    """A 1-4-28 tree whose true counts are ``factor`` times a few dozen per cell, with noise of
    scale ~10 (as the CLI's at eps = 1/2 over 3 levels): the noise is 1e-7 of the counts."""
    parent = np.array([-1] + [0] * 4 + [1 + i // 7 for i in range(28)])
    truth = np.zeros((parent.size, 5), dtype=np.int64)
    truth[5:] = rng.integers(0, 60, (28, 5)) * factor
    for r in range(parent.size - 1, 0, -1):
        truth[parent[r]] += truth[r]
    noisy = truth + rng.integers(-12, 13, truth.shape)
    return GroupTree(parent, noisy, truth.sum(1))


@pytest.mark.parametrize("faithfulness", ["level", "node"])
def test_relaxed_qp_at_counts_times_10000_is_certified_and_below_the_integer_optimum(faithfulness):
    """Unscaled, Clarabel reported "Solved" at 14x the optimum: the step from the
    clipped counts keeps the noise above its tolerances, and the dual bound confirms it."""
    rng = np.random.default_rng(17)
    for _ in range(3):
        tree = big_tree(rng, 10_000)
        solved = solve_relaxed(tree, faithfulness)
        assert solved.reliable and solved.gap < 1e-6 and solved.residual < 1e-2
        assert solved.lower_bound <= solved.objective * (1 + 1e-9)  # up to the residual
        if faithfulness == "level":  # (node's dp lists tables up to each G^r: too large here)
            integer = dp_release(tree, "l2", faithfulness).objective  # a feasible point
            assert solved.objective <= integer * (1 + 1e-9)


def test_relaxed_qp_below_a_fixed_root_at_large_counts_keeps_it():
    rng = np.random.default_rng(18)
    tree = big_tree(rng, 10_000)
    whole = solve_relaxed(tree, "level").x
    family = GroupTree(np.array([-1, 0, 0, 0, 0]), tree.noisy[:5], np.zeros(5, dtype=np.int64))
    x = relaxed_qp(family, "level", fixed_root=whole[0])
    assert np.allclose(x[1:].sum(0), whole[0], atol=1e-2) and (x >= 0).all()


def test_an_unchecked_relaxed_solution_is_reported_unreliable_not_returned(monkeypatch):
    monkeypatch.setattr(relaxed, "REFINEMENTS", 0)  # no solve: the clipped noisy counts
    tree = big_tree(np.random.default_rng(19), 1)
    solved = solve_relaxed(tree, "level")
    assert not solved.reliable and solved.report()["reliable"] is False
    with pytest.raises(RelaxedUnreliable, match="unreliable"):
        relaxed_qp(tree, "level")


def test_the_whole_tree_qp_is_refused_in_one_line_beyond_its_cell_limit():
    check_relaxed_size(relaxed.RELAXED_MAX_CELLS)
    with pytest.raises(RelaxedTooLarge, match="RELAXED_MAX_CELLS") as error:
        check_relaxed_size(relaxed.RELAXED_MAX_CELLS + 1)
    assert "\n" not in str(error.value)


def test_naive_rounding_can_break_consistency_and_violations_count_it():
    tree = GroupTree(np.array([-1, 0, 0]), np.zeros((3, 2), dtype=np.int64), np.array([3, 1, 2]))
    x = round_naive(np.array([[1.0, 2.0], [0.5, 0.5], [0.5, 1.5]]))
    assert x.tolist() == [[1, 2], [0, 0], [0, 2]]  # ties to even
    assert violations(tree, x, "node") == {
        "negative_or_fractional": 0,
        "inconsistent": 1,
        "unfaithful": 1,
    }
    assert violations(tree, x, "level") == {
        "negative_or_fractional": 0,
        "inconsistent": 1,
        "unfaithful": 1,
    }


# --- the cumulative mechanism ------------------------------------------------------------------


@pytest.fixture(params=["unit paths", "primal-dual"])
def engine(request, monkeypatch):
    """Both family engines on the same (small) families: short chains take unit paths on the
    dense hub graph, long ones primal-dual phases on the sparse network (and the isotonic fits
    by PAV); a threshold of 0 sends every family down the long path."""
    if request.param == "primal-dual":
        monkeypatch.setattr(cumulative, "DENSE_SIZES", 0)
    return request.param


def test_cumulative_round_trip():
    x = np.array([[3, 0, 2, 5], [0, 0, 0, 1]])
    assert (from_cumulative(to_cumulative(x), x.sum(1)) == x).all()


def test_cumulative_family_is_the_exact_integer_optimum(engine):
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


@pytest.mark.parametrize("faithfulness", ["level", "node"])
def test_cumulative_release_is_monotone_consistent_valid_and_faithful(faithfulness):
    rng = np.random.default_rng(12)
    for _ in range(10):
        tree = random_tree(rng, [4, 4, 4], 5, 30, 0)
        truth = tree.noisy
        exact = np.cumsum(truth, axis=1) if faithfulness == "level" else to_cumulative(truth)
        noisy = exact + rng.integers(-20, 21, size=exact.shape)
        x = cumulative_release(GroupTree(tree.parent, noisy, tree.groups), faithfulness)
        assert violations(tree, x, faithfulness) == HOLDS


def test_cumulative_level_release_reads_only_the_root_group_count():
    rng = np.random.default_rng(16)
    tree = random_tree(rng, [3, 3], 4, 20, 0)
    noisy = np.cumsum(tree.noisy, axis=1) + rng.integers(-9, 10, size=tree.noisy.shape)
    other = other_group_counts(tree, rng)
    assert (other.groups != tree.groups).any()
    a = cumulative_release(GroupTree(tree.parent, noisy, tree.groups), "level")
    b = cumulative_release(GroupTree(tree.parent, noisy, other.groups), "level")
    assert (a == b).all()


def test_cumulative_pools_a_non_monotone_root_like_isotonic_regression():
    assert solve_cumulative_family(np.array([[500, -300, 40]]), np.array([100]), None).tolist() == [
        [80, 80, 80]
    ]


def highs_window_family(
    noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray | None
) -> np.ndarray:
    """Reference: the family's integer program linearised into unit segments (TU, so a simplex
    vertex is integral) on a window around each child's clipped noisy counts, solved by HiGHS
    and widened until no window bound is active (then, by convexity, the global optimum)."""
    k, m = noisy.shape
    cap = np.broadcast_to(caps[:, None], noisy.shape)
    width = 4
    while True:
        lo = np.maximum(np.clip(noisy, 0, cap) - width, 0)
        hi = np.minimum(np.clip(noisy, 0, cap) + width, cap)
        found = highs_window(noisy, lo, hi, parent)
        whole = bool((lo == 0).all() and (hi == cap).all())
        if found is None and whole:
            raise ValueError("infeasible")
        if found is not None:
            binding = ((found == lo) & (lo > 0)) | ((found == hi) & (hi < cap))
            if whole or not binding.any():
                return found
        width *= 2


def highs_window(
    noisy: np.ndarray, lo: np.ndarray, hi: np.ndarray, parent: np.ndarray | None
) -> np.ndarray | None:
    """The exact optimum with every ``H`` restricted to ``lo..hi`` (None if infeasible)."""
    k, m = noisy.shape
    widths = (hi - lo).ravel()
    owner = np.repeat(np.arange(k * m), widths)
    if owner.size == 0:
        ok = parent is None or (lo.sum(axis=0) == parent).all()
        return lo.copy() if ok and (np.diff(lo, axis=1) >= 0).all() else None
    unit = np.arange(owner.size) - np.repeat(np.cumsum(widths) - widths, widths)
    cost = 2.0 * (lo.ravel()[owner] + unit - noisy.ravel()[owner]) + 1.0
    cell_of = sparse.csr_matrix(
        (np.ones(owner.size), (owner, np.arange(owner.size))), shape=(k * m, owner.size)
    )
    first = np.arange(k * m).reshape(k, m)[:, :-1].ravel()
    upper = cell_of[first] - cell_of[first + 1]  # H[c, j] <= H[c, j + 1]
    upper_bound = (lo.ravel()[first + 1] - lo.ravel()[first]).astype(np.float64)
    columns = sparse.csr_matrix(
        (np.ones(k * m), (np.tile(np.arange(m), k), np.arange(k * m))), shape=(m, k * m)
    )
    result = linprog(
        cost,
        A_ub=upper if first.size else None,
        b_ub=upper_bound if first.size else None,
        A_eq=None if parent is None else columns @ cell_of,
        b_eq=None if parent is None else (parent - lo.sum(axis=0)).astype(np.float64),
        bounds=(0, 1),
        method="highs-ds",
    )
    if result.status == 2:
        return None
    assert result.status == 0, result.message
    filled = np.zeros(k * m)
    np.add.at(filled, owner, np.rint(result.x))
    return lo + filled.reshape(k, m).astype(np.int64)


def brute_force_family(noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray | None) -> int:
    """Reference: the least cost over every integer chain of every child (dynamic programming
    over the children's partial column sums); -1 if infeasible."""
    k, m = noisy.shape
    costs = [
        {
            chain: sum((h - int(y)) ** 2 for h, y in zip(chain, noisy[c], strict=True))
            for chain in itertools.product(range(int(caps[c]) + 1), repeat=m)
            if all(a <= b for a, b in itertools.pairwise(chain))
        }
        for c in range(k)
    ]
    if parent is None:
        return sum(min(child.values()) for child in costs)
    states = {(0,) * m: 0}
    for c in range(k):
        room = int(caps[c + 1 :].sum())
        reached: dict[tuple[int, ...], int] = {}
        for partial, so_far in states.items():
            for chain, cost in costs[c].items():
                total = tuple(a + b for a, b in zip(partial, chain, strict=True))
                if all(parent[j] - room <= total[j] <= parent[j] for j in range(m)):
                    reached[total] = min(reached.get(total, so_far + cost), so_far + cost)
        states = reached
    return states.get(tuple(int(p) for p in parent), -1)


def random_family(
    rng: np.random.Generator, groups: int, noise: int, twins: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """1..5 children, 1..4 sizes, caps in 0..groups, true chains summed into a (feasible)
    parent (None a fifth of the time), noisy = truth + uniform noise in -noise..noise. With
    ``twins`` every child has the first one's noisy counts and cap (many ties)."""
    k, m = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    caps = np.full(k, rng.integers(0, groups + 1)) if twins else rng.integers(0, groups + 1, k)
    truth = np.sort(rng.integers(0, caps[:, None] + 1, size=(k, m)), axis=1)
    parent = None if rng.random() < 0.2 else truth.sum(axis=0)
    noisy = truth + rng.integers(-noise, noise + 1, size=truth.shape)
    return (np.repeat(noisy[:1], k, axis=0) if twins else noisy), caps, parent


def assert_feasible(found: np.ndarray, caps: np.ndarray, parent: np.ndarray | None) -> None:
    assert found.dtype == np.int64
    assert (found >= 0).all() and (found <= caps[:, None]).all()
    assert (np.diff(found, axis=1) >= 0).all()
    assert parent is None or (found.sum(axis=0) == parent).all()


def test_cumulative_family_matches_brute_force_on_300_small_random_families(engine):
    rng = np.random.default_rng(21)
    for i in range(300):
        noisy, caps, parent = random_family(rng, 3, 4, twins=i % 3 == 0)
        found = solve_cumulative_family(noisy, caps, parent)
        assert_feasible(found, caps, parent)
        assert int(np.square(found - noisy).sum()) == brute_force_family(noisy, caps, parent)


def test_cumulative_family_matches_highs_with_big_counts(engine):
    rng = np.random.default_rng(22)
    for _ in range(60):
        noisy, caps, parent = random_family(rng, 100_000, 300)
        found = solve_cumulative_family(noisy, caps, parent)
        assert_feasible(found, caps, parent)
        reference = highs_window_family(noisy, caps, parent)
        assert np.square(found - noisy).sum() == np.square(reference - noisy).sum()


def test_cumulative_family_matches_highs_on_many_children(engine):
    rng = np.random.default_rng(23)
    for _ in range(20):
        k, m = int(rng.integers(10, 40)), 7
        caps = np.full(k, 5_000)
        truth = np.sort(rng.integers(0, rng.integers(1, 300, size=(k, 1)) + 1, size=(k, m)), axis=1)
        noisy = truth + rng.integers(-12, 13, size=truth.shape)
        found = solve_cumulative_family(noisy, caps, truth.sum(axis=0))
        assert_feasible(found, caps, truth.sum(axis=0))
        reference = highs_window_family(noisy, caps, truth.sum(axis=0))
        assert np.square(found - noisy).sum() == np.square(reference - noisy).sum()


def test_cumulative_family_without_a_feasible_point_raises(engine):
    noisy = np.array([[1, 2], [0, 3]])
    with pytest.raises(ValueError, match="no monotone"):
        solve_cumulative_family(noisy, np.array([2, 2]), np.array([1, 5]))
    with pytest.raises(ValueError, match="no monotone"):
        solve_cumulative_family(noisy, np.array([2, 2]), np.array([3, 2]))


def heavy_tailed_family(
    rng: np.random.Generator, k: int, m: int, groups: int, noise: int
) -> tuple[np.ndarray, np.ndarray]:
    """k children with Poisson(groups) groups of sizes 1..m drawn with probability ~ 1/size^2:
    noisy cumulative counts (truth + uniform noise in -noise..noise) and the true ones."""
    law = np.arange(1, m + 1, dtype=np.float64) ** -2.0
    counts = np.stack([rng.multinomial(g, law / law.sum()) for g in rng.poisson(groups, k)])
    truth = np.cumsum(counts, axis=1)
    return truth + rng.integers(-noise, noise + 1, size=truth.shape), truth


@pytest.mark.parametrize("faithfulness", ["level", "node"])
def test_long_cumulative_families_match_highs(faithfulness):
    """N up to 1,000 (the primal-dual engine) against the independent HiGHS optimum; under node
    faithfulness every child's cap (its number of groups) binds the last column."""
    rng = np.random.default_rng(24)
    for k, m in [(1, 40), (2, 60), (4, 200), (7, 400), (7, 1_000)]:
        noisy, truth = heavy_tailed_family(rng, k, m, 2_000, 3)
        if faithfulness == "level":
            caps, parent = np.full(k, 10**6), truth.sum(axis=0)
        else:
            caps, parent, noisy = truth[:, -1], truth[:, :-1].sum(axis=0), noisy[:, :-1]
        found = solve_cumulative_family(noisy, caps, parent)
        assert_feasible(found, caps, parent)
        reference = highs_window_family(noisy, caps, parent)
        assert np.square(found - noisy).sum() == np.square(reference - noisy).sum()


def test_cumulative_phases_do_not_grow_with_the_number_of_sizes():
    """The work of the long-family engine, counted (not timed): primal-dual phases (one
    Dijkstra and one max flow each) stay a small constant from N = 100 to N = 5,000. Up to
    N = 1,000 the certificate's shift is checked again with the dense max-min formula (the
    other implementation of the one-chain fit): every child is its own optimum under it."""
    rng = np.random.default_rng(25)
    for m in [100, 1_000, 5_000]:
        for _ in range(3):
            noisy, truth = heavy_tailed_family(rng, 7, m, 10_000, 3)
            caps = np.full(7, 10**6)
            solution = solve_family_certified(noisy, caps, truth.sum(axis=0))
            assert solution.phases <= 8
            assert_feasible(solution.cumulative, caps, truth.sum(axis=0))
            if m <= 1_000:
                targets = 2 * noisy + solution.shift  # in halves
                own = np.clip(cumulative._dense_isotonic(targets, 2), 0, caps[:, None])
                assert (
                    np.square(2 * solution.cumulative - targets).sum(axis=1)
                    == np.square(2 * own - targets).sum(axis=1)
                ).all()


def test_isotonic_blocks_are_exact_and_match_the_dense_formula():
    rng = np.random.default_rng(26)
    for _ in range(200):
        m = int(rng.integers(1, 24))
        row = rng.integers(-50, 50, size=m) + rng.integers(0, 3) * np.arange(m)
        sums, lengths = cumulative._isotonic_blocks(row)
        assert (sums == cumulative._integer_pav(row)[0]).all()
        assert (lengths == cumulative._integer_pav(row)[1]).all()
        for scale in (1, 2):
            for halves_up in (False, True):
                dense = cumulative._dense_isotonic(row[None, :], scale, halves_up)[0]
                by_blocks = np.repeat(cumulative._rounded(sums, lengths, scale, halves_up), lengths)
                assert (dense == by_blocks).all()


def test_wrong_floating_point_blocks_are_caught_and_redone_in_integers(monkeypatch):
    class OneBlock:
        blocks = np.array([0, 8])  # pools everything: not the isotonic regression

    monkeypatch.setattr(cumulative, "isotonic_regression", lambda y: OneBlock)
    sums, lengths = cumulative._isotonic_blocks(np.array([5, 1, 7, 7, 2, 9, 9, 30]))
    assert sums.tolist() == [6, 16, 18, 30] and lengths.tolist() == [2, 3, 2, 1]


# --- noise scales -------------------------------------------------------------------------------


def test_scales_are_2l_over_epsilon_for_histograms_and_l_over_epsilon_for_cumulative():
    config = load_group_sizes_config(ROOT / "conf" / "pgsr_calm.toml", ROOT)
    levels = len(config.hierarchy.names)
    eps = config.budget.total_epsilon
    assert set(noise_plan(config, "dp").scales.values()) == {Fraction(2 * levels) / eps}
    for histogram in ("relaxed", "relaxed_families"):
        assert set(noise_plan(config, histogram).scales.values()) == {Fraction(2 * levels) / eps}
    assert set(noise_plan(config, "cumulative").scales.values()) == {Fraction(levels) / eps}


@pytest.mark.parametrize("measurement", ["histogram", "cumulative"])
def test_group_noise_has_the_planned_geometric_scale_and_not_30_percent_more(measurement):
    scale = Fraction(10)
    plan = NoisePlan(measurement, 2001, {"taz": scale})
    zeros = np.zeros((5, 2001), dtype=np.int64)
    draws = np.concatenate(
        [noisy_group(b"\x07" * 32, plan, "taz", f"{i:02d}", zeros).ravel() for i in range(2)]
    )
    alpha = np.exp(-1 / float(scale))
    variance = 2 * alpha / (1 - alpha) ** 2
    wrong = 2 * np.exp(-1 / 13.0) / (1 - np.exp(-1 / 13.0)) ** 2
    observed = draws.astype(np.float64).var()
    assert abs(observed / variance - 1) < 0.06  # about 3.5 standard errors with 20,000 draws
    assert abs(observed / wrong - 1) > 0.2


def test_group_noise_is_keyed_by_group_reproducible_and_added_to_the_exact_values():
    plan = NoisePlan("histogram", 4, {"taz": Fraction(10)})
    hist = np.array([[5, 3, 0, 1], [0, 0, 2, 7]])
    a = noisy_group(b"\x01" * 32, plan, "taz", "01", hist)
    assert a.shape == hist.shape
    assert (a == noisy_group(b"\x01" * 32, plan, "taz", "01", hist)).all()
    assert (a != noisy_group(b"\x01" * 32, plan, "taz", "02", hist)).any()
    noise = noisy_group(b"\x01" * 32, plan, "taz", "01", np.zeros_like(hist))
    assert (a - hist == noise).all()


@pytest.mark.parametrize(("faithfulness", "measured"), [("level", 4), ("node", 3)])
def test_cumulative_measurement_leaves_out_the_last_count_only_under_node_faithfulness(
    faithfulness, measured
):
    plan = NoisePlan("cumulative", 4, {"taz": Fraction(10)}, faithfulness)
    hist = np.array([[5, 3, 0, 1], [0, 0, 2, 7]])
    noise = noisy_group(b"\x01" * 32, plan, "taz", "01", np.zeros_like(hist))
    noisy = noisy_group(b"\x01" * 32, plan, "taz", "01", hist)
    assert (noisy - noise == np.cumsum(hist, axis=1)[:, :measured]).all()
