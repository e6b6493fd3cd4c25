"""Compact covariances for full-information estimation: attributes held symmetric.

Structure. Call an attribute *symmetric* when every query of every level either keeps it whole
or sums it out (no recode of it) and the structural zeros do not depend on it (a cell is a
structural zero or not whatever that attribute's level). Order the active cells as
``(core cell, symmetric cell)``: the core cells are the active cells of the other attributes
(the *core*, ``n_N`` of them: the structural zeros may remove any core cells, but then the
active cells are exactly ``core x symmetric product``), the symmetric cell runs over the product
of the symmetric attributes (``M = prod m_a`` cells). A marginal query's ``Q^T Q`` is then
``G_N (x) (x)_a F_a`` with ``F_a = I`` (kept) or ``J`` (the all-ones matrix: summed out), and
``G_N`` dense over the core.

The algebra. For one attribute of size ``m``, ``P0 = J / m`` and ``P1 = I - J / m`` are
orthogonal idempotents (``P0 P1 = 0``, ``P0 + P1 = I``), and ``I = P0 + P1``, ``J = m P0``. So
for ``k`` symmetric attributes the ``2^k`` products ``E_c = (x)_{a in c} P1_a (x)_{a not in c}
P0_a`` (one per subset ``c``) are orthogonal idempotents summing to the identity, and the set

    { sum_c E_c (x) B_c : B_c any n_N x n_N matrix }

is an algebra isomorphic to the direct product of ``2^k`` copies of the ``n_N x n_N`` matrices:
``(sum E_c (x) B_c)(sum E_c (x) C_c) = sum E_c (x) B_c C_c`` (cross terms vanish because
``E_c E_d = 0``), sums and transposes act block by block, and ``X`` is invertible iff every
``B_c`` is, with ``X^{-1} = sum E_c (x) B_c^{-1}``. It is the same set as the sums
``sum_S ((x)_{a in S} J_a (x)_{a not in S} I_a) (x) D_S`` over the subsets ``S`` of the
symmetric attributes (expand ``I = P0 + P1``, ``J = m P0`` one way, ``P0 = J/m``,
``P1 = I - J/m`` the other). Everything the bottom-up pass
computes stays inside it, exactly:

* the information matrix ``sum_q w_q Q_q^T Q_q`` is in it (above), with
  ``B_c = sum_q w_q lambda_q(c) G_q``, ``lambda_q(c) = prod_a`` (1 if ``q`` keeps ``a``;
  else 0 if ``a in c``, ``m_a`` if not);
* the leaf GLS covariance is its inverse; the Kalman update is ``C = (I + S A)^{-1} S``;
  sums of children's covariances are sums;
* the all-ones vector is ``1_sym (x) 1_N`` and ``1 1^T / n = E_0 (x) 1_N 1_N^T / n_N``
  (``E_0``: no attribute in ``c``), so an exact total, the projection onto ``1^perp`` and the
  conditioning on ``1^T x = t`` touch only the block ``B_0``, as the dense formulas with
  ``1_N`` in place of ``1``; every other ``E_c`` is orthogonal to ``1``.

Storage: the ``2^k`` blocks ``B_c`` (component ``c`` a bit mask over the symmetric attributes,
bit set = ``P1``), not ``n^2`` numbers: for the 2,016-cell production schema (hispanic and
cenrace symmetric; hhgq is recoded and the nursing / under-18 structural zero depends on
votingage) 4 blocks of 15 x 15 instead of 2,016 x 2,016.

Vectors stay ordinary length-``n`` arrays over the active cells in schema order; ``apply``
multiplies by a compact matrix through the orthonormal Helmert transform of each symmetric axis
(its first row ``1 / sqrt(m)``), in which the matrix is block diagonal: the spectral index
``j_a = 0`` is ``P0``'s range, ``j_a > 0`` ``P1``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

DENSE_BLOCK_MAX_CELLS = 512
"""The largest dense block a node's covariance may hold: the whole covariance when it is dense,
each of the ``2^k`` blocks over the core cells when it is compact. 512 cells is 2 MiB a block;
a dense 2,016-cell covariance would be 32 MiB per node, times the children of every task."""

SMALL_SCHEMA_CELLS = 64
"""Schemas with at most this many active cells keep dense covariances (the 16-cell demos: their
numbers are those of the dense formulas, unchanged)."""


@dataclass(frozen=True, eq=False, kw_only=True)
class SymmetricLayout:
    """Which attributes are held symmetric, and where each active cell sits.

    ``core_of[i]`` and ``symmetric_of[i]`` are active cell ``i``'s core index (in
    ``[0, core_cells)``) and the row-major index of its levels of the symmetric attributes, whose
    sizes are ``sizes`` (each ``>= 2``; ``names`` for messages)."""

    core_of: np.ndarray
    symmetric_of: np.ndarray
    core_cells: int
    sizes: tuple[int, ...]
    names: tuple[str, ...] = ()
    _helmert: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_helmert", tuple(_helmert(m) for m in self.sizes))

    @property
    def n_cells(self) -> int:
        return int(self.core_of.shape[0])

    @property
    def spread(self) -> int:
        """``M``, the number of symmetric cells (each core cell is repeated ``M`` times)."""
        return int(np.prod(self.sizes, dtype=np.int64))

    @property
    def n_components(self) -> int:
        return 1 << len(self.sizes)

    @cached_property
    def order(self) -> np.ndarray:
        """Active cell at each compact position ``core * M + symmetric``."""
        order = np.empty(self.n_cells, dtype=np.int64)
        order[self.core_of * self.spread + self.symmetric_of] = np.arange(self.n_cells)
        return order

    @cached_property
    def symmetric_levels(self) -> np.ndarray:
        """``(n, k)``: each active cell's level of every symmetric attribute."""
        if not self.sizes:
            return np.zeros((self.n_cells, 0), dtype=np.int64)
        return np.stack(np.unravel_index(self.symmetric_of, self.sizes), axis=1)

    @cached_property
    def component_of_spectral(self) -> np.ndarray:
        """``(M,)``: the component (bit mask, bit set where ``j_a > 0``) of each spectral index."""
        digits = np.indices(self.sizes).reshape(len(self.sizes), -1)
        bits = (digits > 0).astype(np.int64) << np.arange(len(self.sizes))[:, None]
        return bits.sum(axis=0)

    @cached_property
    def multiplicity(self) -> np.ndarray:
        """``(2^k,)``: the rank of each ``E_c``, ``prod_{a in c} (m_a - 1)``."""
        return np.bincount(self.component_of_spectral, minlength=self.n_components)

    def spectral(self, vectors: np.ndarray) -> np.ndarray:
        """``(..., n)`` over the active cells to ``(..., n_N, M)`` Helmert coordinates."""
        x = vectors[..., self.order].reshape(vectors.shape[:-1] + (self.core_cells, *self.sizes))
        first = x.ndim - len(self.sizes)
        for i, helmert in enumerate(self._helmert):
            x = np.moveaxis(np.moveaxis(x, first + i, -1) @ helmert.T, -1, first + i)
        return x.reshape(vectors.shape[:-1] + (self.core_cells, self.spread))

    def from_spectral(self, coordinates: np.ndarray) -> np.ndarray:
        """Inverse of ``spectral``."""
        lead = coordinates.shape[:-2]
        x = coordinates.reshape(lead + (self.core_cells, *self.sizes))
        first = x.ndim - len(self.sizes)
        for i, helmert in enumerate(self._helmert):
            x = np.moveaxis(np.moveaxis(x, first + i, -1) @ helmert, -1, first + i)
        out = np.empty(lead + (self.n_cells,))
        out[..., self.order] = x.reshape(lead + (self.n_cells,))
        return out

    def core_view(self, cell_to_marginal: np.ndarray) -> tuple[np.ndarray, tuple[bool, ...]]:
        """A marginal query (``cell_to_marginal`` over the active cells) as its core labels
        (``(n_N,)``: core cells in one marginal cell share a label) and whether it keeps each
        symmetric attribute (else it sums it out; ``covariance_layout`` checked there is no
        third case)."""
        grid = cell_to_marginal[self.order].reshape(self.core_cells, *self.sizes)
        kept = tuple(
            bool(np.any(np.take(grid, [0], axis=1 + a) != grid)) for a in range(len(self.sizes))
        )
        return grid.reshape(self.core_cells, self.spread)[:, 0], kept


@dataclass(frozen=True, eq=False)
class SymmetricMatrix:
    """``sum_c E_c (x) blocks[c]`` over ``layout``'s active cells (see the module docstring)."""

    layout: SymmetricLayout
    blocks: np.ndarray  # (2^k, n_N, n_N)

    @classmethod
    def identity(cls, layout: SymmetricLayout) -> SymmetricMatrix:
        eye = np.eye(layout.core_cells)
        return cls(layout, np.broadcast_to(eye, (layout.n_components, *eye.shape)).copy())

    @classmethod
    def from_dense(cls, layout: SymmetricLayout, dense: np.ndarray) -> SymmetricMatrix:
        """The blocks of a dense matrix of the algebra (the diagonal of its Helmert transform,
        averaged over each component); ``to_dense`` of the result equals ``dense`` iff it is in
        the algebra."""
        half = layout.spectral(dense)  # rows: cells; columns: (core, spectral)
        both = layout.spectral(np.moveaxis(half, 0, -1))  # (n_N, M, n_N, M)
        diagonal = np.einsum("bjaj->jab", both)
        blocks = np.stack(
            [
                diagonal[layout.component_of_spectral == c].mean(axis=0)
                for c in range(layout.n_components)
            ]
        )
        return cls(layout, blocks)

    def __add__(self, other: SymmetricMatrix) -> SymmetricMatrix:
        return SymmetricMatrix(self.layout, self.blocks + other.blocks)

    def __sub__(self, other: SymmetricMatrix) -> SymmetricMatrix:
        return SymmetricMatrix(self.layout, self.blocks - other.blocks)

    def __matmul__(self, other: SymmetricMatrix) -> SymmetricMatrix:
        return SymmetricMatrix(self.layout, self.blocks @ other.blocks)

    def scaled(self, factor: float) -> SymmetricMatrix:
        return SymmetricMatrix(self.layout, factor * self.blocks)

    def inverse(self) -> SymmetricMatrix:
        return SymmetricMatrix(self.layout, np.linalg.inv(self.blocks))

    def solve(self, other: SymmetricMatrix) -> SymmetricMatrix:
        """``self^{-1} other``."""
        return SymmetricMatrix(self.layout, np.linalg.solve(self.blocks, other.blocks))

    def symmetric(self) -> SymmetricMatrix:
        return SymmetricMatrix(self.layout, 0.5 * (self.blocks + self.blocks.transpose(0, 2, 1)))

    def eigenvalues(self) -> np.ndarray:
        """Every block's eigenvalues (the matrix's, without their multiplicities)."""
        return np.linalg.eigvalsh(self.symmetric().blocks).ravel()

    def trace(self) -> float:
        return float(self.layout.multiplicity @ np.trace(self.blocks, axis1=1, axis2=2))

    def total_variance(self) -> float:
        """``1^T X 1`` (``= M 1_N^T B_0 1_N``)."""
        return float(self.layout.spread * self.blocks[0].sum())

    def ones_product(self) -> np.ndarray:
        """``X 1`` over the active cells (``1_sym (x) B_0 1_N``)."""
        return self.blocks[0].sum(axis=1)[self.layout.core_of]

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """``X v`` for every row ``v`` of ``vectors`` (``(..., n)``, active cells)."""
        layout = self.layout
        x = layout.spectral(np.asarray(vectors, dtype=np.float64))
        out = np.empty_like(x)
        for c in range(layout.n_components):
            columns = layout.component_of_spectral == c
            out[..., columns] = self.blocks[c] @ x[..., columns]
        return layout.from_spectral(out)

    def submatrix(self, cells: np.ndarray) -> np.ndarray:
        """The dense ``X[cells][:, cells]`` (active cell indices), entry by entry:
        ``X_ij = sum_c B_c[core_i, core_j] prod_a (delta - 1/m_a if a in c else 1/m_a)``."""
        layout = self.layout
        core = layout.core_of[cells]
        levels = layout.symmetric_levels[cells]
        same = [levels[:, a][:, None] == levels[:, a][None, :] for a in range(len(layout.sizes))]
        out = np.zeros((cells.size, cells.size))
        for c in range(layout.n_components):
            coefficient = np.ones((cells.size, cells.size))
            for a, m in enumerate(layout.sizes):
                coefficient *= (same[a] - 1.0 / m) if c >> a & 1 else 1.0 / m
            out += coefficient * self.blocks[c][np.ix_(core, core)]
        return out

    def to_dense(self) -> np.ndarray:
        return self.submatrix(np.arange(self.layout.n_cells))

    def pack(self) -> np.ndarray:
        """The upper triangle of every block, row by row, block ``c = 0`` first."""
        rows, columns = np.triu_indices(self.layout.core_cells)
        return self.blocks[:, rows, columns].ravel()

    @classmethod
    def unpack(cls, layout: SymmetricLayout, packed: np.ndarray) -> SymmetricMatrix:
        """Inverse of ``pack`` for a symmetric matrix; ``ValueError`` on a wrong length."""
        n = layout.core_cells
        size = n * (n + 1) // 2
        if packed.shape != (layout.n_components * size,):
            raise ValueError(
                f"a compact covariance has {layout.n_components} x {size} packed entries, got"
                f" {packed.shape[0]}: the bottom_up table was written under another config"
            )
        blocks = np.zeros((layout.n_components, n, n))
        rows, columns = np.triu_indices(n)
        blocks[:, rows, columns] = packed.reshape(layout.n_components, size)
        return cls(layout, blocks + np.triu(blocks, 1).transpose(0, 2, 1))


def information_matrix(
    layout: SymmetricLayout, marginals: Sequence[np.ndarray], weights: np.ndarray
) -> SymmetricMatrix:
    """``sum_q w_q Q_q^T Q_q`` of marginal queries (``cell_to_marginal`` over the active cells)."""
    blocks = np.zeros((layout.n_components, layout.core_cells, layout.core_cells))
    for cell_to_marginal, weight in zip(marginals, weights, strict=True):
        if weight <= 0:
            continue
        labels, kept = layout.core_view(cell_to_marginal)
        gram = (labels[:, None] == labels[None, :]).astype(np.float64)
        for c in range(layout.n_components):
            factor = 1.0
            for a, m in enumerate(layout.sizes):
                if not kept[a]:
                    factor *= 0.0 if c >> a & 1 else float(m)
            blocks[c] += weight * factor * gram
    return SymmetricMatrix(layout, blocks)


def covariance_layout(
    shape: tuple[int, ...],
    names: Sequence[str],
    structural_zero_cells: Sequence[int],
    queries: Sequence[np.ndarray],
    small_cells: int = SMALL_SCHEMA_CELLS,
) -> SymmetricLayout | None:
    """The layout of every node's covariance in full-information estimation: None for dense
    (at most ``small_cells`` active cells, or no attribute can be held symmetric), else the
    compact layout with every attribute that can be held symmetric.

    ``queries`` are the ``cell_to_marginal`` arrays (over all ``prod(shape)`` cells) of every
    query at every level. Raises ``ValueError`` stating the rule when a dense block (the whole
    covariance, or the core of the compact one) would exceed ``DENSE_BLOCK_MAX_CELLS``.
    """
    zero = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=bool)
    zero[list(structural_zero_cells)] = True
    active = int((~zero).sum())
    symmetric = [
        a
        for a, m in enumerate(shape)
        if m >= 2
        and _constant_along(zero.reshape(shape), a)
        and all(_kept_or_summed(q.reshape(shape), a) for q in queries)
    ]
    if active <= small_cells or not symmetric:
        if active > DENSE_BLOCK_MAX_CELLS:
            _refuse(names, symmetric, shape, active)
        return None
    core_axes = [a for a in range(len(shape)) if a not in symmetric]
    levels = np.indices(shape).reshape(len(shape), -1)[:, ~zero]
    core_code = (
        np.ravel_multi_index(tuple(levels[core_axes]), tuple(shape[a] for a in core_axes))
        if core_axes
        else np.zeros(levels.shape[1], dtype=np.int64)  # every attribute symmetric: one core cell
    )
    core_cells, core_of = np.unique(core_code, return_inverse=True)
    if core_cells.size > DENSE_BLOCK_MAX_CELLS:
        _refuse(names, symmetric, shape, int(core_cells.size))
    sizes = tuple(shape[a] for a in symmetric)
    symmetric_of = np.ravel_multi_index(tuple(levels[symmetric]), sizes)
    return SymmetricLayout(
        core_of=core_of.astype(np.int64),
        symmetric_of=symmetric_of.astype(np.int64),
        core_cells=int(core_cells.size),
        sizes=sizes,
        names=tuple(names[a] for a in symmetric),
    )


def _refuse(names: Sequence[str], symmetric: list[int], shape: tuple[int, ...], cells: int) -> None:
    held = [names[a] for a in symmetric] or ["none"]
    others = [names[a] for a in range(len(shape)) if a not in symmetric]
    raise ValueError(
        f'"full_information" holds each node\'s covariance as dense blocks over the attributes'
        f" it cannot hold symmetric ({', '.join(others)}: {cells} non-zero cells, above"
        f" DENSE_BLOCK_MAX_CELLS = {DENSE_BLOCK_MAX_CELLS}; symmetric: {', '.join(held)}); an"
        f" attribute is held symmetric when every level's queries keep it whole or sum it out"
        f' (no recode) and no structural zero depends on it: use method = "topdown" or such'
        f" queries"
    )


def _constant_along(values: np.ndarray, axis: int) -> bool:
    return bool(np.all(np.take(values, [0], axis=axis) == values))


def _kept_or_summed(cell_to_marginal: np.ndarray, axis: int) -> bool:
    """Whether a query sums ``axis`` out, or keeps it whole: two cells share a marginal cell iff
    they agree on ``axis`` and their cells with ``axis`` at level 0 share one."""
    if _constant_along(cell_to_marginal, axis):
        return True
    base = np.broadcast_to(np.take(cell_to_marginal, [0], axis=axis), cell_to_marginal.shape)
    level = np.indices(cell_to_marginal.shape)[axis]
    pairs = base.ravel().astype(np.int64) * cell_to_marginal.shape[axis] + level.ravel()
    marginal = cell_to_marginal.ravel()
    distinct = np.unique(np.stack([marginal, pairs]), axis=1).shape[1]
    return distinct == np.unique(marginal).size == np.unique(pairs).size


def _helmert(m: int) -> np.ndarray:
    """An orthonormal ``m x m`` matrix whose first row is ``1 / sqrt(m)``."""
    q, _ = np.linalg.qr(np.column_stack([np.ones(m), np.eye(m)[:, : m - 1]]))
    q[:, 0] = 1.0 / np.sqrt(m)
    return q.T
