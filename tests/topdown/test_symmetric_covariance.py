"""The compact covariance: its layout, its algebra against dense matrices, and the refusal rule."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp_spark.topdown.solvers.symmetric_covariance import (
    DENSE_BLOCK_MAX_CELLS,
    SymmetricLayout,
    SymmetricMatrix,
    covariance_layout,
    information_matrix,
)
from tests.helpers.solvers import product_query, random_schema


def random_layout(rng: np.random.Generator) -> SymmetricLayout:
    while True:
        shape, zeros, per_level, _ = random_schema(rng, 1)
        every = [q for queries in per_level for q, _ in queries]
        layout = covariance_layout(shape, [f"a{a}" for a in range(len(shape))], zeros, every, 0)
        if layout is not None:
            return layout


def random_compact(rng: np.random.Generator, layout: SymmetricLayout) -> SymmetricMatrix:
    n = layout.core_cells
    factors = rng.normal(size=(layout.n_components, n, n))
    return SymmetricMatrix(layout, factors @ factors.transpose(0, 2, 1) + n * np.eye(n))


@pytest.mark.parametrize("seed", range(40))
def test_the_layout_holds_symmetric_exactly_the_attributes_never_recoded(seed):
    rng = np.random.default_rng(seed)
    shape, zeros, per_level, symmetric = random_schema(rng, 2)
    every = [q for queries in per_level for q, _ in queries]
    names = [f"a{a}" for a in range(len(shape))]
    layout = covariance_layout(shape, names, zeros, every, small_cells=0)
    if layout is None:
        assert not symmetric
        return
    assert layout.names == tuple(names[a] for a in sorted(symmetric))
    assert layout.core_cells * layout.spread == layout.n_cells == np.prod(shape) - len(zeros)
    assert sorted(layout.order) == list(range(layout.n_cells))


def test_a_structural_zero_that_depends_on_an_attribute_keeps_it_out_of_the_symmetric_ones():
    shape = (3, 2, 5)
    detailed = product_query(shape, [np.arange(m) for m in shape])[0]
    levels = np.indices(shape).reshape(3, -1)
    zero = np.flatnonzero((levels[0] == 2) & (levels[1] == 0)).tolist()  # 5 cells
    layout = covariance_layout(shape, ["hhgq", "votingage", "race"], zero, [detailed], 0)
    assert layout is not None and layout.names == ("race",) and layout.core_cells == 5


def test_small_schemas_and_schemas_without_symmetric_attributes_stay_dense():
    shape = (2, 8)
    detailed = product_query(shape, [np.arange(2), np.arange(8)])[0]
    assert covariance_layout(shape, ["votingage", "hisprace"], [], [detailed]) is None
    recode = product_query((4, 20), [np.array([0, 0, 1, 1]), np.zeros(20, dtype=np.int64)])[0]
    detailed = product_query((4, 20), [np.arange(4), np.arange(20)])[0]
    # 80 cells, but the second attribute is only ever kept: compact with a 4-cell core.
    layout = covariance_layout((4, 20), ["a", "b"], [], [recode, detailed])
    assert layout is not None and layout.core_cells == 4
    recode_b = product_query((4, 20), [np.arange(4), np.arange(20) // 10])[0]
    assert covariance_layout((4, 20), ["a", "b"], [], [recode, recode_b, detailed]) is None


def test_a_dense_block_above_the_limit_is_refused_with_the_rule():
    shape = (30, 20)
    assert np.prod(shape) > DENSE_BLOCK_MAX_CELLS
    recodes = [
        product_query(shape, [np.arange(30) // 3, np.arange(20)])[0],
        product_query(shape, [np.arange(30), np.arange(20) // 2])[0],
    ]
    with pytest.raises(ValueError, match=r"\(a, b: 600 non-zero cells, above DENSE_BLOCK_MAX") as e:
        covariance_layout(shape, ["a", "b"], [], recodes)
    assert "\n" not in str(e.value) and "keep it whole or sum it out" in str(e.value)
    # Held symmetric, the same schema is fine.
    summed = product_query(shape, [np.arange(30) // 3, np.zeros(20, dtype=np.int64)])[0]
    layout = covariance_layout(shape, ["a", "b"], [], [recodes[0], summed])
    assert layout is not None and layout.names == ("b",)


@pytest.mark.parametrize("seed", range(30))
def test_the_compact_matrices_are_closed_under_sums_products_and_inverses(seed):
    rng = np.random.default_rng(seed)
    layout = random_layout(rng)
    x, y = random_compact(rng, layout), random_compact(rng, layout)
    dx, dy = x.to_dense(), y.to_dense()
    scale = float(np.abs(dx @ dy).max())
    np.testing.assert_allclose((x + y).to_dense(), dx + dy, atol=1e-12 * scale)
    np.testing.assert_allclose((x @ y).to_dense(), dx @ dy, atol=1e-12 * scale)
    inverse = np.linalg.inv(dx)
    np.testing.assert_allclose(x.inverse().to_dense(), inverse, atol=1e-12 * np.abs(inverse).max())
    np.testing.assert_allclose(
        x.solve(y).to_dense(), np.linalg.solve(dx, dy), atol=1e-10 * np.abs(dy).max()
    )
    # The dense product and inverse are in the algebra: their blocks give them back.
    for dense in (dx @ dy, inverse):
        again = SymmetricMatrix.from_dense(layout, dense).to_dense()
        np.testing.assert_allclose(again, dense, atol=1e-12 * np.abs(dense).max())
    # A dense matrix outside the algebra is not given back.
    outside = dx.copy()
    outside[0, 1] += 1.0
    assert np.abs(SymmetricMatrix.from_dense(layout, outside).to_dense() - outside).max() > 0.1


@pytest.mark.parametrize("seed", range(30))
def test_products_with_vectors_traces_totals_and_packing_match_the_dense_matrix(seed):
    rng = np.random.default_rng(seed)
    layout = random_layout(rng)
    x = random_compact(rng, layout)
    dense = x.to_dense()
    n = layout.n_cells
    vectors = rng.normal(size=(3, n))
    np.testing.assert_allclose(x.apply(vectors), vectors @ dense.T, atol=1e-11 * dense.max())
    cells = np.sort(rng.choice(n, size=max(1, n // 2), replace=False))
    np.testing.assert_array_equal(x.submatrix(cells), dense[np.ix_(cells, cells)])
    assert x.trace() == pytest.approx(np.trace(dense), rel=1e-12)
    assert x.total_variance() == pytest.approx(dense.sum(), rel=1e-12)
    np.testing.assert_allclose(x.ones_product(), dense.sum(axis=1), rtol=1e-12)
    # The spectrum is every block's, each eigenvalue repeated rank(E_c) times.
    repeated = [
        np.repeat(np.linalg.eigvalsh(block), count)
        for block, count in zip(x.blocks, layout.multiplicity, strict=True)
    ]
    np.testing.assert_allclose(
        np.sort(np.concatenate(repeated)), np.linalg.eigvalsh(dense), rtol=1e-10
    )
    unpacked = SymmetricMatrix.unpack(layout, x.pack())
    np.testing.assert_array_equal(unpacked.blocks, x.symmetric().blocks)
    with pytest.raises(ValueError, match="written under another config"):
        SymmetricMatrix.unpack(layout, x.pack()[1:])


@pytest.mark.parametrize("seed", range(30))
def test_the_information_matrix_of_marginal_queries_is_the_dense_one(seed):
    rng = np.random.default_rng(seed)
    shape, zeros, per_level, _ = random_schema(rng, 1)
    queries = per_level[0]
    every = [q for q, _ in queries]
    layout = covariance_layout(shape, [f"a{a}" for a in range(len(shape))], zeros, every, 0)
    if layout is None:
        pytest.skip("no symmetric attribute drawn")
    active = np.setdiff1d(np.arange(int(np.prod(shape))), zeros)
    weights = rng.uniform(0.1, 3.0, len(queries))
    dense = np.zeros((active.size, active.size))
    for (q, size), w in zip(queries, weights, strict=True):
        matrix = np.zeros((size, active.size))
        matrix[q[active], np.arange(active.size)] = 1.0
        dense += w * matrix.T @ matrix
    compact = information_matrix(layout, [q[active] for q, _ in queries], weights)
    np.testing.assert_allclose(compact.to_dense(), dense, atol=1e-12 * dense.max())


def test_a_schema_whose_every_attribute_is_symmetric_has_one_core_cell():
    """The 252-cell legacy persons schema (votingage x hispanic x cenrace): every query keeps
    or sums out each attribute, so all three are symmetric over a single core cell."""
    shape = (2, 2, 63)
    queries = [
        product_query(
            shape, [np.zeros(2, dtype=np.int64), np.arange(2), np.zeros(63, dtype=np.int64)]
        ),
        product_query(shape, [np.arange(2), np.zeros(2, dtype=np.int64), np.arange(63)]),
        product_query(shape, [np.arange(m) for m in shape]),
    ]
    layout = covariance_layout(
        shape, ["votingage", "hispanic", "cenrace"], [], [q for q, _ in queries]
    )
    assert layout is not None and layout.core_cells == 1 and layout.sizes == shape
    weights = np.array([0.5, 2.0, 1.5])
    active = np.arange(252)
    dense = np.zeros((252, 252))
    for (q, size), w in zip(queries, weights, strict=True):
        matrix = np.zeros((size, 252))
        matrix[q, active] = 1.0
        dense += w * matrix.T @ matrix
    compact = information_matrix(layout, [q for q, _ in queries], weights)
    np.testing.assert_allclose(compact.to_dense(), dense, atol=1e-12 * dense.max())
