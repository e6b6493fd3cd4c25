"""A first-order solver of the children's least-squares problem, for families too large for
the exact active-set method in ``least_squares``.

Problem (as in ``least_squares``): with ``x`` of shape ``(k, n)``,

    minimise   f(x) = sum_q w_q sum_c ||Q_q x_c - y_{q,c}||^2
    subject to x >= 0,  sum_c x_c = parent (when given),  sum_j x_{c,j} = child_totals[c] (when
               given),  x_{c,j} = 0 where ``allowed[c, j]`` is False (when given).

Method: FISTA (accelerated projected gradient, Beck & Teboulle 2009) with gradient-based
adaptive restart (O'Donoghue & Candes 2015). Nothing of size ``n x n`` is formed:

* The stacked 0/1 query matrix ``S`` (``n x sum_q m_q``, ``Q`` non-zeros per row) is sparse, so
  the answers ``x S``, the objective and the gradient ``2 ((x S - y) * w) S^T`` of all children
  cost ``O(k n Q)``.
* The step is ``1 / L`` with ``L`` the largest eigenvalue of ``H = 2 sum_q w_q Q_q^T Q_q``
  (Lanczos on the sparse operator, with a 2% margin, never above the safe bound
  ``2 sum_q w_q (largest marginal cell of Q_q)``).
* Projection onto the feasible set is exact in closed form when there are no child totals:
  each cell's column ``{x_{.,j} >= 0, sum_c x_{c,j} = p_j}`` is a scaled simplex (sort-based
  projection, vectorised over cells); at the root ``{x >= 0}`` is a clip and with a total it is
  one simplex. With both a parent and child totals (a transportation polytope) the projection
  is computed by block-coordinate ascent on its dual, which is Dykstra's algorithm between the
  column simplices and the row sums: ``x = max(v - a_j - b_c, 0)``, alternately solving for
  the cell thresholds ``a`` and the child thresholds ``b``, warm-started from the previous
  projection, until the row sums are met to ``1e-9`` times the largest sum.
* Forbidden entries (``allowed``) are fixed at 0: the feasible set is the face of the one
  above where they vanish, and its projection is the same computation with the forbidden
  entries of ``v`` set to ``-inf`` (each simplex and threshold then ranges over the allowed
  entries only; ``max(-inf - a, 0) = 0``). The duality-gap bound below minimises over the
  allowed entries only. With both sums a mask can leave no feasible point although every
  line has an allowed entry; ``subproblem.masked_feasible_point`` checks that first.

Accuracy. Every ``_CHECK_EVERY`` iterations the solver computes a duality-gap certificate
``f(x) - f* <= <g, x> - min_s <g, s>`` over feasible ``s`` (``g`` the gradient at ``x``; the
minimum is bounded below by LP duality with any thresholds, the last projection's being the
right ones at the optimum; at the root without a total, ``s`` ranges over the points whose
total is small enough to beat ``x``). It stops when the certificate is at most
``RELATIVE_GAP * f(x)``, so the returned objective is provably within ``1e-7`` relative of the
optimum (``f`` here omits the constant of marginal cells no active cell reaches, which only
makes the test stricter). In practice the gap closes far below that: on the test and benchmark
families the objective matches the exact method and Clarabel to 1e-9 relative or better. If
``MAX_ITERATIONS`` pass first (a singular or very ill-conditioned Hessian), it warns and returns
the best point seen, without the guarantee. Unlike the exact path there is no KKT certificate
to round-off, and entries that are zero at the optimum may be small positive numbers.

The returned point is non-negative, its column sums are the parent's to round-off, and its row
sums are the child totals' to ``1e-11`` absolute or as near as round-off allows.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sparse
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

from censusdp_spark.topdown.solvers.subproblem import (
    ChildrenProblem,
    FreeBlock,
    free_block,
    masked_feasible_point,
)

RELATIVE_GAP = 1e-7
"""Stop when the certified suboptimality is at most this fraction of the objective."""

MAX_ITERATIONS = 20_000
_CHECK_EVERY = 10
_MAX_DUAL_SWEEPS = 10_000
_SUM_TOLERANCE = 1e-9
"""While iterating, a transportation projection meets the row sums to this times the largest
sum (or 1e-12)."""
_FINAL_SUM_TOLERANCE = 1e-11
"""The returned point meets the row sums to this (absolute), or as near as round-off allows."""


@dataclass(frozen=True, kw_only=True)
class _Model:
    """The objective in the cells-by-children layout ``z = x^T`` (shape ``(n, k)``).

    ``answers = stacked_t @ z`` (shape ``(M, k)``); ``f = sum(weight * (answers - noisy)^2)``,
    ``weight`` of shape ``(M, 1)`` (shared by the children) or ``(M, k)`` (child by child).
    """

    stacked: sparse.csr_matrix  # n x M
    stacked_t: sparse.csr_matrix  # M x n
    noisy: np.ndarray  # M x k
    weight: np.ndarray  # M x 1, or M x k
    safe_lipschitz: float  # 2 sum_q max_c w_{c,q} (largest marginal cell of Q_q)
    query_of: np.ndarray  # M: the query of each stacked marginal cell

    def objective_and_gradient(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        residual = self.stacked_t @ z - self.noisy
        weighted = self.weight * residual
        return float(np.sum(weighted * residual)), 2.0 * (self.stacked @ weighted)

    def gradient(self, z: np.ndarray) -> np.ndarray:
        return 2.0 * (self.stacked @ (self.weight * (self.stacked_t @ z - self.noisy)))

    def total_bound(self, value: float) -> np.ndarray:
        """Per child, an upper bound on ``sum_j x_j`` at any point whose objective is at most
        ``value``: each marginal cell's answer is within ``sqrt(value / w_q)`` of its noisy
        one, and a query's marginal cells add up to the child's total."""
        bound = np.full(self.noisy.shape[1], np.inf)
        for q in np.unique(self.query_of):
            mine = self.query_of == q
            weight = self.weight[mine][0]  # (1,) or (k,)
            measured = weight > 0.0
            if measured.any():
                slack = np.count_nonzero(mine) * np.sqrt(value / np.where(measured, weight, 1.0))
                here = np.where(measured, self.noisy[mine].sum(axis=0) + slack, np.inf)
                bound = np.minimum(bound, here)
        return bound

    def lipschitz(self) -> float:
        """The largest eigenvalue of the per-child Hessian ``2 S diag(w) S^T``, with a margin;
        with weights by child, of ``2 S diag(max_c w_c) S^T``, above every child's."""
        n = self.stacked.shape[0]
        weight = self.weight.max(axis=1)
        if n <= 50:
            hessian = 2.0 * (self.stacked @ sparse.diags(weight) @ self.stacked_t).toarray()
            return min(self.safe_lipschitz, 1.02 * float(np.linalg.eigvalsh(hessian)[-1]))
        operator = LinearOperator(
            (n, n),
            matvec=lambda v: 2.0 * (self.stacked @ (weight * (self.stacked_t @ v))),
            dtype=float,
        )
        try:
            largest = eigsh(operator, k=1, which="LA", tol=1e-4, return_eigenvectors=False)[0]
        except ArpackNoConvergence:
            return self.safe_lipschitz
        return min(self.safe_lipschitz, 1.02 * float(largest))


def _build_model(problem: ChildrenProblem, rows: np.ndarray, cols: np.ndarray) -> _Model:
    n = int(cols.sum())
    blocks, noisy, weights, query_of = [], [], [], []
    safe_lipschitz = 0.0
    by_child = problem.child_weights()[rows] if problem.per_child_weights else None
    for q, (cell_to_marginal, answers) in enumerate(
        zip(problem.marginals, problem.noisy, strict=True)
    ):
        # Marginal cells no active cell maps to only add a constant: they are dropped.
        used, local = np.unique(cell_to_marginal[cols], return_inverse=True)
        weight = np.asarray(problem.weights)[q] if by_child is None else by_child[:, q]
        safe_lipschitz += 2.0 * float(np.max(weight)) * float(np.bincount(local).max())
        blocks.append(sparse.csr_matrix((np.ones(n), (np.arange(n), local)), shape=(n, used.size)))
        noisy.append(answers[np.ix_(rows, used)].T)
        weights.append(np.tile(np.atleast_1d(weight).astype(float), (used.size, 1)))
        query_of.append(np.full(used.size, q))
    stacked = sparse.hstack(blocks, format="csr")
    return _Model(
        stacked=stacked,
        stacked_t=stacked.T.tocsr(),
        noisy=np.ascontiguousarray(np.vstack(noisy)),
        weight=np.ascontiguousarray(np.vstack(weights)),
        safe_lipschitz=safe_lipschitz,
        query_of=np.concatenate(query_of),
    )


def solve_children_first_order(problem: ChildrenProblem) -> np.ndarray:
    """The children's histograms minimising the weighted squared error, to ``RELATIVE_GAP``.

    Same contract as ``least_squares.solve_children`` except that optimality holds to the
    tolerance described in the module docstring rather than to round-off.
    """
    x, block = free_block(problem)
    if block is None:
        return x
    model = _build_model(problem, block.rows, block.cols)
    _check_masked_feasible(block)
    feasible = _FeasibleSet(
        cell_sums=None if block.parent is None else block.parent[block.cols],
        child_sums=None if block.totals is None else block.totals[block.rows],
        allowed=None if block.allowed is None else block.allowed.T,
    )
    z = _fista(model, feasible)
    x[np.ix_(block.rows, block.cols)] = z.T
    return x


def _check_masked_feasible(block: FreeBlock) -> None:
    """Raise ``ValueError`` when a mask leaves no point meeting both the parent and the totals
    (the projection would not notice: it would return a point missing the totals)."""
    if block.allowed is not None and block.parent is not None and block.totals is not None:
        masked_feasible_point(block.allowed, block.parent[block.cols], block.totals[block.rows])


class _FeasibleSet:
    """The feasible set in the ``(n, k)`` layout, with its Euclidean projection.

    ``cell_sums``: the parent (sum over children, per cell), ``child_sums``: the child totals
    (sum over cells, per child), ``allowed``: ``(n, k)``, False where the entry is fixed at 0
    (or None). For the transportation case the dual thresholds of the last projection are kept
    to warm-start the next.
    """

    def __init__(
        self,
        cell_sums: np.ndarray | None,
        child_sums: np.ndarray | None,
        allowed: np.ndarray | None = None,
    ) -> None:
        self.cell_sums = cell_sums
        self.child_sums = child_sums
        self.allowed = allowed
        self.cell_shift: np.ndarray | None = None
        self.child_shift: np.ndarray | None = None
        largest = max([1.0] + [float(s.max()) for s in (cell_sums, child_sums) if s is not None])
        self.sum_tolerance = max(1e-12, _SUM_TOLERANCE * largest)

    @property
    def bounded(self) -> bool:
        return self.cell_sums is not None or self.child_sums is not None

    def only_allowed(self, v: np.ndarray, forbidden: float) -> np.ndarray:
        """``v`` with its forbidden entries set to ``forbidden``."""
        return v if self.allowed is None else np.where(self.allowed, v, forbidden)

    def project(self, v: np.ndarray, tolerance: float | None = None) -> np.ndarray:
        v = self.only_allowed(v, -np.inf)
        if self.cell_sums is None and self.child_sums is None:
            return np.maximum(v, 0.0)
        if self.child_sums is None:
            return np.maximum(v - _thresholds(v, _need(self.cell_sums))[:, None], 0.0)
        if self.cell_sums is None:
            return np.maximum(v - _thresholds(v.T, self.child_sums)[None, :], 0.0)
        return self._project_transportation(
            v, self.cell_sums, self.child_sums, tolerance or self.sum_tolerance
        )

    def _project_transportation(
        self, v: np.ndarray, cell_sums: np.ndarray, child_sums: np.ndarray, tolerance: float
    ) -> np.ndarray:
        """Dykstra's algorithm in dual form: ``z = max(v - a_j - b_c, 0)``."""
        child_shift = np.zeros(v.shape[1]) if self.child_shift is None else self.child_shift.copy()
        cell_shift = np.zeros(v.shape[0])
        z = v
        worst = np.inf
        for sweep in range(_MAX_DUAL_SWEEPS):
            cell_shift = _thresholds(v - child_shift[None, :], cell_sums)
            shifted = v - cell_shift[:, None]
            z = np.maximum(shifted - child_shift[None, :], 0.0)
            error = float(np.max(np.abs(z.sum(axis=0) - child_sums)))
            if error <= tolerance:
                break
            # Round-off can stop progress short of a tiny tolerance: give up when 50 sweeps
            # have not halved the error.
            if sweep % 50 == 0:
                if error > 0.5 * worst:
                    break
                worst = error
            child_shift = _thresholds(shifted.T, child_sums)
        self.cell_shift, self.child_shift = cell_shift, child_shift
        return z

    def lower_bound(self, gradient: np.ndarray, step: float) -> float:
        """A lower bound on ``min <gradient, s>`` over the feasible set (needs it bounded).

        Any child multipliers ``beta`` give one by LP duality:
        ``sum_c t_c beta_c + sum_j p_j min_c (g_{j,c} - beta_c)``; the last projection's child
        thresholds, scaled by ``-1 / step``, are the right ones at the optimum.
        """
        if self.cell_sums is None:
            return float(_need(self.child_sums)[0] * gradient.min())
        if self.child_sums is None:
            return float(self.cell_sums @ gradient.min(axis=1))
        beta = np.zeros(gradient.shape[1])
        if self.child_shift is not None:
            beta = -self.child_shift / step
        return float(self.child_sums @ beta + self.cell_sums @ (gradient - beta).min(axis=1))


def _need(values: np.ndarray | None) -> np.ndarray:
    if values is None:
        raise AssertionError("a constraint needed here is missing")
    return values


def _thresholds(v: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Per row ``i``, ``theta_i`` with ``sum_j max(v_ij - theta_i, 0) = sums_i`` (sums > 0).

    The sort-based simplex projection (Held, Wolfe & Crowder 1974), vectorised over rows.
    """
    ordered = -np.sort(-v, axis=1)
    excess = np.cumsum(ordered, axis=1) - sums[:, None]
    count = np.arange(1, v.shape[1] + 1)
    support = np.count_nonzero(ordered * count > excess, axis=1)
    return excess[np.arange(v.shape[0]), support - 1] / support


def _starting_point(model: _Model, feasible: _FeasibleSet) -> np.ndarray:
    """Every query's answers spread evenly over its marginal cells, averaged by weight, then
    projected."""
    sizes = np.asarray(model.stacked.sum(axis=0)).ravel()[:, None]
    spread = model.stacked @ (model.weight * model.noisy / sizes)
    per_cell = model.stacked @ model.weight
    return feasible.project(spread / per_cell)


def _fista(model: _Model, feasible: _FeasibleSet) -> np.ndarray:
    lipschitz = model.lipschitz()
    step = 1.0 / lipschitz
    x = _starting_point(model, feasible)
    y = x
    momentum = 1.0
    best, best_value = x, np.inf
    value = gap = np.inf
    for iteration in range(1, MAX_ITERATIONS + 1):
        x_next = feasible.project(y - step * model.gradient(y))
        # Restart when the step turns back against the momentum. (Inner products here are
        # np.sum of products, not BLAS dot: threaded BLAS on a busy executor is much slower.)
        if np.sum((y - x_next) * (x_next - x)) > 0.0:
            momentum_next = 1.0
            y = x_next
        else:
            momentum_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * momentum**2))
            y = x_next + ((momentum - 1.0) / momentum_next) * (x_next - x)
        x, momentum = x_next, momentum_next
        if iteration % _CHECK_EVERY:
            continue
        value, gradient = model.objective_and_gradient(x)
        if value < best_value:
            best, best_value = x, value
        gap = _gap(model, x, value, gradient, feasible, step)
        if gap <= RELATIVE_GAP * max(value, 1e-300):
            return _polished(x, feasible)
    warnings.warn(
        f"first-order least squares stopped after {MAX_ITERATIONS} iterations; the last "
        f"certified gap was {gap / max(value, 1e-300):.1e} relative",
        RuntimeWarning,
        stacklevel=3,
    )
    return _polished(best, feasible)


def _gap(
    model: _Model,
    x: np.ndarray,
    value: float,
    gradient: np.ndarray,
    feasible: _FeasibleSet,
    step: float,
) -> float:
    """An upper bound on ``f(x) - f*``: ``<g, x> - min <g, s>`` over the feasible ``s``, or at
    the root without a total (``x >= 0`` only) over those ``s`` that could beat ``x``; the
    minimum is over the allowed entries (``g`` is ``+inf`` on the others)."""
    allowed_gradient = feasible.only_allowed(gradient, np.inf)
    if feasible.bounded:
        lower = feasible.lower_bound(allowed_gradient, step)
    else:
        most_negative = np.minimum(allowed_gradient.min(axis=0), 0.0)
        lower = float(model.total_bound(value) @ most_negative)
    return float(np.sum(gradient * x)) - lower


def _polished(z: np.ndarray, feasible: _FeasibleSet) -> np.ndarray:
    """``z`` non-negative and meeting the sums: tight re-projection in the transportation case."""
    if feasible.cell_sums is not None and feasible.child_sums is not None:
        # z is feasible to the working tolerance, so its own projection's dual is near zero:
        # the last step's thresholds would be a worse start.
        feasible.child_shift = None
        z = feasible.project(z, tolerance=_FINAL_SUM_TOLERANCE)
    return np.maximum(z, 0.0)
