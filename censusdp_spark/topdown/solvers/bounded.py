"""The least-squares stages under group bounds: the fallback when the fast solution misses one.

``least_squares.solve_children`` and ``solve_to_targets`` solve without the bounds of
``GroupBounds`` (each child's sum over a group of cells between two integers) and keep their
solution when it meets them, which it usually does: the bounds are the 2020 production's
group-quarters facts (a type with a facility holds at least one person a facility, at most
99,999), which the noisy measurements mostly respect already. Otherwise the same convex QP
with the bounds as inequality rows,

    minimise   sum_c 0.5 x_c^T H_c x_c - g_c^T x_c
    subject to the problem's equalities (columns to the parent, rows to the child totals),
               x >= 0 and 0 on the forbidden entries,
               lower[c, g] <= sum_{j in g} x_{c,j} <= upper[c, g],

is solved in two ways, the first that succeeds:

* ``solve_by_multipliers``: Newton's method on the multipliers of the bounds that bind, each
  step a few solves of the unbounded problem with shifted linear terms by the fast exact
  method; its answer is a KKT point to round-off. Cheap when few bounds bind (a 20-child,
  252-cell family with 3 bounded children: about 1 s, against 12 s below;
  ``benchmarks/bench_group_bounds.py``). Not for families on the first-order path, whose
  exact solves are what that path avoids.
* ``solve_bounded``: Clarabel, a primal-dual interior-point method, on the entries that may
  be positive. The data are scaled so the largest Hessian entry is 1 and the largest sum 1;
  the solution is accepted only when Clarabel reports it solved and it meets every constraint
  to ``FEASIBILITY_TOLERANCE`` relative to the sums, then clipped at 0 (entries within that
  tolerance below it). Its cost grows with the family's size, not with the binding bounds.

The rounder holds the integral bounds exactly afterwards (``rounding``), so no tolerance
reaches the release.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sparse

from censusdp_spark.topdown.solvers.subproblem import GroupBounds

DIRECT_SOLVE_METHOD = "faer"
FEASIBILITY_TOLERANCE = 1e-8
"""Relative to the largest sum: how far the fallback's solution may miss a constraint."""


def meets_bounds(bounds: GroupBounds | None, x: np.ndarray) -> bool:
    """Whether ``x`` meets ``bounds`` (None: no bounds) to ``FEASIBILITY_TOLERANCE``."""
    if bounds is None:
        return True
    return bounds.violation(x) <= FEASIBILITY_TOLERANCE * max(1.0, float(x.sum()))


ROUND_OFF = 1e-11
"""Relative to the total: how far the multipliers' answer may miss a bound (round-off: on the
right face one Newton step is exact)."""
MAX_MULTIPLIER_SOLVES = 30
"""Unbounded solves the multipliers' Newton method may spend (one per active bound and one
more per step) before the interior-point method takes over; it does not start a step unless
one more would fit too. Many binding bounds are the interior-point method's case."""


def solve_by_multipliers(
    solve: Callable[[np.ndarray], np.ndarray], x: np.ndarray, bounds: GroupBounds
) -> np.ndarray | None:
    """The bounded minimiser from the unbounded solver alone, or None if this does not find it.

    A bound ``lower <= sum_{j in g} x_{c,j} <= upper`` that holds with multiplier ``m_{c,g}``
    (``> 0`` at the lower bound, ``< 0`` at the cap) adds ``m_{c,g}`` to child ``c``'s linear
    term on the cells of ``g``; with every multiplier known, the unbounded problem with those
    linear terms has the bounded problem's solution. ``solve(shift)`` solves it for the
    ``(k, n)`` ``shift`` of the linear terms, starting from its solution ``x`` at no shift.
    That solution is piecewise affine in the multipliers, so Newton's method on the active
    bounds' multipliers (the Jacobian from one solve per active bound) finds them exactly once
    the face is right. The answer is returned only when it is a KKT point of the bounded
    problem: every bound met to ``ROUND_OFF``, every multiplier of the right sign and only on a
    bound that holds with equality. Cheap when few bounds bind, the usual case; None when it
    would take more than ``MAX_MULTIPLIER_SOLVES`` solves or the fast method fails on a shifted
    problem (the caller then solves by ``solve_bounded``)."""
    members = bounds.members.astype(float)
    multipliers = np.zeros(bounds.lower.shape)
    tolerance = ROUND_OFF * max(1.0, float(x.sum()))
    solves = 0
    while True:
        sums = bounds.sums(x)
        at_lower = (multipliers > 0) | (sums < bounds.lower - tolerance)
        at_upper = (multipliers < 0) | (sums > bounds.upper + tolerance)
        active = tuple(np.argwhere(at_lower | at_upper).T)
        residual = sums[active] - np.where(at_lower, bounds.lower, bounds.upper)[active]
        if np.max(np.abs(residual), initial=0.0) <= tolerance:
            return x  # the multipliers' signs are kept right below
        if solves + 2 * (residual.size + 1) > MAX_MULTIPLIER_SOLVES:
            return None  # not even this step and one more would fit
        solves += residual.size + 1
        step = max(1.0, float(np.max(np.abs(multipliers), initial=0.0)))
        jacobian = np.empty((residual.size, residual.size))
        for a, (c, g) in enumerate(zip(*active, strict=True)):
            probe = multipliers.copy()
            probe[c, g] += step
            moved = _guarded(solve, probe @ members)
            if moved is None:
                return None
            jacobian[:, a] = (bounds.sums(moved)[active] - sums[active]) / step
        multipliers[active] += np.linalg.lstsq(jacobian, -residual, rcond=None)[0]
        wrong = (at_lower & (multipliers < 0)) | (at_upper & (multipliers > 0))
        multipliers[wrong] = 0.0  # a bound pulling the wrong way is released
        found = _guarded(solve, multipliers @ members)
        if found is None:
            return None
        x = found


def _guarded(solve: Callable[[np.ndarray], np.ndarray], shift: np.ndarray) -> np.ndarray | None:
    """``solve(shift)``, or None where the fast method cannot settle the shifted problem."""
    try:
        return solve(shift)
    except (RuntimeError, np.linalg.LinAlgError):
        return None


def solve_bounded(
    hessian: np.ndarray,
    linear: np.ndarray,
    may_hold: np.ndarray,
    sums: tuple[np.ndarray | None, np.ndarray | None],
    bounds: GroupBounds | None,
) -> np.ndarray:
    """The ``(k, n)`` minimiser of ``sum_c 0.5 x_c^T H_c x_c - g_c^T x_c`` under the sums,
    ``x >= 0``, ``x = 0`` where ``may_hold`` is False and the group ``bounds`` (None: none;
    the exact active-set method then starts from this answer when it cannot settle a problem
    alone).

    ``hessian``: ``(n, n)`` shared or ``(k, n, n)``; ``linear``: ``(k, n)``; ``sums``: the
    column sums (the parent, length ``n``) and row sums (length ``k``), each None when free.
    Raises ``ValueError`` when Clarabel finds the constraints infeasible or its answer misses
    one by more than the tolerance."""
    import clarabel  # a generic conic solver, for the bounded fallback and PGSR's baseline

    k, n = linear.shape
    child, cell = np.nonzero(may_hold)
    size = child.size
    x = np.zeros((k, n))
    if size == 0:
        return x
    hessians = np.broadcast_to(hessian, (k, n, n))
    h_scale = float(np.max(np.abs(np.diagonal(hessians, axis1=-2, axis2=-1))))
    columns, rows = sums
    s_scale = max(
        1.0,
        *(float(np.max(v)) for v in (columns, rows) if v is not None and v.size),
        float(np.max(bounds.lower, initial=0.0)) if bounds is not None else 0.0,
    )
    quadratic = _block_diagonal(hessians, child, cell) / h_scale
    equality_rows, equality_rhs = _equalities(child, cell, columns, rows)
    bound_rows, bound_rhs = (
        _bound_rows(child, cell, bounds)
        if bounds is not None
        else (sparse.csr_matrix((0, size)), np.zeros(0))
    )
    matrix = sparse.vstack(
        [equality_rows, -sparse.identity(size, format="csr"), bound_rows], format="csc"
    )
    rhs = np.concatenate([equality_rhs, np.zeros(size), bound_rhs]) / s_scale
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = 1e-12
    settings.tol_feas = 1e-12
    settings.max_iter = 400
    settings.direct_solve_method = DIRECT_SOLVE_METHOD
    cones = [
        clarabel.ZeroConeT(equality_rows.shape[0]),
        clarabel.NonnegativeConeT(size + bound_rows.shape[0]),
    ]
    solution = clarabel.DefaultSolver(
        sparse.triu(quadratic, format="csc"),
        -linear[child, cell] / (h_scale * s_scale),
        matrix,
        rhs,
        cones,
        settings,
    ).solve()
    status = str(solution.status)
    values = np.asarray(solution.x, dtype=np.float64) * s_scale
    if status not in ("Solved", "AlmostSolved") or not np.all(np.isfinite(values)):
        raise ValueError(f"group_bounds: the bounded least squares found no solution ({status})")
    tolerance = FEASIBILITY_TOLERANCE * s_scale
    residual = np.concatenate(
        [equality_rows @ values - equality_rhs, bound_rows @ values - bound_rhs]
    )
    if (
        np.min(values, initial=0.0) < -tolerance
        or np.max(np.abs(residual[: equality_rows.shape[0]]), initial=0.0) > tolerance
        or np.max(residual[equality_rows.shape[0] :], initial=0.0) > tolerance
    ):
        raise ValueError("group_bounds: the bounded least squares missed a constraint")
    x[child, cell] = np.maximum(values, 0.0)
    return x


def _block_diagonal(hessians: np.ndarray, child: np.ndarray, cell: np.ndarray) -> sparse.csc_matrix:
    """The Hessian over the variables (entries ``(child, cell)``, grouped by child)."""
    blocks = []
    for c in range(hessians.shape[0]):
        own = cell[child == c]
        blocks.append(sparse.csr_matrix(hessians[c][np.ix_(own, own)]))
    return sparse.block_diag(blocks, format="csc")


def _equalities(
    child: np.ndarray, cell: np.ndarray, columns: np.ndarray | None, rows: np.ndarray | None
) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Rows ``sum_c x_{c,j} = columns[j]`` and ``sum_j x_{c,j} = rows[c]`` over the variables."""
    size = child.size
    blocks: list[sparse.csr_matrix] = []
    rhs: list[np.ndarray] = []
    for index, values in ((cell, columns), (child, rows)):
        if values is None:
            continue
        blocks.append(
            sparse.csr_matrix((np.ones(size), (index, np.arange(size))), shape=(values.size, size))
        )
        rhs.append(np.asarray(values, dtype=float))
    if not blocks:
        return sparse.csr_matrix((0, size)), np.zeros(0)
    return sparse.vstack(blocks, format="csr"), np.concatenate(rhs)


def _bound_rows(
    child: np.ndarray, cell: np.ndarray, bounds: GroupBounds
) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Rows ``A x <= b`` for the finite bounds: ``-sum <= -lower`` and ``sum <= upper``."""
    size = child.size
    k, n_groups = bounds.lower.shape
    grouped, key = bounds.entry_keys(child, cell)
    summing = sparse.csr_matrix((np.ones(key.size), (key, grouped)), shape=(k * n_groups, size))
    lower, upper = bounds.lower.ravel(), bounds.upper.ravel()
    low, high = np.flatnonzero(lower > 0), np.flatnonzero(np.isfinite(upper))
    return (
        sparse.vstack([-summing[low], summing[high]], format="csr"),
        np.concatenate([-lower[low], upper[high]]),
    )
