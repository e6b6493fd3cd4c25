"""The paper's relaxed baseline M_H: the whole-tree QP
(Clarabel), then rounding to the nearest integer.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from censusdp_spark.group_sizes.solvers.reference_milp import MilpRows
from censusdp_spark.group_sizes.solvers.tree import GroupTree, check_faithfulness


def relaxed_qp(
    tree: GroupTree, faithfulness: str = "level", fixed_root: np.ndarray | None = None
) -> np.ndarray:
    """The convex relaxation of the problem solved by Clarabel; floats (n x N).

    With ``fixed_root`` the root's histogram is given (a family below an already solved parent)
    and only its descendants are variables. Level faithfulness is the root's sum (nothing more
    with a fixed root); node faithfulness is imposed at the leaves (with consistency it implies
    every node's), and with a fixed root the root's last size is left out, since it follows from
    the others (avoiding a redundant, to round-off inconsistent, equality).
    """
    import clarabel  # a generic QP solver, needed by this baseline only

    check_faithfulness(faithfulness)
    n, m = tree.noisy.shape
    first = 0 if fixed_root is None else 1  # the first node that is a variable
    size = (n - first) * m
    cell = np.full((n, m), -1)
    cell[first:] = np.arange(size).reshape(n - first, m)
    rows = MilpRows()
    internal = np.flatnonzero(np.bincount(tree.parent[1:], minlength=n) > 0)
    row_of = np.full(n, -1)
    row_of[internal] = np.arange(internal.size)
    sizes = np.arange(m)
    kids = np.arange(1, n)
    owned = internal[internal >= first]  # parents that are variables: +x[r, j]
    rhs = np.zeros((internal.size, m))
    if fixed_root is not None:  # -sum_c x[c, j] = -fixed[j]
        rhs[row_of[0]] = -np.asarray(fixed_root, dtype=np.float64)
    rows.add(
        internal.size * m,
        np.concatenate(
            [
                (row_of[owned][:, None] * m + sizes).ravel(),
                (row_of[tree.parent[kids]][:, None] * m + sizes).ravel(),
            ]
        ),
        np.concatenate([cell[owned].ravel(), cell[kids].ravel()]),
        np.concatenate([np.ones(owned.size * m), -np.ones(kids.size * m)]),
        rhs.ravel(),
        rhs.ravel(),
    )
    if faithfulness == "node":
        leaves = np.setdiff1d(np.arange(first, n), internal)
        rows.add(
            leaves.size,
            np.repeat(np.arange(leaves.size), m),
            cell[leaves].ravel(),
            np.ones(leaves.size * m),
            tree.groups[leaves].astype(np.float64),
            tree.groups[leaves].astype(np.float64),
        )
    elif fixed_root is None:
        rows.add(
            1,
            np.zeros(m, dtype=np.int64),
            cell[0],
            np.ones(m),
            float(tree.groups[0]),
            float(tree.groups[0]),
        )
    constraint = rows.constraint(size)
    a_eq = sparse.csc_matrix(constraint.A)
    keep = np.ones(a_eq.shape[0], dtype=bool)
    if faithfulness == "node" and fixed_root is not None:
        keep[row_of[0] * m + m - 1] = False
    a_eq, b_eq = a_eq[keep], np.asarray(constraint.lb)[keep]
    a = sparse.vstack([a_eq, -sparse.identity(size)], format="csc")
    b = np.concatenate([b_eq, np.zeros(size)])
    p = sparse.identity(size, format="csc") * 2.0
    q = -2.0 * tree.noisy[first:].astype(np.float64).ravel()
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    cones = [clarabel.ZeroConeT(a_eq.shape[0]), clarabel.NonnegativeConeT(size)]
    solution = clarabel.DefaultSolver(p, q, a, b, cones, settings).solve()
    if str(solution.status) not in ("Solved", "AlmostSolved"):
        raise RuntimeError(f"relaxed QP: Clarabel stopped with status {solution.status}")
    out = np.zeros((n, m))
    if fixed_root is not None:
        out[0] = fixed_root
    out[first:] = np.maximum(np.asarray(solution.x).reshape(n - first, m), 0.0)
    return out


def round_naive(x: np.ndarray) -> np.ndarray:
    """Nearest integer (ties to even), cell by cell: the paper's rounding of the relaxation."""
    return np.rint(x).astype(np.int64)
