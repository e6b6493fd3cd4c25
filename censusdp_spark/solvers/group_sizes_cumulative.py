"""Post-processing of the cumulative group-size release (M_c, the paper's Model 2).

Pure numpy/scipy; nothing here knows about Spark.

Privacy claim
-------------
Reads only the noisy cumulative counts ``H~^r_j`` (ε-DP by the geometric mechanism of the
measurement pass) and public invariants: the hierarchy, the total G and, under node
faithfulness only, every node's number of groups ``G^r = H^r_N`` (then not noised). By
post-processing immunity the output is ε-DP.

What is solved
--------------
Top-down, family by family, as TopDown does. The root: ``H^root_N = G`` (public) and

    minimise   sum_{j<N} (H_j - H~_j)^2   s.t.  0 <= H_1 <= ... <= H_{N-1} <= G.

Then the children ``c`` of every node whose cumulative histogram ``P`` is already released:

    minimise   sum_c sum_j (H^c_j - H~^c_j)^2
    subject to 0 <= H^c_1 <= H^c_2 <= ... <= H^c_J <= cap^c          (monotone, valid)
               sum_c H^c_j = P_j for every j <= J                       (consistent)

with, under level faithfulness (the paper's Model 2: only the root is pinned to G), ``J = N``
(``H^c_N``, the child's number of groups, is a noisy measured variable) and ``cap^c = G``;
under node faithfulness ``J = N - 1`` and ``cap^c = G^c = H^c_N``. The released histogram is
the difference ``x^c_j = H^c_j - H^c_{j-1}`` (``H_0 = 0``), non-negative because H is
monotone; every level then sums to G (consistency from the root down).

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
    noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray | None
) -> np.ndarray:
    """Released cumulative counts (k x J) of one family (or of the root, ``parent=None``):
    monotone chains in ``0..caps[c]`` summing to ``parent`` column by column."""
    noisy = np.asarray(noisy, dtype=np.int64)
    cap = np.broadcast_to(np.asarray(caps, dtype=np.int64)[:, None], noisy.shape)
    # Centre on each child's own optimum (no parent): near the answer, and never infeasible.
    centre = (
        np.clip(noisy, 0, cap) if parent is None else solve_cumulative_family(noisy, caps, None)
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


def cumulative_root(noisy: np.ndarray, total: int, faithfulness: str) -> np.ndarray:
    """The root's histogram (N) from its noisy ``H~_1..H~_{N-1}`` (under level faithfulness
    also ``H~_N``, ignored: G is public) given the public total G."""
    head = np.asarray(noisy, dtype=np.int64)
    head = head[:-1] if faithfulness == "level" else head
    g = np.array([total], dtype=np.int64)
    return from_cumulative(solve_cumulative_family(head[None, :], g, None), g)[0]


def cumulative_family(
    noisy: np.ndarray, parent: np.ndarray, faithfulness: str, caps: np.ndarray
) -> np.ndarray:
    """Children's histograms (k x N) below a parent's released histogram ``parent``.

    ``noisy`` is ``H~_1..H~_N`` per child (level) or ``H~_1..H~_{N-1}`` (node); ``caps`` is G
    for every child (level) or each child's ``G^c`` (node).
    """
    cumulative = np.cumsum(parent)
    if faithfulness == "level":
        found = solve_cumulative_family(noisy, caps, cumulative)
        return from_cumulative(found[:, :-1], found[:, -1])
    found = solve_cumulative_family(noisy, caps, cumulative[:-1])
    return from_cumulative(found, caps)


def cumulative_release(tree: GroupTree, faithfulness: str = "level") -> np.ndarray:
    """M_c post-processing of a whole tree; ``tree.noisy`` holds the noisy cumulative counts
    (n x N under level faithfulness, n x N-1 under node). Returns the histograms (n x N)."""
    kids = tree.children()
    total = int(tree.groups[0])
    m = tree.noisy.shape[1] + (0 if faithfulness == "level" else 1)
    counts = np.zeros((tree.parent.size, m), dtype=np.int64)
    counts[0] = cumulative_root(tree.noisy[0], total, faithfulness)
    for r in range(len(kids)):
        if kids[r].size:
            caps = np.full(kids[r].size, total) if faithfulness == "level" else tree.groups[kids[r]]
            counts[kids[r]] = cumulative_family(tree.noisy[kids[r]], counts[r], faithfulness, caps)
    return counts
