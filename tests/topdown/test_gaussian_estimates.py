"""The bottom-up pass's Gaussian estimates against an independent dense GLS solve of every
node's whole subtree."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import null_space

from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.solvers.gaussian_estimates import (
    Gaussian,
    LevelDesign,
    fitting_targets,
    hold_zeros,
    leaf_covariance,
    leaf_estimates,
    node_estimate,
)
from censusdp_spark.topdown.solvers.least_squares import solve_to_targets
from censusdp_spark.topdown.solvers.subproblem import PrecisionProblem
from censusdp_spark.topdown.solvers.symmetric_covariance import SymmetricMatrix, covariance_layout
from tests.helpers.solvers import marginal_queries, random_schema

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Node:
    depth: int
    children: list[Node] = field(default_factory=list)
    answers: tuple[np.ndarray, ...] = ()
    total: float | None = None
    truth: np.ndarray | None = None
    zeros: np.ndarray | None = None  # a leaf's cells held at 0 (an occupancy rule)

    def leaves(self) -> list[Node]:
        return [self] if not self.children else [x for c in self.children for x in c.leaves()]

    def nodes(self) -> list[Node]:
        return [self, *[x for c in self.children for x in c.nodes()]]


def random_designs(rng: np.random.Generator, depth: int) -> list[LevelDesign]:
    """One design per level over a random small schema with random structural zeros; the leaf
    level always identifies every cell (detailed, or a total plus detailed-over-the-rest)."""
    dims = [(2,), (3,), (2, 2), (2, 3), (3, 2), (2, 2, 2)][rng.integers(6)]
    axes = list(range(len(dims)))
    candidates = [(), tuple(axes)] + [(a,) for a in axes] + ([(0, 1)] if len(dims) == 3 else [])
    n_full = int(np.prod(dims))
    active = np.sort(
        rng.choice(n_full, size=rng.integers(max(1, n_full - 2), n_full + 1), replace=False)
    )
    designs = []
    for level in range(depth):
        picked = [
            candidates[i] for i in rng.choice(len(candidates), rng.integers(1, 4), replace=False)
        ]
        if level == depth - 1 and tuple(axes) not in picked:
            picked.append(tuple(axes))
        maps, sizes = marginal_queries(dims, picked)
        weights = rng.uniform(0.2, 5.0, len(picked))
        if level < depth - 1 and rng.random() < 0.2:
            weights[rng.integers(len(picked))] = 0.0
        designs.append(
            LevelDesign(
                level=str(level),
                marginals=tuple(m[active] for m in maps),
                marginal_sizes=sizes,
                weights=weights,
            )
        )
    return designs


def random_tree(
    rng: np.random.Generator,
    designs: list[LevelDesign],
    invariant_depth: int,
    zero_rate: float = 0.0,
    zero_groups: np.ndarray | None = None,
) -> Node:
    """A tree with random fan-out (single children included), true integer histograms, noisy
    answers and invariant totals down to ``invariant_depth`` (-1: none); with ``zero_rate``,
    each leaf holds each group of cells (``zero_groups``, a group per cell; default each cell
    its own) at 0 with that probability (its truth 0 there)."""
    depth = len(designs)
    n = designs[0].n_cells

    def grow(d: int) -> Node:
        node = Node(d)
        if d < depth - 1:
            node.children = [grow(d + 1) for _ in range(rng.integers(1, 4))]
            node.truth = np.sum([c.truth for c in node.children], axis=0)
        else:
            node.truth = rng.poisson(5.0, n).astype(float)
            if zero_rate:
                groups = np.arange(n) if zero_groups is None else zero_groups
                node.zeros = (rng.random(int(groups.max()) + 1) < zero_rate)[groups]
                node.truth[node.zeros] = 0.0
        design = designs[d]
        node.answers = tuple(
            np.bincount(m, node.truth, minlength=s) + rng.normal(0, 1 / np.sqrt(max(w, 1e-3)), s)
            for m, s, w in zip(design.marginals, design.marginal_sizes, design.weights, strict=True)
        )
        node.total = float(node.truth.sum()) if d <= invariant_depth else None
        return node

    return grow(0)


def bottom_up(node: Node, designs: list[LevelDesign], out: dict[int, Gaussian]) -> Gaussian:
    design = designs[node.depth]
    if not node.children:
        totals = None if node.total is None else np.array([node.total])
        means, covariance = leaf_estimates(design, [a[None, :] for a in node.answers], totals)
        zeros = node.zeros
        if zeros is not None and zeros.any():
            means, covariance = hold_zeros(means, covariance, zeros)
        else:
            zeros = None
        estimate = Gaussian(means[0], covariance, node.total, zeros)
    else:
        estimate = node_estimate(
            [bottom_up(c, designs, out) for c in node.children], design, node.answers, node.total
        )
    out[id(node)] = estimate
    return estimate


def dense_gls(node: Node, designs: list[LevelDesign]) -> tuple[np.ndarray, np.ndarray]:
    """The constrained GLS estimate of ``node``'s histogram from every measurement in its
    subtree, solved directly: unknowns are all its leaves' histograms, stacked rows
    ``sqrt(w) Q_q (sum of leaves under u)`` for every node ``u``, and the invariant totals and
    the leaves' cells held at 0 as equality constraints eliminated with a null-space basis."""
    leaves = node.leaves()
    position = {id(leaf): i for i, leaf in enumerate(leaves)}
    n = designs[0].n_cells
    unknowns = len(leaves) * n
    rows, rhs, constraints, targets = [], [], [], []
    for u in node.nodes():
        under = np.zeros(len(leaves))
        under[[position[id(leaf)] for leaf in u.leaves()]] = 1.0
        design = designs[u.depth]
        for m, s, w, y in zip(
            design.marginals, design.marginal_sizes, design.weights, u.answers, strict=True
        ):
            if w == 0:
                continue
            query = np.zeros((s, n))
            query[m, np.arange(n)] = 1.0
            rows.append(np.sqrt(w) * np.kron(under, query))
            rhs.append(np.sqrt(w) * y)
        if u.total is not None:
            constraints.append(np.kron(under, np.ones(n)))
            targets.append(u.total)
        if u.zeros is not None:
            for cell in np.flatnonzero(u.zeros):
                constraints.append(np.kron(under, np.eye(n)[cell]))
                targets.append(0.0)
    design_matrix, y = np.vstack(rows), np.concatenate(rhs)
    if constraints:
        c, t = np.vstack(constraints), np.array(targets)
        particular = np.linalg.lstsq(c, t, rcond=None)[0]
        basis = null_space(c)
    else:
        particular, basis = np.zeros(unknowns), np.eye(unknowns)
    if basis.shape[1] == 0:
        x, cov = particular, np.zeros((unknowns, unknowns))
    else:
        reduced = design_matrix @ basis
        inverse = np.linalg.inv(reduced.T @ reduced)
        u_hat = inverse @ reduced.T @ (y - design_matrix @ particular)
        x, cov = particular + basis @ u_hat, basis @ inverse @ basis.T
    summing = np.kron(np.ones(len(leaves)), np.eye(n))
    return summing @ x, summing @ cov @ summing.T


def assert_close(actual: np.ndarray, expected: np.ndarray, scale: float) -> None:
    assert np.max(np.abs(actual - expected)) <= 1e-9 * scale, np.max(np.abs(actual - expected))


def every_node_matches_the_dense_gls(tree: Node, designs: list[LevelDesign]) -> dict[int, Gaussian]:
    """The bottom-up pass over ``tree``, every node's mean and covariance checked against the
    independent dense GLS of its subtree (1e-9)."""
    estimates: dict[int, Gaussian] = {}
    bottom_up(tree, designs, estimates)
    for node in tree.nodes():
        mean, covariance = dense_gls(node, designs)
        got = estimates[id(node)]
        assert_close(got.mean, mean, max(1.0, float(np.abs(mean).max())))
        assert_close(got.covariance, covariance, max(1e-6, float(np.abs(covariance).max())))
    return estimates


@pytest.mark.parametrize("seed", range(120))
def test_every_node_equals_the_dense_gls_of_its_subtree(seed):
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(2, 5))
    designs = random_designs(rng, depth)
    tree = random_tree(rng, designs, invariant_depth=int(rng.integers(-1, depth)))
    estimates = every_node_matches_the_dense_gls(tree, designs)
    for node in tree.nodes():
        got = estimates[id(node)]
        if node.total is not None:
            assert got.total == node.total
            assert abs(got.mean.sum() - node.total) <= 1e-9 * max(1.0, node.total)


@pytest.mark.parametrize("seed", range(100))
def test_leaves_cells_held_at_zero_give_every_node_the_constrained_dense_gls(seed):
    """Occupancy zeros at the leaves (exact constraints, like the totals): every node's
    estimate and covariance equal the dense GLS with those cells held at 0, a parent's cells
    are known zeros exactly where all its leaves' are, and the precision on the other cells is
    the covariance's inverse there (with an exact total, on the constrained set)."""
    rng = np.random.default_rng(1000 + seed)
    depth = int(rng.integers(2, 5))
    designs = random_designs(rng, depth)
    tree = random_tree(rng, designs, int(rng.integers(-1, depth)), zero_rate=0.3)
    estimates = every_node_matches_the_dense_gls(tree, designs)
    for node in tree.nodes():
        got = estimates[id(node)]
        held = np.logical_and.reduce([leaf.zeros for leaf in node.leaves()])
        expected = held if held.any() else None
        assert (got.zeros is None) == (expected is None)
        if expected is not None:
            assert np.array_equal(got.zeros, expected)
            assert not got.mean[expected].any() and not got.covariance[expected].any()
        free = ~held
        precision = got.precision()
        sub = got.covariance[np.ix_(free, free)]
        if got.total is None and free.any():
            assert_close(precision[np.ix_(free, free)] @ sub, np.eye(int(free.sum())), 1e3)


def test_a_parent_with_one_child_combines_both_levels_as_one_histogram():
    rng = np.random.default_rng(7)
    maps, sizes = marginal_queries((2, 3), [(), (0, 1)])
    child_design = LevelDesign(
        level="child", marginals=maps, marginal_sizes=sizes, weights=np.array([1.0, 2.0])
    )
    parent_design = LevelDesign(
        level="parent", marginals=maps, marginal_sizes=sizes, weights=np.array([3.0, 0.5])
    )
    child_answers = [rng.normal(5, 1, s) for s in sizes]
    parent_answers = [rng.normal(5, 1, s) for s in sizes]
    means, covariance = leaf_estimates(child_design, [a[None, :] for a in child_answers], None)
    parent = node_estimate([Gaussian(means[0], covariance)], parent_design, parent_answers, None)
    # One histogram measured by both levels' queries: ordinary GLS on the stacked rows.
    stacked = LevelDesign(
        level="both",
        marginals=maps + maps,
        marginal_sizes=sizes + sizes,
        weights=np.array([1.0, 2.0, 3.0, 0.5]),
    )
    gls_means, gls_cov = leaf_estimates(
        stacked, [a[None, :] for a in child_answers + parent_answers], None
    )
    np.testing.assert_allclose(parent.mean, gls_means[0], rtol=1e-10)
    np.testing.assert_allclose(parent.covariance, gls_cov, rtol=1e-10, atol=1e-14)


def test_a_leaf_level_that_does_not_identify_every_cell_is_refused_by_name():
    maps, sizes = marginal_queries((2, 3), [(), (0,), (1,)])
    design = LevelDesign(
        level="block",
        marginals=maps,
        marginal_sizes=sizes,
        weights=np.ones(3),
        rule="budget.levels.block.queries",
    )
    with pytest.raises(ValueError, match=r"level block: .*budget\.levels\.block\.queries"):
        leaf_covariance(design, with_totals=False)
    # A marginal query's null space lies in 1^perp, so an invariant total never identifies more.
    maps, sizes = marginal_queries((2,), [()])
    with pytest.raises(ValueError, match="level block: its queries together with the invariant"):
        leaf_covariance(
            LevelDesign(level="block", marginals=maps, marginal_sizes=sizes, weights=np.ones(1)),
            with_totals=True,
        )


def test_precision_with_an_exact_total_is_the_inverse_on_the_constrained_set():
    rng = np.random.default_rng(3)
    maps, sizes = marginal_queries((2, 2), [(), (0, 1)])
    design = LevelDesign(
        level="leaf", marginals=maps, marginal_sizes=sizes, weights=np.array([1.0, 2.0])
    )
    covariance = leaf_covariance(design, with_totals=True)
    estimate = Gaussian(np.full(4, 2.5), covariance, 10.0)
    basis = null_space(np.ones((1, 4)))
    expected = basis @ np.linalg.inv(basis.T @ covariance @ basis) @ basis.T
    d = basis @ rng.normal(size=3)
    assert d @ estimate.precision() @ d == pytest.approx(d @ expected @ d, rel=1e-10)


def test_a_lone_child_is_released_as_the_roots_blue():
    """Root with one child: the root is fitted to its BLUE (from both levels' measurements)
    and the child takes the root's value, so no level's budget is lost."""
    rng = np.random.default_rng(2)
    maps, sizes = marginal_queries((2, 2), [(), (0, 1)])
    child = LevelDesign(
        level="child", marginals=maps, marginal_sizes=sizes, weights=np.array([0.5, 2.0])
    )
    root = LevelDesign(
        level="root", marginals=maps, marginal_sizes=sizes, weights=np.array([4.0, 1.0])
    )
    truth = np.array([40.0, 25.0, 30.0, 55.0])
    answers = {
        d.level: [
            np.bincount(m, truth, minlength=s) + rng.normal(0, 1, s)
            for m, s in zip(maps, sizes, strict=True)
        ]
        for d in (child, root)
    }
    means, covariance = leaf_estimates(child, [a[None, :] for a in answers["child"]], None)
    blue = node_estimate([Gaussian(means[0], covariance)], root, answers["root"], None)
    fitted_root = solve_to_targets(
        PrecisionProblem(
            targets=blue.mean[None, :],
            precisions=blue.precision()[None],
            parent=None,
            child_totals=None,
        )
    )
    np.testing.assert_allclose(fitted_root[0], blue.mean, rtol=1e-10)
    released_root = np.round(fitted_root[0]).astype(np.int64)
    child_fit = solve_to_targets(
        PrecisionProblem(
            targets=means,
            precisions=np.linalg.inv(covariance)[None],
            parent=released_root,
            child_totals=None,
        )
    )
    np.testing.assert_array_equal(child_fit[0], released_root)


def compact_designs(
    rng: np.random.Generator, depth: int
) -> tuple[list[LevelDesign], list[LevelDesign]]:
    """The same random levels twice: with dense covariances and with the compact layout, over a
    random schema with symmetric and recoded attributes and structural zeros on recoded ones."""
    while True:
        shape, zeros, per_level, _ = random_schema(rng, depth, max_cells=36)
        every = [q for queries in per_level for q, _ in queries]
        names = [f"a{a}" for a in range(len(shape))]
        layout = covariance_layout(shape, names, zeros, every, small_cells=0)
        if layout is not None:
            break
    active = np.setdiff1d(np.arange(int(np.prod(shape))), zeros)
    dense, compact = [], []
    for level, queries in enumerate(per_level):
        weights = rng.uniform(0.2, 5.0, len(queries))
        if level < depth - 1 and rng.random() < 0.2:
            weights[rng.integers(len(queries))] = 0.0
        marginals = tuple(q[active] for q, _ in queries)
        sizes = tuple(size for _, size in queries)
        dense.append(
            LevelDesign(
                level=str(level), marginals=marginals, marginal_sizes=sizes, weights=weights
            )
        )
        compact.append(
            LevelDesign(
                level=str(level),
                marginals=marginals,
                marginal_sizes=sizes,
                weights=weights,
                layout=layout,
            )
        )
    return dense, compact


def assert_compact_equals(got: Gaussian, expected: Gaussian, rtol: float = 1e-9) -> None:
    assert isinstance(got.covariance, SymmetricMatrix)
    assert got.total == expected.total
    assert_close(got.mean, expected.mean, max(1.0, float(np.abs(expected.mean).max())))
    dense = np.asarray(expected.covariance)
    assert_close(
        got.covariance.to_dense(), dense, max(1e-6, float(np.abs(dense).max())) * rtol / 1e-9
    )
    precision = np.asarray(expected.precision())
    compact_precision = got.precision()
    assert isinstance(compact_precision, SymmetricMatrix)
    assert_close(
        compact_precision.to_dense(), precision, float(np.abs(precision).max()) * rtol / 1e-9
    )


def both_passes_match_the_dense_gls(
    tree: Node, dense_levels: list[LevelDesign], compact_levels: list[LevelDesign]
) -> tuple[dict[int, Gaussian], dict[int, Gaussian]]:
    """The dense and compact passes over ``tree``, every compact node checked against the
    independent dense GLS and the dense pass (means, covariances and precisions)."""
    dense: dict[int, Gaussian] = {}
    compact: dict[int, Gaussian] = {}
    bottom_up(tree, dense_levels, dense)
    bottom_up(tree, compact_levels, compact)
    for node in tree.nodes():
        mean, covariance = dense_gls(node, dense_levels)
        got = compact[id(node)]
        assert_close(got.mean, mean, max(1.0, float(np.abs(mean).max())))
        assert isinstance(got.covariance, SymmetricMatrix)
        assert_close(
            got.covariance.to_dense(), covariance, max(1e-6, float(np.abs(covariance).max()))
        )
        assert_compact_equals(got, dense[id(node)])
    return dense, compact


@pytest.mark.parametrize("seed", range(100))
def test_the_compact_covariance_gives_every_node_the_dense_gls_of_its_subtree(seed):
    """Random schemas with symmetric and recoded attributes, random query sets, structural
    zeros and invariants: the compact pass equals the independent dense GLS and the dense pass
    (means, covariances and precisions), and so do the top-down pass's targets."""
    rng = np.random.default_rng(1000 + seed)
    depth = int(rng.integers(2, 5))
    dense_levels, compact_levels = compact_designs(rng, depth)
    tree = random_tree(rng, dense_levels, invariant_depth=int(rng.integers(-1, depth)))
    dense, compact = both_passes_match_the_dense_gls(tree, dense_levels, compact_levels)
    children = [c for c in tree.children] or [tree]
    free = rng.random(dense_levels[0].n_cells) < 0.7
    free[0] = True
    expected = fitting_targets(
        [dense[id(c)] for c in children], [dense[id(c)].precision() for c in children], free
    )
    got_targets = fitting_targets(
        [compact[id(c)] for c in children], [compact[id(c)].precision() for c in children], free
    )
    for a, b in zip(got_targets, expected, strict=True):
        assert_close(a, b, max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("seed", range(60))
def test_whole_core_cells_held_at_zero_give_the_compact_pass_the_constrained_dense_gls(seed):
    """Occupancy zeros over the attributes not held symmetric (whole core cells) at the
    leaves: the compact pass equals the constrained dense GLS and the dense pass, precisions
    included, and its zeros are exact."""
    rng = np.random.default_rng(5000 + seed)
    depth = int(rng.integers(2, 5))
    dense_levels, compact_levels = compact_designs(rng, depth)
    layout = compact_levels[0].layout
    assert layout is not None
    tree = random_tree(
        rng, dense_levels, int(rng.integers(-1, depth)), zero_rate=0.4, zero_groups=layout.core_of
    )
    _, compact = both_passes_match_the_dense_gls(tree, dense_levels, compact_levels)
    for got in compact.values():
        assert isinstance(got.covariance, SymmetricMatrix)
        if got.zeros is not None:
            assert not got.mean[got.zeros].any()
            assert not got.covariance.to_dense()[got.zeros].any()


def production_designs() -> tuple[list[LevelDesign], list[LevelDesign]]:
    """The 2,016-cell production config's block group and block levels (its queries and noise
    variances), dense and compact."""
    config = load_topdown_config(ROOT / "conf" / "pl94_2020_production.toml", ROOT)
    every = [q.cell_to_marginal for lv in config.hierarchy.names for q in config.queries[lv]]
    layout = covariance_layout(
        config.schema.shape, config.schema.names, config.structural_zero_cells, every
    )
    assert layout is not None and layout.names == ("hispanic", "cenrace")
    assert layout.core_cells == 15 and layout.n_components == 4
    active = np.setdiff1d(np.arange(config.schema.n_cells), config.structural_zero_cells)
    dense, compact = [], []
    for level in ("tract", "block_group", "block"):
        queries = config.queries[level]
        marginals = tuple(q.cell_to_marginal[active] for q in queries)
        sizes = tuple(q.size for q in queries)
        weights = np.array([1.0 / float(config.budget.sigma2_for(level, q.name)) for q in queries])
        dense.append(
            LevelDesign(level=level, marginals=marginals, marginal_sizes=sizes, weights=weights)
        )
        compact.append(
            LevelDesign(
                level=level,
                marginals=marginals,
                marginal_sizes=sizes,
                weights=weights,
                layout=layout,
            )
        )
    return dense, compact


@pytest.mark.slow
def test_the_production_schemas_compact_covariance_equals_the_dense_one_on_a_small_tree():
    """2,016 cells (1,890 active: 126 are structural zeros): a tract with an exact total,
    two block groups, three blocks; every node's compact estimate and covariance equal the dense
    pass's (relative 1e-9), which the 16-cell tests check against the whole-tree GLS."""
    dense_levels, compact_levels = production_designs()
    rng = np.random.default_rng(19)
    n = dense_levels[0].n_cells
    tree = Node(0, [Node(1, [Node(2), Node(2)]), Node(1, [Node(2)])])
    for leaf in tree.leaves():
        leaf.truth = rng.poisson(0.3, n).astype(float)
    for middle in tree.children:
        middle.truth = np.sum([c.truth for c in middle.children], axis=0)
    tree.truth = np.sum([c.truth for c in tree.children], axis=0)
    for node in tree.nodes():
        design = dense_levels[node.depth]
        node.answers = tuple(
            np.bincount(m, node.truth, minlength=s) + rng.normal(0, 1 / np.sqrt(w), s)
            for m, s, w in zip(design.marginals, design.marginal_sizes, design.weights, strict=True)
        )
    tree.total = float(tree.truth.sum())
    dense: dict[int, Gaussian] = {}
    compact: dict[int, Gaussian] = {}
    bottom_up(tree, dense_levels, dense)
    bottom_up(tree, compact_levels, compact)
    for node in tree.nodes():
        assert_compact_equals(compact[id(node)], dense[id(node)])
    packed = compact[id(tree)].covariance
    assert isinstance(packed, SymmetricMatrix) and packed.pack().size == 4 * 15 * 16 // 2


BATCHES = [(1, 0), (2, 1), (5, 2), (7, 6), (64, 31), (257, 100)]
"""(batch size, the leaf's place in it): where a leaf lands when a run partitions differently."""


def leaves_answers(
    rng: np.random.Generator, design: LevelDesign, k: int
) -> tuple[list[np.ndarray], np.ndarray]:
    answers = [rng.normal(0.0, 3.0, (k, size)) + 5 for size in design.marginal_sizes]
    return answers, rng.integers(0, 60, k).astype(np.float64)


@pytest.mark.parametrize("compact", [False, True], ids=["dense", "compact"])
@pytest.mark.parametrize("seed", range(4))
def test_a_leafs_estimate_is_the_same_bits_whichever_leaves_share_its_batch(seed, compact):
    """A resumed or differently partitioned run batches other leaves together: each leaf's mean
    (with and without an invariant total, and with cells held at 0) must not change in any
    bit, or a resumed release differs from the uninterrupted one."""
    rng = np.random.default_rng(seed)
    designs = compact_designs(rng, 1)[int(compact)] if compact else random_designs(rng, 1)
    design = designs[-1]
    answers, totals = leaves_answers(rng, design, 400)
    for with_totals in (None, totals):
        alone_of_all, covariance = leaf_estimates(design, answers, with_totals)
        zeros = np.zeros(design.n_cells, dtype=bool)
        if not compact:
            zeros[rng.choice(design.n_cells, 1)] = True
            held_of_all, _ = hold_zeros(alone_of_all, covariance, zeros)
        for size, place in BATCHES:
            start = int(rng.integers(0, 400 - size + 1))
            rows = slice(start, start + size)
            batch = [a[rows] for a in answers]
            means, _ = leaf_estimates(design, batch, None if with_totals is None else totals[rows])
            np.testing.assert_array_equal(means[place], alone_of_all[start + place])
            if not compact:
                held, _ = hold_zeros(means, covariance, zeros)
                np.testing.assert_array_equal(held[place], held_of_all[start + place])
