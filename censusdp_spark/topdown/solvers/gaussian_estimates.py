"""The Gaussian estimates of full-information estimation's bottom-up pass (pure numpy; the pass
on Spark is ``topdown.bottom_up``): every node's best linear unbiased estimate (BLUE) from its
own and all its descendants' noisy measurements, with its covariance.

Model. Every node ``v`` has a histogram ``x_v`` over the ``n`` active cells (structural zeros
are not cells at all); an internal node's histogram is the sum of its children's. Each query
``q`` of the node's level measures ``Q_q x_v`` with independent noise of variance ``1 / w_q``
(``w_q = 1 / sigma_q**2``, as in ``ChildrenProblem``; a query with ``w_q = 0`` measures
nothing). A node with an invariant total ``t_v`` also satisfies ``1^T x_v = t_v`` exactly.

Recursion (exact for this model, time linear in the number of nodes):

* A leaf's estimate is the generalised least-squares (GLS) estimate from its own measurements,
  ``A^{-1} h`` with ``A = sum_q w_q Q_q^T Q_q`` and ``h = sum_q w_q Q_q^T y_q``; with an invariant
  total it is the GLS estimate on the affine set ``1^T x = t``, solved in an orthonormal basis
  ``Z`` of ``1^perp``: covariance ``Z (Z^T A Z)^{-1} Z^T``. ``A`` (``Z^T A Z`` with a total) must
  be non-singular: the level's queries must identify every cell, else ``ValueError``.
* The children's estimates are independent and each is a sufficient statistic for its subtree,
  so the sum of their means, with the sum of their covariances, is the BLUE of the parent from
  everything below it (``sum_of``).
* The parent's own measurements then update that estimate (``update``): the Kalman /
  information-filter step in covariance form, ``K = S M^T (M S M^T + R)^{-1}``,
  ``m = s + K (y - M s)``, ``C = (I - K M) S (I - K M)^T + K R K^T`` (Joseph form), with ``M``
  the stacked query matrix and ``R`` the diagonal noise covariance. It needs no inverse of ``S``,
  so it is exact when ``S`` is singular.
* An invariant total conditions the Gaussian on ``1^T x = t``:
  ``m + C 1 (t - 1^T m) / (1^T C 1)``, ``C - C 1 1^T C / (1^T C 1)``; the covariance is then
  singular along ``1``. When every child's total is already exact the parent's total is implied
  (the update keeps ``C 1 = 0`` and ``1^T m = t``), and only round-off is removed.

Representation. A covariance is a dense ``n x n`` array when the schema is small (at most
``symmetric_covariance.SMALL_SCHEMA_CELLS`` active cells: the 16-cell demos) or no attribute can
be held symmetric, else a ``SymmetricMatrix``: ``2^k`` dense blocks over the cells of the
attributes that are not symmetric (``symmetric_covariance``, which states the algebra and why
every step above stays exact in it). ``LevelDesign.layout`` says which; ``leaf_estimates``,
``sum_of``, ``update`` and ``condition_on_total`` take either and return the same kind. The
compact ``update`` is the information form ``C = (I + S A)^{-1} S``, ``m = s + C (h - A s)``
(``A = M^T R^{-1} M``, ``h = M^T R^{-1} y``: the Kalman step by Woodbury's identity, also
without an inverse of ``S``); the dense path keeps the Joseph form, so its numbers are
unchanged.

Batches. ``leaf_estimates`` and ``hold_zeros`` take many leaves at once; each leaf's result
is the same bits whichever leaves share its batch (``rows_times``), so a retried, resumed or
differently partitioned run writes the same table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from censusdp_spark.topdown.solvers.symmetric_covariance import (
    SymmetricLayout,
    SymmetricMatrix,
    information_matrix,
)


def rows_times(rows: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``rows @ matrix``, each row's product computed alone (a stack of vector-matrix
    products): a row's result does not depend on the other rows of ``rows``, which one matrix
    product does not promise (BLAS blocks the rows, and a row's sums then depend on where the
    batch puts it)."""
    return (rows[:, None, :] @ matrix)[:, 0, :]


IDENTIFIED_TOLERANCE = 1e-10
"""The information matrix is singular when its smallest eigenvalue is below this times its
largest."""


@dataclass(frozen=True, kw_only=True)
class LevelDesign:
    """The queries of one level, restricted to the active cells.

    ``marginals[q]`` maps each of the ``n`` active cells to its marginal cell in
    ``[0, marginal_sizes[q])``; ``weights[q] = 1 / sigma_q**2`` (finite, ``>= 0``). ``level``
    and ``rule`` name the level and the config key that sets its queries, for error messages.
    ``layout``: the compact covariance layout of every level, or None for dense covariances.
    """

    level: str
    marginals: tuple[np.ndarray, ...]
    marginal_sizes: tuple[int, ...]
    weights: np.ndarray
    rule: str = "budget.levels.<level>.queries"
    layout: SymmetricLayout | None = None

    @property
    def n_cells(self) -> int:
        return int(self.marginals[0].shape[0])

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """``(M, w)``: the stacked 0/1 query matrix of the measured queries (``w_q > 0``) and
        the weight of each of its rows."""
        blocks, weights = [], []
        for cell_to_marginal, size, weight in zip(
            self.marginals, self.marginal_sizes, self.weights, strict=True
        ):
            if weight <= 0:
                continue
            block = np.zeros((size, self.n_cells))
            block[cell_to_marginal, np.arange(self.n_cells)] = 1.0
            blocks.append(block)
            weights.append(np.full(size, float(weight)))
        if not blocks:
            return np.zeros((0, self.n_cells)), np.zeros(0)
        return np.vstack(blocks), np.concatenate(weights)

    def stacked_answers(self, answers: Sequence[np.ndarray]) -> np.ndarray:
        """The answers of the measured queries stacked as ``matrix()``'s rows (last axis)."""
        kept = [
            np.asarray(a, dtype=np.float64)
            for a, w in zip(answers, self.weights, strict=True)
            if w > 0
        ]
        if not kept:
            return np.zeros(np.shape(answers[0])[:-1] + (0,))
        return np.concatenate(kept, axis=-1)

    def back_projection(self, answers: Sequence[np.ndarray]) -> np.ndarray:
        """``M^T R^{-1} y``: ``sum_q w_q Q_q^T y_q`` over the measured queries (last axis)."""
        out = np.zeros(np.shape(answers[0])[:-1] + (self.n_cells,))
        for cell_to_marginal, weight, y in zip(self.marginals, self.weights, answers, strict=True):
            if weight > 0:
                out += float(weight) * np.asarray(y, dtype=np.float64)[..., cell_to_marginal]
        return out


Covariance = np.ndarray | SymmetricMatrix
"""A node's covariance: dense ``n x n``, or compact (``symmetric_covariance``)."""


@dataclass(frozen=True)
class Gaussian:
    """A node's bottom-up estimate: ``mean`` (length ``n``), ``covariance`` (``n x n``, dense
    or compact) and, when its total is exact, ``total`` (then ``1^T mean = total`` and
    ``covariance 1 = 0`` up to round-off); else ``total`` is None. ``zeros``: the cells known to
    be 0 (``hold_zeros``), where ``mean`` and ``covariance``'s rows and columns are
    exactly 0; None when there are none."""

    mean: np.ndarray
    covariance: Covariance
    total: float | None = None
    zeros: np.ndarray | None = None

    def precision(self) -> Covariance:
        """The inverse covariance; with an exact total, the inverse on ``1^perp`` plus
        ``(1/s) u u^T`` (``u = 1/sqrt(n)``, ``s`` the mean eigenvalue on ``1^perp``), which adds
        only a constant to ``(x - mean)^T P (x - mean)`` on the set ``1^T x = total``. With
        ``zeros``, the same on the other cells and the identity on those (block-diagonal: a fit
        that holds them at 0, as the occupancy rule's do, is the same on every other cell)."""
        if isinstance(self.covariance, SymmetricMatrix):
            return _compact_precision(self.covariance, self.total is not None, self.zeros)
        if self.zeros is None:
            return _dense_precision(self.covariance, self.total is not None)
        free = ~self.zeros
        precision = np.eye(self.mean.shape[0])
        if free.any():
            block = self.covariance[np.ix_(free, free)]
            precision[np.ix_(free, free)] = _dense_precision(block, self.total is not None)
        return precision


def _dense_precision(covariance: np.ndarray, exact_total: bool) -> np.ndarray:
    """``Gaussian.precision`` of a dense covariance with no known zeros. With an exact total,
    every direction the covariance does not vary in (all-ones; more where the children's exact
    totals and zeros determine more) gets ``1 / s``, ``s`` the mean of its other eigenvalues:
    ``(C + s N)^{-1}``, ``N`` the projector onto those directions."""
    if not exact_total:
        return _symmetric(np.linalg.inv(covariance))
    values, vectors = np.linalg.eigh(covariance)
    inverse = _inverse_eigenvalues(values[None, :], np.ones(1))[0]
    return _symmetric((vectors * inverse) @ vectors.T)


def _inverse_eigenvalues(values: np.ndarray, multiplicity: np.ndarray) -> np.ndarray:
    """``1 / lambda`` for each of ``values`` (rows: blocks of the given multiplicities), and
    ``1 / s`` for those that are 0 to round-off, ``s`` the mean of the others (1 if none)."""
    largest = float(np.abs(values).max()) if values.size else 0.0
    null = values <= DETERMINED_TOLERANCE * largest
    weights = multiplicity[:, None] * ~null
    scale = float((weights * values).sum() / weights.sum()) if weights.sum() else 1.0
    return np.where(null, 1.0 / max(scale, np.finfo(float).tiny), 1.0 / np.where(null, 1.0, values))


def leaf_estimates(
    design: LevelDesign, answers: Sequence[np.ndarray], totals: np.ndarray | None
) -> tuple[np.ndarray, Covariance]:
    """GLS estimates of ``k`` leaves from their own measurements: ``(means (k, n), covariance)``,
    the covariance shared by all of them.

    ``answers[q]`` has shape ``(k, m_q)``; ``totals`` (length ``k``) are the leaves' invariant
    totals, or None. Raises ``ValueError`` naming the level if its queries (with the total,
    when given) do not identify every cell.
    """
    if design.layout is not None:
        return _compact_leaf_estimates(design, design.layout, answers, totals)
    matrix, weight = design.matrix()
    information = matrix.T @ (weight[:, None] * matrix)
    linear = rows_times(design.stacked_answers(answers), weight[:, None] * matrix)
    n = design.n_cells
    if totals is None:
        _require_identified(design, _eigenvalues(information))
        covariance = _symmetric(np.linalg.inv(information))
        return rows_times(linear, covariance), covariance
    totals = np.asarray(totals, dtype=np.float64)
    if n == 1:
        return totals[:, None].copy(), np.zeros((1, 1))
    basis = _complement_basis(n)
    reduced = basis.T @ information @ basis
    scale = float(_eigenvalues(information).max())
    _require_identified(design, _eigenvalues(reduced), with_total=True, scale=scale)
    covariance = _symmetric(basis @ np.linalg.inv(reduced) @ basis.T)
    start = np.outer(totals, np.full(n, 1.0 / n))
    means = start + rows_times(linear - rows_times(start, information), covariance)
    return means, covariance


def held_core(layout: SymmetricLayout, zeros: np.ndarray | None) -> np.ndarray | None:
    """The core cells of ``layout`` whose every cell ``zeros`` holds, when ``zeros`` is exactly
    those (whole core cells, as an occupancy group over the attributes not held symmetric
    gives; none for ``zeros`` None); None when it is not (such zeros cannot be held in the
    compact form)."""
    held = np.zeros(layout.core_cells, dtype=bool)
    if zeros is None:
        return held
    held[layout.core_of[zeros]] = True
    return held if np.array_equal(held[layout.core_of], zeros) else None


def _whole_core(layout: SymmetricLayout, zeros: np.ndarray | None) -> np.ndarray:
    """``held_core``, which a compact estimate's zeros always are (``ValueError`` if not)."""
    held = held_core(layout, zeros)
    if held is None:
        raise ValueError("a compact covariance holds only whole core cells at 0")
    return held


def hold_zeros(
    means: np.ndarray, covariance: Covariance, zeros: np.ndarray
) -> tuple[np.ndarray, Covariance]:
    """Leaves' GLS estimates (``means (k, n)`` sharing ``covariance``) conditioned on
    their cells ``zeros`` being 0, exact linear constraints like an invariant total (which
    ``covariance`` may already hold): the GLS of the same measurements with those cells held at
    0, its total unchanged, and exactly 0 there; a compact ``covariance`` only on whole core cells
    (``held_core``). The data must allow it (a total of 0 when every cell is held), as the
    occupancy rule's dwellings check does."""
    if not zeros.any():
        return means, covariance
    if isinstance(covariance, SymmetricMatrix):
        return _compact_hold_zeros(means, covariance, zeros)
    gain = covariance[:, zeros] @ np.linalg.pinv(
        covariance[np.ix_(zeros, zeros)], rcond=DETERMINED_TOLERANCE, hermitian=True
    )
    held_means = means - rows_times(means[:, zeros], gain.T)
    held = _symmetric(covariance - gain @ covariance[zeros, :])
    held_means[:, zeros] = 0.0
    held[zeros, :] = 0.0
    held[:, zeros] = 0.0
    return held_means, held


def leaf_covariance(design: LevelDesign, with_totals: bool) -> Covariance:
    """The covariance shared by every leaf of ``design``'s level (see ``leaf_estimates``)."""
    empty = [np.zeros((1, size)) for size in design.marginal_sizes]
    return leaf_estimates(design, empty, np.zeros(1) if with_totals else None)[1]


def sum_of(children: Sequence[Gaussian]) -> Gaussian:
    """The estimate of the sum of independent children; its total is exact when all are."""
    if not children:
        raise ValueError("sum_of: a parent needs at least one child")
    totals = [c.total for c in children]
    covariances = [c.covariance for c in children]
    covariance: Covariance
    if isinstance(covariances[0], SymmetricMatrix):
        blocks = [c.blocks for c in covariances if isinstance(c, SymmetricMatrix)]
        covariance = SymmetricMatrix(covariances[0].layout, np.sum(blocks, axis=0))
    else:
        covariance = np.sum([np.asarray(c) for c in covariances], axis=0)
    zeros = [c.zeros for c in children if c.zeros is not None]
    held = np.logical_and.reduce(zeros) if len(zeros) == len(children) else None
    return Gaussian(
        mean=np.sum([c.mean for c in children], axis=0),
        covariance=covariance,
        total=None
        if any(t is None for t in totals)
        else float(sum(t for t in totals if t is not None)),
        zeros=held if held is not None and held.any() else None,
    )


def update(prior: Gaussian, design: LevelDesign, answers: Sequence[np.ndarray]) -> Gaussian:
    """``prior`` combined with one node's own measurements (``answers[q]`` of length ``m_q``):
    the BLUE from both, exact for a singular prior covariance. An exact total is kept."""
    if isinstance(prior.covariance, SymmetricMatrix):
        return _compact_update(prior, prior.covariance, design, answers)
    matrix, weight = design.matrix()
    if matrix.shape[0] == 0:
        return prior
    y = design.stacked_answers(answers)
    covariance = prior.covariance
    innovation = matrix @ covariance @ matrix.T + np.diag(1.0 / weight)
    gain = np.linalg.solve(innovation, matrix @ covariance).T
    mean = prior.mean + gain @ (y - matrix @ prior.mean)
    keep = np.eye(design.n_cells) - gain @ matrix
    updated = keep @ covariance @ keep.T + (gain / weight) @ gain.T
    result = Gaussian(mean, _symmetric(updated), prior.total, prior.zeros)
    return result if prior.total is None else _exact_total(result, prior.total)


def condition_on_total(estimate: Gaussian, total: float, level: str = "") -> Gaussian:
    """``estimate`` conditioned on ``1^T x = total`` (exact linear constraint).

    If its total is already exact it must equal ``total`` (else ``ValueError``): then only
    round-off is removed."""
    if estimate.total is not None:
        if abs(estimate.total - total) > 0.5:
            raise ValueError(
                f"level {level}: the children's invariant totals sum to {estimate.total:g},"
                f" not the node's {total:g}"
            )
        return _exact_total(estimate, total)
    if isinstance(estimate.covariance, SymmetricMatrix):
        blocks = estimate.covariance.blocks.copy()
        along = blocks[0].sum(axis=1)
        spread = along[estimate.covariance.layout.core_of]
        variance = estimate.covariance.total_variance()
    else:
        spread = estimate.covariance.sum(axis=1)
        variance = float(spread.sum())
    if variance <= 0.0:  # every cell known to be 0: the total is known already
        return condition_on_total(replace(estimate, total=float(estimate.mean.sum())), total, level)
    if isinstance(estimate.covariance, SymmetricMatrix):
        mean = estimate.mean + spread * (total - float(estimate.mean.sum())) / variance
        blocks[0] -= np.outer(along, along) / float(along.sum())
        conditioned = SymmetricMatrix(estimate.covariance.layout, blocks).symmetric()
        return _exact_total(Gaussian(mean, conditioned, None, estimate.zeros), total)
    mean = estimate.mean + spread * (total - float(estimate.mean.sum())) / variance
    covariance = estimate.covariance - np.outer(spread, spread) / variance
    return _exact_total(Gaussian(mean, _symmetric(covariance), None, estimate.zeros), total)


def node_estimate(
    children: Sequence[Gaussian],
    design: LevelDesign,
    answers: Sequence[np.ndarray],
    total: float | None,
) -> Gaussian:
    """A parent's bottom-up BLUE from its children's estimates and its own measurements,
    conditioned on its invariant ``total`` when given."""
    estimate = update(sum_of(children), design, answers)
    return estimate if total is None else condition_on_total(estimate, total, design.level)


def _exact_total(estimate: Gaussian, total: float) -> Gaussian:
    """``estimate`` with ``1^T mean = total`` and ``covariance 1 = 0`` made exact: the
    orthogonal projection onto ``1^perp`` of the covariance and an even shift of the mean, both
    the identity in exact arithmetic for an estimate that already meets them (over the cells
    not known to be 0, which stay exactly 0)."""
    n = estimate.mean.shape[0]
    free = np.ones(n, dtype=bool) if estimate.zeros is None else ~estimate.zeros
    if not free.any():
        return Gaussian(estimate.mean, estimate.covariance, float(total), estimate.zeros)
    share = free / float(free.sum())
    mean = estimate.mean + (total - float(estimate.mean.sum())) * share
    if isinstance(estimate.covariance, SymmetricMatrix):
        # Only E_0 is not orthogonal to all-ones; its block is projected onto 1_N^perp (over
        # the core cells not known to be 0).
        core_free = ~_whole_core(estimate.covariance.layout, estimate.zeros)
        blocks = estimate.covariance.blocks.copy()
        projection = np.eye(core_free.size) - np.outer(core_free, core_free / core_free.sum())
        blocks[0] = projection @ blocks[0] @ projection
        compact = SymmetricMatrix(estimate.covariance.layout, blocks).symmetric()
        return Gaussian(mean, compact, float(total), estimate.zeros)
    projection = np.eye(n) - np.outer(free, share)
    covariance = _symmetric(projection @ estimate.covariance @ projection)
    return Gaussian(mean, covariance, float(total), estimate.zeros)


def total_variance(covariance: Covariance) -> float:
    """``1^T C 1``: the variance of the estimate's total."""
    if isinstance(covariance, SymmetricMatrix):
        return covariance.total_variance()
    return float(covariance.sum())


def fitting_targets(
    estimates: Sequence[Gaussian], precisions: Sequence[Covariance], free: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each child's quadratic ``(x - b)^T P (x - b)`` restricted to the cells ``free`` (a mask
    over the active cells; the others are fixed at zero): ``(targets (k, r), precisions
    (k, r, r))`` with target ``P_II^{-1} (P b)_I`` under precision ``P_II`` (the same quadratic
    up to a constant). Compact precisions are expanded on the free cells only."""
    means = np.stack([e.mean for e in estimates])
    if not isinstance(precisions[0], SymmetricMatrix):
        full = np.stack([np.asarray(p) for p in precisions])
        restricted = full[:, free][:, :, free]
        linear = (full @ means[:, :, None])[:, free, 0]
    else:
        cells = np.flatnonzero(free)
        compact = [p for p in precisions if isinstance(p, SymmetricMatrix)]
        restricted = np.stack([p.submatrix(cells) for p in compact])
        linear = np.stack([p.apply(m)[free] for p, m in zip(compact, means, strict=True)])
    targets = np.linalg.solve(restricted, linear[:, :, None])[:, :, 0]
    return targets, restricted


def _compact_leaf_estimates(
    design: LevelDesign,
    layout: SymmetricLayout,
    answers: Sequence[np.ndarray],
    totals: np.ndarray | None,
) -> tuple[np.ndarray, SymmetricMatrix]:
    """``leaf_estimates`` in the compact form: block by block, the total only in block 0."""
    information = information_matrix(layout, design.marginals, design.weights)
    linear = design.back_projection(answers)
    if totals is None:
        _require_identified(design, information.eigenvalues())
        covariance = information.inverse().symmetric()
        return covariance.apply(linear), covariance
    totals = np.asarray(totals, dtype=np.float64)
    core = layout.core_cells
    blocks = information.blocks.copy()
    others = information.blocks[1:]
    if core == 1:
        reduced_eigenvalues = np.zeros(0)
        blocks[0] = np.zeros((1, 1))
    else:
        basis = _complement_basis(core)
        reduced = basis.T @ information.blocks[0] @ basis
        reduced_eigenvalues = _eigenvalues(reduced)
        blocks[0] = basis @ np.linalg.inv(reduced) @ basis.T
    eigenvalues = np.concatenate([reduced_eigenvalues, np.linalg.eigvalsh(others).ravel()])
    scale = float(information.eigenvalues().max())
    _require_identified(design, eigenvalues, with_total=True, scale=scale)
    blocks[1:] = np.linalg.inv(others)
    covariance = SymmetricMatrix(layout, blocks).symmetric()
    start = np.outer(totals, np.full(design.n_cells, 1.0 / design.n_cells))
    means = start + covariance.apply(linear - information.apply(start))
    return means, covariance


def _compact_update(
    prior: Gaussian, covariance: SymmetricMatrix, design: LevelDesign, answers: Sequence[np.ndarray]
) -> Gaussian:
    """``update`` in the information form, block by block."""
    if not np.any(np.asarray(design.weights) > 0):
        return prior
    information = information_matrix(covariance.layout, design.marginals, design.weights)
    identity = SymmetricMatrix.identity(covariance.layout)
    updated = (identity + covariance @ information).solve(covariance).symmetric()
    residual = design.back_projection(answers) - information.apply(prior.mean)
    result = _zeros_exact(
        Gaussian(prior.mean + updated.apply(residual), updated, prior.total, prior.zeros)
    )
    return result if prior.total is None else _exact_total(result, prior.total)


def _zeros_exact(estimate: Gaussian) -> Gaussian:
    """A compact ``estimate`` with its known zeros set exactly to 0 (the block arithmetic of an
    update keeps them 0 only to round-off)."""
    if estimate.zeros is None or not isinstance(estimate.covariance, SymmetricMatrix):
        return estimate
    held = _whole_core(estimate.covariance.layout, estimate.zeros)
    mean = estimate.mean.copy()
    mean[estimate.zeros] = 0.0
    blocks = estimate.covariance.blocks.copy()
    blocks[:, held, :] = 0.0
    blocks[:, :, held] = 0.0
    return replace(
        estimate, mean=mean, covariance=SymmetricMatrix(estimate.covariance.layout, blocks)
    )


def _compact_hold_zeros(
    means: np.ndarray, covariance: SymmetricMatrix, zeros: np.ndarray
) -> tuple[np.ndarray, SymmetricMatrix]:
    """``hold_zeros`` block by block: ``zeros`` are whole core cells ``G`` (``held_core``), so
    ``C_SS^+ = sum_c E_c (x) (B_c)_GG^+`` and the gain is ``sum_c E_c (x) (B_c)_:G (B_c)_GG^+``."""
    held = _whole_core(covariance.layout, zeros)
    blocks = covariance.blocks
    gains = np.zeros_like(blocks)
    for c in range(blocks.shape[0]):
        inverse = np.linalg.pinv(
            blocks[c][np.ix_(held, held)], rcond=DETERMINED_TOLERANCE, hermitian=True
        )
        gains[c][:, held] = blocks[c][:, held] @ inverse
    held_means = means - SymmetricMatrix(covariance.layout, gains).apply(means)
    held_means[:, zeros] = 0.0
    held_blocks = blocks - gains @ blocks
    held_blocks[:, held, :] = 0.0
    held_blocks[:, :, held] = 0.0
    return held_means, SymmetricMatrix(covariance.layout, held_blocks).symmetric()


def _compact_precision(
    covariance: SymmetricMatrix, exact_total: bool, zeros: np.ndarray | None = None
) -> SymmetricMatrix:
    """``Gaussian.precision`` in the compact form, block by block as ``_dense_precision`` (the
    eigenvalues of block ``c`` count ``multiplicity[c]`` times); with ``zeros`` (whole core
    cells, ``hold_zeros``), the same on the other core cells and the identity on those."""
    layout = covariance.layout
    free = ~_whole_core(layout, zeros)
    blocks = covariance.blocks[:, free][:, :, free]
    if exact_total:
        values, vectors = np.linalg.eigh(0.5 * (blocks + blocks.transpose(0, 2, 1)))
        inverse = _inverse_eigenvalues(values, layout.multiplicity.astype(np.float64))
        inverted = (vectors * inverse[:, None, :]) @ vectors.transpose(0, 2, 1)
    else:
        inverted = np.linalg.inv(blocks)
    precision = SymmetricMatrix.identity(layout).blocks
    precision[np.ix_(np.arange(layout.n_components), free, free)] = inverted
    return SymmetricMatrix(layout, precision).symmetric()


DETERMINED_TOLERANCE = 1e-10
"""An eigenvalue of a covariance at most this times its largest is a direction known exactly."""


def _complement_basis(n: int) -> np.ndarray:
    """An orthonormal basis (``n x (n-1)``) of the vectors orthogonal to all-ones."""
    q, _ = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, : n - 1]]))
    return q[:, 1:]


def _eigenvalues(information: np.ndarray) -> np.ndarray:
    return np.linalg.eigvalsh(information) if information.size else np.zeros(1)


def _require_identified(
    design: LevelDesign,
    eigenvalues: np.ndarray,
    with_total: bool = False,
    scale: float | None = None,
) -> None:
    """Raise unless the smallest of ``eigenvalues`` is above ``IDENTIFIED_TOLERANCE`` times
    ``scale``: the largest eigenvalue of the information before the invariant total reduced
    it (given with the total), else the largest of ``eigenvalues``. With the total, the
    reduced matrix alone has no scale: on a 1 x 1 reduction its one eigenvalue is round-off
    of either sign and size, so comparing it with itself decides nothing."""
    largest = float(eigenvalues.max()) if scale is None else scale
    if float(eigenvalues.min()) <= IDENTIFIED_TOLERANCE * max(largest, 0.0):
        given = " together with the invariant total" if with_total else ""
        raise ValueError(
            f"level {design.level}: its queries{given} do not identify every cell (information"
            f" matrix singular), which full-information estimation needs at the leaves; add the"
            f" detailed query (or queries that determine every cell) to [{design.rule}]"
        )


def _symmetric(matrix: np.ndarray) -> np.ndarray:
    return 0.5 * (matrix + matrix.T)
