"""Weighted non-negative least squares for the children of one parent (the TopDown L2 stage).

Problem. For children ``c = 1..k`` with histograms ``x_c`` over ``n`` cells,

    minimise   sum_q w_q sum_c ||Q_q x_c - y_{q,c}||^2
    subject to x >= 0,
               sum_c x_c = parent                (cell by cell, when a parent is given),
               sum_j x_{c,j} = child_totals[c]   (when child totals are given),
               sum_j x_{c,j} = held_totals[c]    (when a first pass fitted them: ``passes``),
               x_{c,j} = 0                       (where ``allowed[c, j]`` is False, if given),
               lower <= sum_{j in g} x_{c,j} <= upper  (per group ``g``: ``group_bounds``).

The group bounds are not part of the method below: when its solution misses one, the problem
is solved again with them by ``bounded.solve_bounded`` (an interior-point QP).

Held totals are met exactly like invariant ones (below, "the child totals" means either).
Every child has the same Hessian ``H = 2 sum_q w_q Q_q^T Q_q``; only the linear term
``g_c = 2 sum_q w_q Q_q^T y_{q,c}`` differs. When the children were measured with different
weights ``w_{c,q}`` (bypassing: ``ChildrenProblem.weights`` of shape ``(k, Q)``) each child has
its own ``H_c``, handled as in ``solve_to_targets`` below.

``solve_to_targets`` solves the same constrained problem for the full-information top-down pass,
where child ``c`` is fitted to a target ``b_c`` under its own precision ``P_c``: objective
``sum_c (x_c - b_c)^T P_c (x_c - b_c)``, so each child has its own Hessian ``H_c = 2 P_c`` and
``g_c = 2 P_c b_c``. The method below is the same with ``H_c`` in place of ``H`` (per-child
inverses start from ``H_c^{-1}``, and the bordered updates read ``H_c``'s columns); it always
uses the exact method (no first-order fallback).

Method: an active-set method with exact face solves.

* A *face* fixes a set of entries ``x_{c,j} = 0`` (the active set) and leaves the others free.
  On a face the problem is an equality-constrained QP whose KKT system splits by child: with
  ``B_c`` the inverse of ``H`` restricted to child ``c``'s free cells (zero-padded to ``n x n``),
  ``x_c = B_c (g_c - lambda - mu_c 1)``, and the multipliers ``lambda`` (one per cell) and ``mu``
  (one per child) solve a dense system of size ``n`` (plus ``k``) built from the ``B_c``.
* ``B_c`` starts as ``H^{-1}`` (everything free) and is kept up to date with low-rank updates
  when entries are fixed (a Schur-complement downdate) or released (a bordered update), so a
  step that changes few entries costs ``O(n^2)`` per changed entry instead of a refactorisation.
* Updates lose accuracy: a release divides by a Schur complement that cancellation makes
  small when the released entries are nearly determined by the free ones, and the error
  already in ``B_c`` is multiplied by it. After every move the touched children's ``B_c`` are
  checked against their Hessians with one fixed random vector (``O(n^2)`` each) and computed
  again from the Hessian's free block when they have drifted (``INVERSE_DRIFT``); without it,
  ill-conditioned precisions (an optimized allocation's) turned ``B_c`` into noise within a
  few dozen steps and the iteration never settled.
* The active set is chosen by a primal-dual active-set iteration (semismooth Newton, Hintermueller,
  Ito & Kunisch 2003), which typically stops after 3-8 face solves. It is not guaranteed to
  converge for a Hessian that is not an M-matrix, so if it revisits an active set or runs too
  long, a primal active-set method (feasible iterates, monotone objective, finite) takes over
  from a feasible point on the last iterate's support; should that run out of steps too, from
  the support of an interior-point answer (Clarabel), or that answer itself.
* A point is returned only after a KKT check: free entries non-negative, multipliers of the
  fixed entries non-negative, stationarity and the equality constraints to round-off.
* Forbidden entries (``allowed`` False) are fixed from the start and never released: no free
  set contains them, and their multipliers, which the equality ``x_{c,j} = 0`` leaves free in
  sign, never count as blocking (not in the KKT check either). The primal method's strictly
  feasible starting point is then no longer the proportional split but the allowed mask
  scaled to the sums by iterative proportional fitting
  (``subproblem.masked_feasible_point``).
* When ``H`` is singular (the queries do not identify every cell) the solution is not unique;
  proximal-point iterations on ``H + delta I`` converge to one optimal solution.

Degenerate inputs are removed before solving: a cell whose parent count is 0 and a child whose
invariant total is 0 are all zeros, as are a child with no allowed cell and a cell with no
allowed child, and a single child with a parent equals the parent.

Large families. The exact method keeps an ``n x n`` inverse per child, so its memory and time
grow like ``k n^2`` (and ``n^3`` per factorisation). When ``k n^2`` of the reduced problem
exceeds ``EXACT_SIZE_LIMIT``, ``solve_children`` uses the first-order solver in
``first_order`` instead: ``O(k n Q)`` memory and time per iteration, and an objective certified
to be within ``1e-7`` relative of the optimum rather than a KKT point to round-off. The limit is
where the two took the same time on benchmark families (about 0.1-0.5 s, one BLAS thread).
The first-order method honours ``allowed`` in its projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from censusdp_spark.topdown.solvers.bounded import (
    meets_bounds,
    solve_bounded,
    solve_by_multipliers,
)
from censusdp_spark.topdown.solvers.first_order import solve_children_first_order
from censusdp_spark.topdown.solvers.subproblem import (
    ChildrenProblem,
    FreeBlock,
    PrecisionProblem,
    free_block,
    masked_feasible_point,
)

EXACT_SIZE_LIMIT = 2_000_000
"""``solve_children`` uses the exact method while ``k * n**2`` (after dropping zero cells and
children) is at most this, and the first-order method above it."""

_MAX_PDAS_STEPS = 30
_MAX_PRIMAL_STEPS = 5_000
_MAX_PRIMAL_STEPS_FROM_GUESS = 200
"""From an interior-point answer's support the exact steps are few when they converge at all;
past this many, that answer itself is returned."""
_MAX_PROXIMAL_STEPS = 50


def _quadratic_model(problem: ChildrenProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(H, g)`` with objective ``sum_c 0.5 x_c^T H_c x_c - g_c^T x_c`` plus a constant;
    ``H`` is ``(n, n)`` when the weights are shared, else ``(k, n, n)``."""
    n, k = problem.n_cells, problem.n_children
    per_child = problem.per_child_weights
    hessian = np.zeros((k, n, n) if per_child else (n, n))
    linear = np.zeros((k, n))
    weights = np.asarray(problem.weights)
    for q, (cell_to_marginal, answers) in enumerate(
        zip(problem.marginals, problem.noisy, strict=True)
    ):
        same_marginal = cell_to_marginal[:, None] == cell_to_marginal[None, :]
        if per_child:
            weight = weights[:, q]
            hessian += 2.0 * weight[:, None, None] * same_marginal[None, :, :]
            linear += 2.0 * weight[:, None] * answers[:, cell_to_marginal]
        else:
            hessian += 2.0 * weights[q] * same_marginal
            linear += 2.0 * weights[q] * answers[:, cell_to_marginal]
    return hessian, linear


def weighted_squared_error(problem: ChildrenProblem, x: np.ndarray) -> float:
    """``sum_q w_q sum_c ||Q_q x_c - y_{q,c}||^2`` at ``x`` (shape ``(k, n)``)."""
    total = 0.0
    k = problem.n_children
    offsets = np.arange(k)[:, None]
    weights = problem.child_weights()
    for q, (cell_to_marginal, size, answers) in enumerate(
        zip(problem.marginals, problem.marginal_sizes, problem.noisy, strict=True)
    ):
        index = (offsets * size + cell_to_marginal[None, :]).ravel()
        fitted = np.bincount(index, weights=x.ravel(), minlength=k * size).reshape(k, size)
        total += float(np.sum(weights[:, q, None] * (fitted - answers) ** 2))
    return total


def solve_children(
    problem: ChildrenProblem, method: Literal["auto", "exact", "first_order"] = "auto"
) -> np.ndarray:
    """The children's histograms minimising the weighted squared error of every query.

    Returns a float array of shape ``(k, n)`` that is non-negative, exactly 0 where
    ``allowed`` is False (when given), whose columns sum to the parent exactly up to round-off
    (when a parent is given) and whose rows sum to the child totals (when given). With the exact method it satisfies the KKT conditions of the problem in
    the module docstring to round-off; with the first-order method its objective is within
    ``first_order.RELATIVE_GAP`` (relative) of the optimum and the row sums hold to ``1e-11``
    or round-off. ``method="auto"`` picks the exact method up to ``EXACT_SIZE_LIMIT``. Raises ``ValueError``
    if the constraints cannot all hold or ``method`` is unknown.
    """
    if method not in ("auto", "exact", "first_order"):
        raise ValueError(f"method: unknown {method!r}")
    x, block = free_block(problem)
    if block is None:
        return x
    if method == "first_order" or (method == "auto" and block.size > EXACT_SIZE_LIMIT):
        x = solve_children_first_order(problem)
        if meets_bounds(problem.group_bounds, x):
            return x
        return _bounded(problem, *_quadratic_model(problem), block, start=None)
    return _exact(problem, *_quadratic_model(problem), x, block)


def _exact(
    problem: ChildrenProblem | PrecisionProblem,
    hessian: np.ndarray,
    linear: np.ndarray,
    x: np.ndarray,
    block: FreeBlock,
) -> np.ndarray:
    """The exact method: ``x`` (``free_block``'s, the entries outside ``block`` already final)
    with the block's entries minimising ``hessian`` and ``linear``'s quadratic under the
    equality constraints, then under ``problem.group_bounds`` (``_bounded``) if it breaks
    them."""
    rows, cols = block.rows, block.cols
    x[np.ix_(rows, cols)] = _solve_reduced(
        _reduced_hessian(hessian, block), linear[np.ix_(rows, cols)], _reduced_constraints(block)
    )
    if meets_bounds(problem.group_bounds, x):
        return x
    return _bounded(problem, hessian, linear, block, start=x)


def _bounded(
    problem: ChildrenProblem | PrecisionProblem,
    hessian: np.ndarray,
    linear: np.ndarray,
    block: FreeBlock,
    start: np.ndarray | None,
) -> np.ndarray:
    """The solution under ``problem.group_bounds`` on the entries of ``block`` that may be
    positive: from ``start``, the exact method's unbounded solution, by the multipliers'
    Newton method (``bounded.solve_by_multipliers``) if it succeeds, else (and always without
    ``start``: a family too large for exact solves) by ``bounded.solve_bounded``."""
    assert problem.group_bounds is not None  # meets_bounds holds without bounds
    rows, cols = block.rows, block.cols
    reduced = _reduced_constraints(block)
    reduced_hessian = _reduced_hessian(hessian, block)

    def shifted(shift: np.ndarray) -> np.ndarray:
        x = np.zeros(linear.shape)
        x[np.ix_(rows, cols)] = _solve_reduced(
            reduced_hessian, (linear + shift)[np.ix_(rows, cols)], reduced
        )
        return x

    found = None if start is None else solve_by_multipliers(shifted, start, problem.group_bounds)
    if found is not None:
        return found
    may_hold = block.rows[:, None] & block.cols[None, :]
    if problem.allowed is not None:
        may_hold &= problem.allowed
    parent = None if problem.parent is None else problem.parent.astype(float)
    return solve_bounded(
        hessian, linear, may_hold, (parent, problem.row_sums), problem.group_bounds
    )


def _reduced_hessian(hessian: np.ndarray, block: FreeBlock) -> np.ndarray:
    """``hessian`` (shared ``(n, n)`` or per child ``(k, n, n)``) on the block's cells (and
    rows)."""
    if hessian.ndim == 3:
        return hessian[np.ix_(block.rows, block.cols, block.cols)]
    return hessian[np.ix_(block.cols, block.cols)]


def solve_to_targets(problem: PrecisionProblem) -> np.ndarray:
    """The children's histograms closest to their targets, each in its own precision's norm.

    Minimises ``sum_c (x_c - b_c)^T P_c (x_c - b_c)`` subject to ``x >= 0``, the columns summing
    to the parent (when given), the rows to the child totals (when given) and ``x`` zero where
    ``allowed`` is False (when given). Returns a float array ``(k, n)`` satisfying the KKT
    conditions to round-off (the exact method's check), exactly 0 on forbidden entries; a lone
    child with a parent is the parent. Raises ``ValueError`` if the constraints cannot all
    hold.
    """
    x, block = free_block(problem)
    if block is None:
        return x
    hessians = 2.0 * problem.precisions
    linear = 2.0 * _apply(problem.precisions, problem.targets)
    return _exact(problem, hessians, linear, x, block)


@dataclass(frozen=True)
class _Constraints:
    """Equality constraints of a reduced problem: all listed sums are positive, and entries
    where ``allowed`` (if not None) is False are zero."""

    column_sums: np.ndarray | None
    row_sums: np.ndarray | None
    allowed: np.ndarray | None = None

    def only_allowed(self, entries: np.ndarray) -> np.ndarray:
        """``entries`` without the forbidden ones."""
        return entries if self.allowed is None else entries & self.allowed


def _reduced_constraints(block: FreeBlock) -> _Constraints:
    return _Constraints(
        column_sums=None if block.parent is None else block.parent[block.cols],
        row_sums=None if block.totals is None else block.totals[block.rows],
        allowed=block.allowed,
    )


def _solve_reduced(hessian: np.ndarray, linear: np.ndarray, sums: _Constraints) -> np.ndarray:
    """Solve the QP on rows and columns with positive sums, handling a singular Hessian.

    ``hessian`` is ``(n, n)``, shared by every child, or ``(k, n, n)``, one per child."""
    scale = float(np.max(np.abs(np.diagonal(hessian, axis1=-2, axis2=-1))))
    smallest = float(np.min(np.linalg.eigvalsh(hessian)[..., 0]))
    if smallest > 1e-10 * scale:
        return _solve_definite(hessian, linear, sums, start=None)
    # Proximal point: each step solves the problem plus delta/2 ||x - x_prev||^2, which has a
    # definite Hessian; the iterates converge to a minimiser of the original problem.
    delta = 1e-2 * scale
    shifted = hessian + delta * np.eye(hessian.shape[-1])
    x = _solve_definite(shifted, linear, sums, start=None)
    for _ in range(_MAX_PROXIMAL_STEPS):
        x_next = _solve_definite(shifted, linear + delta * x, sums, start=x > 0)
        change = float(np.max(np.abs(x_next - x)))
        x = x_next
        if change <= 1e-12 * max(1.0, float(np.max(np.abs(x)))):
            break
    return x


class _Face:
    """A face (which entries are free) with what a face solve needs, kept up to date.

    Per child ``c``: ``B_c``, the inverse of the Hessian restricted to the child's free cells,
    zero-padded to ``n x n``; ``a_c = B_c g_c``; ``b_c = B_c 1``. Over children:
    ``S = sum_c B_c``. Fixing or releasing ``r`` entries of a child changes ``B_c`` by a
    rank-``r`` term, and the sums by the same term applied to them. ``hessian`` is ``(n, n)``
    (shared) or ``(k, n, n)`` (one per child).
    """

    def __init__(self, hessian: np.ndarray, linear: np.ndarray, free: np.ndarray) -> None:
        k, n = free.shape
        self.hessian = hessian
        self.linear = linear
        self.free = np.ones((k, n), dtype=bool)
        self._probe = np.random.default_rng(0).standard_normal((k, n))
        if hessian.ndim == 2:
            inverse = np.linalg.inv(hessian)
            inverse = 0.5 * (inverse + inverse.T)
            self.inverses = np.broadcast_to(inverse, (k, n, n)).copy()
            self.column_sum = k * inverse
            self.row_vectors = np.broadcast_to(inverse.sum(axis=1), (k, n)).copy()
            self.fitted = linear @ inverse
        else:
            inverses = np.linalg.inv(hessian)
            self.inverses = 0.5 * (inverses + inverses.transpose(0, 2, 1))
            self.column_sum = self.inverses.sum(axis=0)
            self.row_vectors = self.inverses.sum(axis=2)
            self.fitted = _apply(self.inverses, linear)
        self.move_to(free)

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """``H_c x_c - g_c`` for every child."""
        if self.hessian.ndim == 2:
            return x @ self.hessian - self.linear
        return _apply(self.hessian, x) - self.linear

    def _hessian_columns(self, children: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``H_c[:, index[i]]`` for each listed child ``c = children[i]``: ``(r, n, width)``."""
        if self.hessian.ndim == 2:
            return self.hessian[:, index].transpose(1, 0, 2)
        return np.take_along_axis(self.hessian[children], index[:, None, :], axis=2)

    def refreshed(self) -> _Face:
        """This face, its sums recomputed to drop the round-off that updates accumulated."""
        self.column_sum = self.inverses.sum(axis=0)
        self.row_vectors = self.inverses.sum(axis=2)
        self.fitted = _apply(self.inverses, self.linear)
        return self

    def move_to(self, free: np.ndarray) -> None:
        """Change the free set to ``free``; the inverses of the children whose updates lost
        accuracy are computed again (``_drifted``)."""
        to_fix = self.free & ~free
        to_release = free & ~self.free
        if to_fix.any():
            self._fix(to_fix)
        if to_release.any():
            self._release(to_release)
        drifted = self._drifted(np.flatnonzero((to_fix | to_release).any(axis=1)))
        if drifted.size:
            self._invert_again(drifted)

    def _drifted(self, children: np.ndarray) -> np.ndarray:
        """The listed children whose ``B_c`` no longer inverts ``H_c`` on their free cells to
        ``INVERSE_DRIFT``: ``H_c B_c z`` against ``z`` for a fixed random ``z`` on the free
        cells (``O(n^2)`` per child). A bordered update divides by a Schur complement that
        cancellation makes small when the released entries are nearly determined by the free
        ones, and each such update multiplies the error already there: left alone, a few dozen
        steps on an ill-conditioned precision turn ``B_c`` into noise."""
        if children.size == 0:
            return children
        free = self.free[children]
        probe = np.where(free, self._probe[: children.size], 0.0)
        applied = _apply(self._blocks(children), probe)
        if self.hessian.ndim == 2:
            back = applied @ self.hessian  # symmetric: H B z for every child at once
        else:
            every = children.size == self.hessian.shape[0]
            back = _apply(self.hessian if every else self.hessian[children], applied)
        error = np.linalg.norm(np.where(free, back - probe, 0.0), axis=1)
        return children[error > INVERSE_DRIFT * np.linalg.norm(probe, axis=1)]

    def _invert_again(self, children: np.ndarray) -> None:
        """``B_c`` of the listed children from their Hessians' free blocks, and the sums."""
        for c in children:
            cells = np.flatnonzero(self.free[c])
            hessian = self.hessian if self.hessian.ndim == 2 else self.hessian[c]
            inverse = np.linalg.inv(hessian[np.ix_(cells, cells)])
            self.inverses[c] = 0.0
            self.inverses[c][np.ix_(cells, cells)] = 0.5 * (inverse + inverse.T)
        self.refreshed()

    def _fix(self, entries: np.ndarray) -> None:
        """Schur-complement downdate ``B_c <- B_c - B_c[:, D] B_c[D, D]^{-1} B_c[D, :]``."""
        children, index, valid = _padded_indices(entries)
        blocks = self._blocks(children)
        columns = np.take_along_axis(blocks, index[:, None, :], axis=2) * valid[:, None, :]
        pivot = _pad_identity(np.take_along_axis(columns, index[:, :, None], axis=1), valid)
        scaled = columns @ np.linalg.inv(pivot)
        self._add_low_rank(children, blocks, -scaled, columns)
        # The fixed rows and columns are now zero up to round-off; make them exactly zero.
        position, column = np.nonzero(valid)
        blocks[position, index[position, column], :] = 0.0
        blocks[position, :, index[position, column]] = 0.0
        self._store(children, blocks)
        self.free &= ~entries

    def _release(self, entries: np.ndarray) -> None:
        """Bordered update ``B_c <- B_c + V T^{-1} V^T`` with ``V = B_c H[:, R] - E_R``."""
        children, index, valid = _padded_indices(entries)
        blocks = self._blocks(children)
        h_columns = self._hessian_columns(children, index) * valid[:, None, :]
        border = blocks @ h_columns
        schur = np.take_along_axis(h_columns, index[:, :, None], axis=1) - (
            h_columns.transpose(0, 2, 1) @ border
        )
        schur = _pad_identity(schur, valid)
        position, column = np.nonzero(valid)
        border[position, index[position, column], column] -= 1.0
        self._add_low_rank(children, blocks, border @ np.linalg.inv(schur), border)
        self._store(children, blocks)
        self.free |= entries

    def _add_low_rank(
        self, children: np.ndarray, blocks: np.ndarray, left: np.ndarray, right: np.ndarray
    ) -> None:
        """Add ``left_c right_c^T`` to ``B_c`` of each listed child, and to the sums."""
        n = blocks.shape[1]
        blocks += left @ right.transpose(0, 2, 1)
        self.column_sum += left.transpose(1, 0, 2).reshape(n, -1) @ (
            right.transpose(1, 0, 2).reshape(n, -1).T
        )
        self.row_vectors[children] += _apply(left, right.sum(axis=1))
        weights = (right.transpose(0, 2, 1) @ self.linear[children][:, :, None])[:, :, 0]
        self.fitted[children] += _apply(left, weights)

    def _blocks(self, children: np.ndarray) -> np.ndarray:
        """The inverses of ``children``: a view when all children are involved, else a copy."""
        if children.shape[0] == self.inverses.shape[0]:
            return self.inverses
        return self.inverses[children]

    def _store(self, children: np.ndarray, blocks: np.ndarray) -> None:
        if blocks is not self.inverses:
            self.inverses[children] = blocks


def _padded_indices(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``entries`` with any True, their True columns padded to equal length.

    Returns ``(children, index, valid)``: ``index[i, :]`` lists child ``children[i]``'s marked
    columns, padded with column 0, and ``valid`` marks the real ones.
    """
    children = np.flatnonzero(entries.any(axis=1))
    marked = entries[children]
    counts = marked.sum(axis=1)
    width = int(counts.max())
    order = np.argsort(~marked, axis=1, kind="stable")[:, :width]
    valid = np.arange(width)[None, :] < counts[:, None]
    return children, np.where(valid, order, 0), valid


def _pad_identity(blocks: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """``blocks`` with the rows and columns of padding replaced by the identity's."""
    pad = ~valid
    blocks = np.where(pad[:, :, None] | pad[:, None, :], 0.0, blocks)
    width = valid.shape[1]
    blocks[:, np.arange(width), np.arange(width)] += pad
    return blocks


@dataclass(frozen=True)
class _FaceSolution:
    """The minimiser on a face with its multipliers.

    ``dual`` holds, per entry, ``grad + lambda_j + mu_c``: zero on free entries, and the
    multiplier of ``x_{c,j} >= 0`` on fixed ones.
    """

    x: np.ndarray
    dual: np.ndarray


def _solve_face(face: _Face, sums: _Constraints) -> _FaceSolution:
    """Minimise on the face: fixed entries zero, equality constraints, no sign constraints."""
    x = face.fitted
    shift = np.zeros_like(x)
    if sums.column_sums is not None or sums.row_sums is not None:
        lam, mu = _multipliers(face, sums)
        shift = lam[None, :] + mu[:, None]
        x = x - _apply(face.inverses, shift)
    x = np.where(face.free, x, 0.0)
    dual = face.gradient(x) + shift
    return _FaceSolution(x=x, dual=np.where(face.free, 0.0, dual))


def _apply(matrices: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``M_c v_c`` for every ``c``."""
    return (matrices @ vectors[:, :, None])[:, :, 0]


def _multipliers(face: _Face, sums: _Constraints) -> tuple[np.ndarray, np.ndarray]:
    """Multipliers ``(lambda, mu)`` of the column and row sums on a face.

    With ``x_c = a_c - B_c (lambda + mu_c 1)``: column sums give
    ``S lambda + sum_c mu_c b_c = sum_c a_c - p`` and row sums give
    ``b_c^T lambda + beta_c mu_c = 1^T a_c - t_c``, where ``beta_c = 1^T b_c``.
    """
    k, n = face.fitted.shape
    row_vectors = face.row_vectors
    if sums.column_sums is None:
        mu = (face.fitted.sum(axis=1) - _require(sums.row_sums)) / row_vectors.sum(axis=1)
        return np.zeros(n), mu
    column_rhs = face.fitted.sum(axis=0) - sums.column_sums
    if sums.row_sums is None:
        return _solve_spd(face.column_sum, column_rhs), np.zeros(k)
    row_weight = row_vectors.sum(axis=1)
    row_rhs = face.fitted.sum(axis=1) - sums.row_sums
    # Eliminate mu; the reduced matrix has the all-ones null vector (lambda + s, mu - s give
    # the same x), which a rank-one term removes without changing the solution.
    reduced = face.column_sum - (row_vectors.T / row_weight) @ row_vectors
    reduced_rhs = column_rhs - row_vectors.T @ (row_rhs / row_weight)
    gauge = float(np.trace(reduced)) / n
    lam = _solve_spd(reduced + gauge / n, reduced_rhs)
    mu = (row_rhs - row_vectors @ lam) / row_weight
    return lam, mu


def _solve_spd(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve a symmetric positive semi-definite system, by least squares if it is singular."""
    try:
        factor = np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(matrix, rhs, rcond=None)[0]
    return np.linalg.solve(factor.T, np.linalg.solve(factor, rhs))


def _require(values: np.ndarray | None) -> np.ndarray:
    if values is None:
        raise AssertionError("a constraint needed here is missing")
    return values


def _solve_definite(
    hessian: np.ndarray, linear: np.ndarray, sums: _Constraints, start: np.ndarray | None
) -> np.ndarray:
    """Active-set solve of the QP with a positive definite Hessian.

    ``start`` is an optional guess of the free set (True = free).
    """
    k, n = linear.shape
    free = sums.only_allowed(np.ones((k, n), dtype=bool) if start is None else start.copy())
    face = _Face(hessian, linear, _keep_feasible(free, np.ones((k, n)), sums))
    scale = _tolerance_scale(hessian, linear, sums)
    found, last = _primal_dual_active_set(face, sums, scale)
    if found is not None:
        return found
    # Cycling or out of steps (a Hessian that is not an M-matrix): the primal method, which
    # always ends, from the last iterate's support (a face near the optimum: few steps).
    try:
        return _primal_active_set(
            face, hessian, linear, sums, _on_support(last, _support(last, 0.0, sums), sums), scale
        )
    except RuntimeError:
        pass
    # Out of steps even so: an interior-point answer's support, from which the exact steps
    # settle, or that answer itself.
    guess = _interior_point_guess(hessian, linear, sums)
    if guess is None:
        raise RuntimeError("primal active-set method did not converge")
    support = _support(guess, SUPPORT * scale.x, sums)
    face.move_to(support)
    found, _ = _primal_dual_active_set(face, sums, scale)
    if found is not None:
        return found
    start_there = _on_support(guess, support, sums)
    try:
        return _primal_active_set(
            face, hessian, linear, sums, start_there, scale, _MAX_PRIMAL_STEPS_FROM_GUESS
        )
    except RuntimeError:
        # the interior point's answer to its tolerance (1e-12 of the data's scale), on its
        # support: the rounding that follows makes it integral anyway
        return start_there


def _support(x: np.ndarray, threshold: float, sums: _Constraints) -> np.ndarray:
    """The allowed entries of ``x`` above ``threshold``, with one entry more in any line
    that would have none (``_keep_feasible``)."""
    return _keep_feasible(sums.only_allowed(x > threshold), x, sums)


INVERSE_DRIFT = 1e-9
"""A child's ``B_c`` is computed again when ``||H_c B_c z - z|| > INVERSE_DRIFT ||z||`` on its
free cells (a fresh inverse is near ``1e-16`` times the condition number)."""
SUPPORT = 1e-7
INTERIOR_POINT_MAX_ENTRIES = 20_000_000
"""The largest Hessian (entries over every child's cells) handed to the interior-point method
(about 160 MB of values; its factorisation as much again): a family of 50 children of 1,890
cells would take over 10 GB, so larger ones go on with the exact primal steps alone."""
"""An interior-point answer's entries above this (relative to the largest sum) start free."""


def _primal_dual_active_set(
    face: _Face, sums: _Constraints, scale: _Scale
) -> tuple[np.ndarray | None, np.ndarray]:
    """Primal-dual active-set steps from ``face``: the minimiser (None if the steps cycle or
    run out) and the last face minimiser."""
    seen: set[bytes] = set()
    solution = _solve_face(face, sums)
    for _ in range(_MAX_PDAS_STEPS):
        if _is_optimal(solution, face, sums, scale):
            solution = _solve_face(face.refreshed(), sums)
            if _is_optimal(solution, face, sums, scale):
                return _clean(solution, face), solution.x
            continue
        negative = face.free & (solution.x < -1e-12 * scale.x)
        blocked = _blocked(solution, face, sums, scale)
        seen.add(face.free.tobytes())
        free = (face.free & ~negative) | blocked
        free = _keep_feasible(free, solution.x - solution.dual, sums)
        if free.tobytes() in seen:
            break
        face.move_to(free)
        solution = _solve_face(face, sums)
    return None, solution.x


def _on_support(guess: np.ndarray, support: np.ndarray, sums: _Constraints) -> np.ndarray:
    """``guess`` with the entries off ``support`` set to 0 and the sums restored by scaling
    rows and columns in turn (the mass moved is the interior point's round-off), so that the
    primal method starts on that face rather than with every entry free."""
    x = np.where(support, np.maximum(guess, 0.0), 0.0)
    for _ in range(50):
        if sums.column_sums is not None:
            columns = x.sum(axis=0)
            x *= np.divide(sums.column_sums, columns, out=np.ones_like(columns), where=columns > 0)
        if sums.row_sums is not None:
            rows = x.sum(axis=1)
            x *= np.divide(sums.row_sums, rows, out=np.ones_like(rows), where=rows > 0)[:, None]
    return x


def _interior_point_guess(
    hessian: np.ndarray, linear: np.ndarray, sums: _Constraints
) -> np.ndarray | None:
    """The interior-point method's answer to the problem (``bounded.solve_bounded`` without
    group bounds), or None when it finds none."""
    k, n = linear.shape
    may_hold = sums.only_allowed(np.ones((k, n), dtype=bool))
    if int((may_hold.sum(axis=1) ** 2).sum()) > INTERIOR_POINT_MAX_ENTRIES:
        return None
    try:
        return solve_bounded(hessian, linear, may_hold, (sums.column_sums, sums.row_sums), None)
    except ValueError:
        return None


@dataclass(frozen=True)
class _Scale:
    """Magnitudes against which the sign tests on ``x`` and on the multipliers are made."""

    x: float
    dual: float


def _tolerance_scale(hessian: np.ndarray, linear: np.ndarray, sums: _Constraints) -> _Scale:
    sizes = [1.0]
    for values in (sums.column_sums, sums.row_sums):
        if values is not None:
            sizes.append(float(values.max()))
    x_scale = max(sizes)
    dual_scale = max(float(np.max(np.abs(linear), initial=0.0)), float(hessian.max()) * x_scale)
    return _Scale(x=x_scale, dual=dual_scale)


def _keep_feasible(free: np.ndarray, preference: np.ndarray, sums: _Constraints) -> np.ndarray:
    """``free`` with one entry released in every column and row that would have none.

    A face with an empty column (or row) cannot meet its positive sum; the released entry is
    the allowed one with the largest ``preference``.
    """
    free = free.copy()
    if sums.allowed is not None:
        preference = np.where(sums.allowed, preference, -np.inf)
    if sums.column_sums is not None:
        empty = np.flatnonzero(~free.any(axis=0))
        free[np.argmax(preference[:, empty], axis=0), empty] = True
    if sums.row_sums is not None:
        empty = np.flatnonzero(~free.any(axis=1))
        free[empty, np.argmax(preference[empty, :], axis=1)] = True
    return free


def _blocked(solution: _FaceSolution, face: _Face, sums: _Constraints, scale: _Scale) -> np.ndarray:
    """The fixed allowed entries whose multipliers are negative (they want to move up)."""
    return sums.only_allowed(~face.free & (solution.dual < -1e-12 * scale.dual))


def _is_optimal(solution: _FaceSolution, face: _Face, sums: _Constraints, scale: _Scale) -> bool:
    """Whether the face minimiser is non-negative and no fixed allowed entry wants to move up
    (a forbidden entry's multiplier may have either sign)."""
    negative = face.free & (solution.x < -1e-12 * scale.x)
    return not negative.any() and not _blocked(solution, face, sums, scale).any()


def _clean(solution: _FaceSolution, face: _Face) -> np.ndarray:
    """The face minimiser with round-off below zero removed."""
    return np.where(face.free, np.maximum(solution.x, 0.0), 0.0)


def _primal_active_set(
    face: _Face,
    hessian: np.ndarray,
    linear: np.ndarray,
    sums: _Constraints,
    guess: np.ndarray,
    scale: _Scale,
    max_steps: int | None = None,
) -> np.ndarray:
    """A primal active-set method started from a feasible point near ``guess``; raises
    ``RuntimeError`` after ``max_steps`` steps, or at once when a step moves neither the point
    nor the face (each later step would be the same).

    Iterates stay feasible and the objective never increases: a face minimiser that is not
    feasible is approached until the first entry reaches zero, which is then fixed; at a
    feasible face minimiser, fixed entries whose multipliers are negative are released.
    """
    x = _feasible_point_near(guess, sums)
    face.move_to(_keep_feasible(x > 0, x, sums))
    for _ in range(_MAX_PRIMAL_STEPS if max_steps is None else max_steps):
        solution = _solve_face(face, sums)
        step = solution.x - x
        decreasing = face.free & (step < 0)
        ratios = np.where(decreasing, x / np.where(decreasing, -step, 1.0), np.inf)
        length = float(ratios.min(initial=np.inf))
        if length < 1.0:
            x = np.maximum(x + length * step, 0.0)
            blocking = decreasing & (ratios <= length)
            free = _keep_feasible(face.free & ~blocking, x, sums)
            if length == 0.0 and np.array_equal(free, face.free):
                # Neither the point nor the face moves: every later step would repeat this
                # one (a line the blocking entry must stay free in; round-off in a badly
                # scaled problem). Give up now rather than after max_steps.
                raise RuntimeError("primal active-set method stalled")
            face.move_to(free)
            continue
        x = solution.x
        blocked = _blocked(solution, face, sums, scale)
        if not blocked.any():
            solution = _solve_face(face.refreshed(), sums)
            if _is_optimal(solution, face, sums, scale):
                return _clean(solution, face)
            continue
        most = np.unravel_index(np.argmin(np.where(blocked, solution.dual, 0.0)), x.shape)
        release = np.zeros_like(blocked)
        release[most] = True
        face.move_to(face.free | release)
    raise RuntimeError("primal active-set method did not converge")


def _feasible_point_near(guess: np.ndarray, sums: _Constraints) -> np.ndarray:
    """The feasible point closest to ``guess`` along the segment from a strictly feasible one.

    ``guess`` satisfies the equality constraints and is zero on forbidden entries; the
    proportional split ``t_c p_j / sum(p)`` (or ``p_j / k``, or ``t_c / n``) is strictly
    positive and feasible. With forbidden entries the starting point is ``masked_feasible_point``
    instead: zero on them, positive on the allowed entries where a feasible point can be.
    """
    k, n = guess.shape
    if sums.column_sums is None and sums.row_sums is None:
        return np.maximum(guess, 0.0)
    if sums.allowed is not None:
        interior = masked_feasible_point(sums.allowed, sums.column_sums, sums.row_sums)
    elif sums.column_sums is not None and sums.row_sums is not None:
        interior = np.outer(sums.row_sums, sums.column_sums) / sums.column_sums.sum()
    elif sums.column_sums is not None:
        interior = np.broadcast_to(sums.column_sums / k, (k, n)).copy()
    else:
        interior = np.broadcast_to(_require(sums.row_sums)[:, None] / n, (k, n)).copy()
    step = guess - interior
    decreasing = step < 0
    ratios = np.where(decreasing, interior / np.where(decreasing, -step, 1.0), np.inf)
    length = min(1.0, float(ratios.min(initial=np.inf)))
    return np.maximum(interior + length * step, 0.0)
