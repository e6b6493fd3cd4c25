"""Post-processing of the cumulative group-size release (M_c, the paper's Model 2).

Pure numpy/scipy; nothing here knows about Spark.

Privacy claim
-------------
Reads only the noisy cumulative counts ``H~^r_j`` (ε-DP by the geometric mechanism of the
measurement pass) and public invariants (the hierarchy and every node's number of groups
``G^r = H^r_N``, which is not noised). By post-processing immunity the output is ε-DP.

What is solved
--------------
Top-down, family by family, as TopDown does. For the root (no parent) and then for the
children ``c`` of every node whose cumulative histogram ``P`` is already released, integers

    minimise   sum_c sum_{j<N} (H^c_j - H~^c_j)^2
    subject to 0 <= H^c_1 <= H^c_2 <= ... <= H^c_{N-1} <= G^c     (monotone, valid, faithful)
               sum_c H^c_j = P_j for every j < N                     (consistent; no parent: none)

and the released histogram is the difference ``x^c_j = H^c_j - H^c_{j-1}`` (``H_0 = 0``,
``H_N = G^c``), non-negative because H is monotone.

**Exactness.** Each family's integer program is solved exactly. Its constraint matrix is totally
unimodular: take any subset of its variables; in each child's chain the chosen variables form
runs of consecutive sizes; runs are intervals of sizes, and the size-by-interval incidence matrix
is an interval matrix, hence TU, so (Ghouila-Houri) the runs can be signed +/-1 so that every
size is covered by a balanced number of runs; signing every variable like its run gives a
difference of column groups with entries in {-1, 0, 1} in every sum row (balanced) and every
monotonicity row (0 inside a run, +/-1 at its ends). For a separable convex objective over a TU
system, the program linearised exactly at the integers (one unit segment per integer) has an
integral optimal vertex equal to the integer optimum. ``solve_cumulative_family`` solves that
linearisation on a window around a centre with HiGHS, and widens and re-centres the window until
no window bound is active at the optimum; then the window is not binding, and by convexity the
window's optimum is the global one. The top-down sequence as a whole is *not* the global
optimum of Model 2 over the tree (a parent is fixed before its children are seen), exactly as
in TopDown; every family step is.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from censusdp_spark.solvers.group_sizes import GroupTree

_FIRST_WINDOW = 4


def to_cumulative(counts: np.ndarray) -> np.ndarray:
    """``H_j = sum_{i<=j} x_i`` for ``j < N`` (the last, ``G``, is public and left out)."""
    return np.cumsum(counts, axis=-1)[..., :-1]


def from_cumulative(cumulative: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Inverse of ``to_cumulative`` given each row's number of groups."""
    full = np.concatenate([cumulative, np.asarray(groups)[..., None]], axis=-1)
    return np.diff(full, axis=-1, prepend=0)


def _window_solve(
    noisy: np.ndarray, lo: np.ndarray, hi: np.ndarray, parent: np.ndarray | None
) -> np.ndarray | None:
    """The exact optimum with every ``H`` restricted to ``lo..hi`` (None if infeasible)."""
    k, m = noisy.shape
    widths = (hi - lo).ravel()
    owner = np.repeat(np.arange(k * m), widths)
    unit = np.arange(owner.size) - np.repeat(np.cumsum(widths) - widths, widths)
    cost = 2.0 * (lo.ravel()[owner] + unit - noisy.ravel()[owner]) + 1.0
    cell_of = sparse.csr_matrix(
        (np.ones(owner.size), (owner, np.arange(owner.size))), shape=(k * m, owner.size)
    )
    rows, low, high = [], [], []
    if m > 1:  # H[c, j] - H[c, j+1] <= 0 in segment sums: lo[c, j] - lo[c, j+1] + (...) <= 0
        first = np.arange(k * m).reshape(k, m)[:, :-1].ravel()
        rows.append(cell_of[first] - cell_of[first + 1])
        low.append(np.full(first.size, -np.inf))
        high.append((lo.ravel()[first + 1] - lo.ravel()[first]).astype(np.float64))
    if parent is not None:
        columns = sparse.csr_matrix(
            (np.ones(k * m), (np.tile(np.arange(m), k), np.arange(k * m))), shape=(m, k * m)
        )
        rows.append(columns @ cell_of)
        target = (np.asarray(parent) - lo.sum(axis=0)).astype(np.float64)
        low.append(target)
        high.append(target)
    if owner.size == 0:
        feasible = all(
            (lw <= 0).all() and (hg >= 0).all() for lw, hg in zip(low, high, strict=True)
        )
        return lo.copy() if feasible else None
    matrix = sparse.vstack(rows, format="csr") if rows else sparse.csr_matrix((0, owner.size))
    bounds_low = np.concatenate(low) if rows else np.zeros(0)
    bounds_high = np.concatenate(high) if rows else np.zeros(0)
    upper = matrix[np.isinf(bounds_low)]
    equal = matrix[~np.isinf(bounds_low)]
    # Dual simplex returns a vertex, which is integral because the matrix is TU.
    result = linprog(
        cost,
        A_ub=upper if upper.shape[0] else None,
        b_ub=bounds_high[np.isinf(bounds_low)] if upper.shape[0] else None,
        A_eq=equal if equal.shape[0] else None,
        b_eq=bounds_low[~np.isinf(bounds_low)] if equal.shape[0] else None,
        bounds=(0, 1),
        method="highs-ds",
    )
    if result.status == 2:  # infeasible window
        return None
    if result.x is None:
        raise RuntimeError(f"cumulative family: HiGHS stopped: {result.message}")
    units = np.rint(result.x)
    if np.abs(result.x - units).max() > 1e-6:
        raise RuntimeError("cumulative family: a simplex vertex is not integral (matrix not TU?)")
    filled = np.zeros(k * m)
    np.add.at(filled, owner, units)
    return lo + filled.reshape(k, m).astype(np.int64)


def solve_cumulative_family(
    noisy: np.ndarray, groups: np.ndarray, parent: np.ndarray | None
) -> np.ndarray:
    """Released cumulative counts (k x N-1) of one family (or of the root, ``parent=None``)."""
    noisy = np.asarray(noisy, dtype=np.int64)
    cap = np.broadcast_to(np.asarray(groups, dtype=np.int64)[:, None], noisy.shape)
    # Centre on each child's own optimum (no parent): near the answer, and never infeasible.
    centre = (
        np.clip(noisy, 0, cap) if parent is None else solve_cumulative_family(noisy, groups, None)
    )
    width = _FIRST_WINDOW
    while True:
        lo = np.maximum(centre - width, 0)
        hi = np.minimum(centre + width, cap)
        whole_domain = bool((lo == 0).all() and (hi == cap).all())
        unreachable = parent is not None and (
            (lo.sum(axis=0) > parent).any() or (hi.sum(axis=0) < parent).any()
        )
        if unreachable and not whole_domain:
            width *= 2  # the window cannot reach the parent's sums: widen before solving
            continue
        found = _window_solve(noisy, lo, hi, parent)
        if found is None:
            if whole_domain:
                raise ValueError("no monotone cumulative counts meet the parent and the groups")
        else:
            binding = ((found == lo) & (lo > 0)) | ((found == hi) & (hi < cap))
            if not binding.any():
                return found
            centre = found
        width *= 2


def cumulative_release(tree: GroupTree) -> np.ndarray:
    """M_c post-processing of a whole tree; ``tree.noisy`` holds the noisy ``H~`` (n x N-1).

    Returns the released histograms (n x N).
    """
    kids = tree.children()
    cumulative = np.zeros_like(tree.noisy)
    cumulative[0] = solve_cumulative_family(tree.noisy[:1], tree.groups[:1], None)[0]
    for r in range(len(kids)):
        if kids[r].size:
            cumulative[kids[r]] = solve_cumulative_family(
                tree.noisy[kids[r]], tree.groups[kids[r]], cumulative[r]
            )
    return from_cumulative(cumulative, tree.groups)
