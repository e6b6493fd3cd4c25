"""The expected error of a strategy (``solvers.expected_error``) against a whole-tree GLS built
by brute force, its compact form against the dense one, and the empirical error of the real
solvers' unrounded estimates over many noise draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import null_space

from censusdp_spark.topdown.solvers import PrecisionProblem
from censusdp_spark.topdown.solvers.expected_error import (
    FieldGrams,
    expected_absolute_error,
    final_covariances,
)
from censusdp_spark.topdown.solvers.gaussian_estimates import (
    Gaussian,
    LevelDesign,
    fitting_targets,
    leaf_estimates,
    node_estimate,
)
from censusdp_spark.topdown.solvers.least_squares import solve_to_targets
from censusdp_spark.topdown.solvers.symmetric_covariance import (
    SymmetricMatrix,
    covariance_layout,
)
from tests.helpers.solvers import marginal_queries

DIMS = (2, 3)
SUBSETS = [(), (0,), (0, 1)]


def designs_of(weights: list[list[float]], dims=DIMS, subsets=SUBSETS, layout=None):
    maps, sizes = marginal_queries(dims, subsets)
    return [
        LevelDesign(
            level=f"level{i}",
            marginals=maps,
            marginal_sizes=sizes,
            weights=np.array(w, dtype=np.float64),
            layout=layout,
        )
        for i, w in enumerate(weights)
    ]


def selector(level: int, node: int, fanouts: list[int], n: int) -> np.ndarray:
    """``S``: the histogram of node ``node`` of ``level`` as a sum of the leaves' cells."""
    leaves = math.prod(fanouts[1:])
    span = leaves // math.prod(fanouts[1 : level + 1])
    s = np.zeros((n, leaves * n))
    for leaf in range(node * span, (node + 1) * span):
        s[:, leaf * n : (leaf + 1) * n] = np.eye(n)
    return s


def whole_tree_gls(designs, fanouts: list[int], exact_totals: list[bool]) -> list[np.ndarray]:
    """The covariance of the GLS of every measurement of the tree (with the exact totals as
    equality constraints), at the first node of each level: one dense system over all leaves."""
    n = designs[0].n_cells
    leaves = math.prod(fanouts[1:])
    information = np.zeros((leaves * n, leaves * n))
    constraints = []
    for level, design in enumerate(designs):
        matrix, weight = design.matrix()
        for node in range(math.prod(fanouts[1 : level + 1])):
            rows = matrix @ selector(level, node, fanouts, n)
            information += rows.T @ (weight[:, None] * rows)
            if exact_totals[level]:
                constraints.append(np.ones(n) @ selector(level, node, fanouts, n))
    basis = null_space(np.array(constraints)) if constraints else np.eye(leaves * n)
    covariance = basis @ np.linalg.inv(basis.T @ information @ basis) @ basis.T
    return [
        selector(level, 0, fanouts, n) @ covariance @ selector(level, 0, fanouts, n).T
        for level in range(len(designs))
    ]


@pytest.mark.parametrize(
    "exact_totals", [[False, False, False], [True, False, False], [True, True, False]]
)
def test_full_information_is_the_whole_tree_gls(exact_totals):
    rng = np.random.default_rng(7)
    designs = designs_of([list(rng.uniform(0.05, 2.0, 3)) for _ in range(3)])
    fanouts = [1, 2, 3]
    model = final_covariances(designs, fanouts, exact_totals, "full_information")
    for level, (expected, exact) in enumerate(
        zip(model, whole_tree_gls(designs, fanouts, exact_totals), strict=True)
    ):
        np.testing.assert_allclose(expected, exact, atol=1e-9, err_msg=f"level {level}")


def test_a_level_not_measured_at_all_still_gets_its_gls():
    designs = designs_of([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [0.2, 0.1, 0.3]])
    model = final_covariances(designs, [1, 3, 2], [False] * 3, "full_information")
    for expected, exact in zip(model, whole_tree_gls(designs, [1, 3, 2], [False] * 3), strict=True):
        np.testing.assert_allclose(expected, exact, atol=1e-9)


def topdown_by_linear_maps(designs, fanouts: list[int]) -> list[np.ndarray]:
    """TopDown's linear estimator written out: each node's own GLS ``u``, then a family fitted
    to its parent's final estimate ``x_c = u_c + (p - sum_j u_j) / k``; the covariance of the
    first node's estimate of each level, from the linear map of every node's own estimate."""
    own = [
        np.linalg.inv(d.matrix()[0].T @ (d.matrix()[1][:, None] * d.matrix()[0])) for d in designs
    ]
    n = designs[0].n_cells
    counts = [math.prod(fanouts[1 : i + 1]) for i in range(len(designs))]
    offsets = np.cumsum([0, *counts])
    # the final estimate of every node as a map from the stacked own estimates u

    def selecting(position: int) -> np.ndarray:
        return np.eye(n, offsets[-1] * n, position * n)

    maps = [[selecting(0)]]
    for level in range(1, len(designs)):
        k = fanouts[level]
        row = []
        for node in range(counts[level]):
            parent, first = node // k, (node // k) * k
            siblings = sum(selecting(offsets[level] + j) for j in range(first, first + k))
            row.append(selecting(offsets[level] + node) + (maps[-1][parent] - siblings) / k)
        maps.append(row)
    stacked = np.zeros((offsets[-1] * n, offsets[-1] * n))
    for level, count in enumerate(counts):
        for node in range(count):
            at = (offsets[level] + node) * n
            stacked[at : at + n, at : at + n] = own[level]
    return [m[0] @ stacked @ m[0].T for m in maps]


def test_topdown_is_its_linear_estimator():
    rng = np.random.default_rng(3)
    designs = designs_of([list(rng.uniform(0.1, 2.0, 3)) for _ in range(3)])
    fanouts = [1, 3, 2]
    model = final_covariances(designs, fanouts, [False] * 3, "topdown")
    for expected, exact in zip(model, topdown_by_linear_maps(designs, fanouts), strict=True):
        np.testing.assert_allclose(expected, exact, atol=1e-9)


def test_fractional_fan_outs_interpolate_between_whole_ones():
    """A spine's mean fan-out is rarely whole: the error is monotone in it."""
    designs = designs_of([[1.0, 1.0, 1.0]] * 3)
    fields = FieldGrams(np.eye(6), None)
    totals = [
        fields.variances(final_covariances(designs, [1, 2, k], [False] * 3)[2]).sum()
        for k in (2.0, 2.5, 3.0)
    ]
    assert totals[0] < totals[1] < totals[2] or totals[0] > totals[1] > totals[2]


COMPACT_DIMS = (2, 3, 4)
COMPACT_SUBSETS = [(), (0,), (0, 2), (0, 1, 2)]


@pytest.mark.parametrize("method", ["full_information", "topdown"])
@pytest.mark.parametrize("exact_totals", [[False] * 3, [True, True, False]])
def test_compact_covariances_give_the_dense_field_variances(method, exact_totals):
    maps, _ = marginal_queries(COMPACT_DIMS, COMPACT_SUBSETS)
    layout = covariance_layout(COMPACT_DIMS, ("a", "b", "c"), [], list(maps), small_cells=0)
    assert layout is not None and layout.n_components == 8  # every attribute held symmetric
    rng = np.random.default_rng(11)
    weights = [list(rng.uniform(0.1, 2.0, 4)) for _ in range(3)]
    dense = final_covariances(
        designs_of(weights, COMPACT_DIMS, COMPACT_SUBSETS), [1, 3, 5], exact_totals, method
    )
    compact = final_covariances(
        designs_of(weights, COMPACT_DIMS, COMPACT_SUBSETS, layout), [1, 3, 5], exact_totals, method
    )
    fields = rng.integers(0, 2, (24, 40))
    for d, c in zip(dense, compact, strict=True):
        assert isinstance(c, SymmetricMatrix)
        np.testing.assert_allclose(c.to_dense(), d, atol=1e-9)
        np.testing.assert_allclose(
            FieldGrams(fields, layout).variances(c),
            FieldGrams(fields, None).variances(d),
            rtol=1e-9,
        )
        np.testing.assert_allclose(
            FieldGrams(fields, None).variances(d), np.einsum("if,ij,jf->f", fields, d, fields)
        )


def test_field_grams_refuse_a_covariance_of_another_layout():
    maps, _ = marginal_queries(COMPACT_DIMS, COMPACT_SUBSETS)
    one = covariance_layout(COMPACT_DIMS, ("a", "b", "c"), [], list(maps), small_cells=0)
    other = covariance_layout(COMPACT_DIMS, ("a", "b", "c"), [], list(maps), small_cells=0)
    with pytest.raises(ValueError, match="another layout"):
        FieldGrams(np.eye(24), one).variances(SymmetricMatrix.identity(other))


def test_the_expected_absolute_error_of_a_gaussian():
    draws = np.random.default_rng(0).normal(0.0, 3.0, 400_000)
    assert expected_absolute_error(np.array([9.0]))[0] == pytest.approx(
        np.abs(draws).mean(), rel=0.01
    )


def test_the_fan_outs_and_designs_must_agree():
    designs = designs_of([[1.0, 1.0, 1.0]] * 3)
    with pytest.raises(ValueError, match="one design, fan-out and total flag"):
        final_covariances(designs, [1, 2], [False] * 3)
    with pytest.raises(ValueError, match="fan-out below 1"):
        final_covariances(designs, [1, 0.5, 2], [False] * 3)


# The empirical check: the real solvers (bottom-up BLUE, then each family fitted to its parent
# by ``solve_to_targets``) on a tree whose counts are large enough that no bound binds, and
# noise large against rounding (each parent is rounded to integers before its children are
# fitted, as in a release: variance 1/12 a cell against the noise's tens).
EMPIRICAL_FANOUTS = [1, 3, 4]
EMPIRICAL_WEIGHTS = [[1 / 40, 1 / 60, 1 / 50], [1 / 30, 1 / 80, 1 / 40], [1 / 20, 1 / 90, 1 / 30]]
REPLICATES = 600


def empirical_errors(designs, rng) -> list[np.ndarray]:
    """Errors ``(replicates, nodes, cells)`` of each level's unrounded final estimates."""
    n = designs[0].n_cells
    counts = [math.prod(EMPIRICAL_FANOUTS[1 : i + 1]) for i in range(3)]
    leaves_truth = rng.integers(2_000, 4_000, (counts[-1], n)).astype(np.float64)
    truth = [leaves_truth.reshape(counts[i], -1, n).sum(axis=1) for i in range(3)]
    errors: list[list[np.ndarray]] = [[], [], []]
    for _ in range(REPLICATES):
        answers = [
            [
                np.stack([np.bincount(m, t, minlength=s) for t in truth[i]])
                + rng.normal(0.0, w**-0.5, (counts[i], s))
                for m, s, w in zip(d.marginals, d.marginal_sizes, d.weights, strict=True)
            ]
            for i, d in enumerate(designs)
        ]
        means, covariance = leaf_estimates(designs[2], answers[2], None)
        estimates = [[Gaussian(m, covariance) for m in means]]
        for level in (1, 0):
            k = EMPIRICAL_FANOUTS[level + 1]
            children = estimates[0]
            estimates.insert(
                0,
                [
                    node_estimate(
                        children[p * k : (p + 1) * k],
                        designs[level],
                        [a[p] for a in answers[level]],
                        None,
                    )
                    for p in range(counts[level])
                ],
            )
        finals = [np.stack([estimates[0][0].mean])]
        for level in (1, 2):
            k = EMPIRICAL_FANOUTS[level]
            fitted = []
            for p, parent in enumerate(finals[-1]):
                family = estimates[level][p * k : (p + 1) * k]
                targets, precisions = fitting_targets(
                    family, [e.precision() for e in family], np.ones(n, dtype=bool)
                )
                problem = PrecisionProblem(
                    targets=targets,
                    precisions=precisions,
                    parent=np.rint(parent).astype(np.int64),
                    child_totals=None,
                )
                fitted.append(solve_to_targets(problem))
            finals.append(np.concatenate(fitted))
        for level in range(3):
            errors[level].append(finals[level] - truth[level])
    return [np.stack(e) for e in errors]


def test_the_expected_variances_are_the_real_solvers_empirical_ones():
    designs = designs_of(EMPIRICAL_WEIGHTS)
    model = final_covariances(designs, EMPIRICAL_FANOUTS, [False] * 3, "full_information")
    errors = empirical_errors(designs, np.random.default_rng(2024))
    maps, sizes = marginal_queries(DIMS, [(0,)])
    fields = np.concatenate([np.eye(6), np.eye(sizes[0])[maps[0]], np.ones((6, 1))], axis=1)
    for level, (covariance, error) in enumerate(zip(model, errors, strict=True)):
        expected = FieldGrams(fields, None).variances(covariance)
        measured = ((error @ fields) ** 2).mean(axis=(0, 1))
        # every cell's variance summed: within 5%
        assert measured[:6].sum() == pytest.approx(expected[:6].sum(), rel=0.05), level
        # one field alone has fewer draws: within four standard errors of a variance estimate
        draws = REPLICATES * error.shape[1]
        np.testing.assert_allclose(
            measured[6:], expected[6:], rtol=4 * math.sqrt(2 / draws), err_msg=f"level {level}"
        )


def test_leaves_that_do_not_identify_every_cell_are_refused():
    designs = designs_of([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # no detailed
    with pytest.raises(ValueError, match="level level2: its queries do not identify every cell"):
        final_covariances(designs, [1, 2, 3], [False] * 3)


def test_a_level_above_the_leaves_may_be_as_poorly_measured_as_an_optimizer_tries():
    """A leaf ``detailed`` query of weight 1e-9 beside margins of weight 1: the parents'
    precision is nearly singular (below the leaf check's 1e-10), never unidentified; its
    covariance is still the whole-tree GLS's."""
    weights = [[1.0, 1.0, 1.0], [1.0, 1.0, 1e-11], [1.0, 1.0, 1e-9]]
    with pytest.raises(ValueError, match="level level1"):
        # the same precision where it is a level's own (TopDown's own-level GLS) is refused
        final_covariances(designs_of(weights), [1, 4, 40], [False] * 3, "topdown")
    model = final_covariances(designs_of(weights), [1, 4, 40], [False] * 3)
    exact = whole_tree_gls(designs_of(weights), [1, 4, 40], [False] * 3)
    for m, e in zip(model, exact, strict=True):
        np.testing.assert_allclose(m, e, rtol=1e-3, atol=1e-4 * np.abs(e).max())
