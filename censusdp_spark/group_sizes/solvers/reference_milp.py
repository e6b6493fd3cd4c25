"""An exact reference: the group-size problem as one
MILP (HiGHS), for tests and benchmarks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from censusdp_spark.group_sizes.config import NORMS
from censusdp_spark.group_sizes.solvers.tree import GroupTree, check_faithfulness, objective


@dataclass(frozen=True)
class MilpSolution:
    counts: np.ndarray
    objective: int
    seconds: float


class MilpRows:
    """A sparse constraint matrix assembled from blocks of (row, column, value) triples."""

    def __init__(self) -> None:
        self.count = 0
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.low: list[np.ndarray] = []
        self.high: list[np.ndarray] = []

    def add(
        self,
        n_rows: int,
        rows: np.ndarray,
        cols: np.ndarray,
        vals: np.ndarray,
        low: np.ndarray | float,
        high: np.ndarray | float,
    ) -> None:
        self.parts.append((rows + self.count, cols, vals))
        self.low.append(np.broadcast_to(np.asarray(low, dtype=np.float64), n_rows))
        self.high.append(np.broadcast_to(np.asarray(high, dtype=np.float64), n_rows))
        self.count += n_rows

    def add_consistency(
        self, tree: GroupTree, cell: np.ndarray, fixed_root: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Consistency: ``x[r, j] - sum_{c in ch(r)} x[c, j] = 0``, one row per internal node
        ``r`` (in node order) and size ``j``; ``cell[v, j]`` is the column of ``x[v, j]``. With
        ``fixed_root`` the root is no variable: its rows read ``-sum_c x[c, j] = -fixed[j]``.
        Returns the internal nodes and every node's row block (-1 for a leaf)."""
        n, m = cell.shape
        internal = np.flatnonzero(np.bincount(tree.parent[1:], minlength=n) > 0)
        row_of = np.full(n, -1)
        row_of[internal] = np.arange(internal.size)
        sizes = np.arange(m)
        kids = np.arange(1, n)
        owned = internal if fixed_root is None else internal[internal >= 1]  # +x[r, j]
        rhs = np.zeros((internal.size, m))
        if fixed_root is not None:
            rhs[row_of[0]] = -np.asarray(fixed_root, dtype=np.float64)
        self.add(
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
        return internal, row_of

    def constraint(self, size: int) -> LinearConstraint:
        rows, cols, vals = (np.concatenate(x) for x in zip(*self.parts, strict=True))
        matrix = sparse.csr_matrix((vals, (rows, cols)), shape=(self.count, size))
        return LinearConstraint(matrix, np.concatenate(self.low), np.concatenate(self.high))


def solve_exact_milp(
    tree: GroupTree, norm: str, faithfulness: str = "level", time_limit: float | None = None
) -> MilpSolution:
    """P_level or P_node solved exactly by HiGHS branch and bound (a reference, not a mechanism).

    l1 uses ``|x - c~| <= t``; l2 the exact piecewise-linear interpolation of the square at the
    integers of the cell's bounds ``0..G`` (level) or ``0..G^r`` (node): one unit segment per
    integer. ``seconds`` covers building the model and solving it.
    """
    check_faithfulness(faithfulness)
    started = time.perf_counter()
    n, m = tree.noisy.shape
    x_count = n * m
    cell = np.arange(x_count).reshape(n, m)
    rows = MilpRows()
    rows.add_consistency(tree, cell)
    faithful_nodes = np.arange(n) if faithfulness == "node" else np.array([0])
    rows.add(
        faithful_nodes.size,
        np.repeat(np.arange(faithful_nodes.size), m),
        cell[faithful_nodes].ravel(),
        np.ones(faithful_nodes.size * m),
        tree.groups[faithful_nodes],
        tree.groups[faithful_nodes],
    )
    bound = tree.groups if faithfulness == "node" else np.full(n, tree.groups[0])
    upper = np.repeat(bound, m).astype(np.float64)
    noisy = tree.noisy.ravel().astype(np.float64)
    index = np.arange(x_count)
    if norm == "l1":  # t_i - x_i >= -c~_i and t_i + x_i >= c~_i
        for sign in (-1.0, 1.0):
            rows.add(
                x_count,
                np.tile(index, 2),
                np.concatenate([x_count + index, index]),
                np.concatenate([np.ones(x_count), np.full(x_count, sign)]),
                sign * noisy,
                np.inf,
            )
        cost = np.concatenate([np.zeros(x_count), np.ones(x_count)])
        var_hi = np.concatenate([upper, np.full(x_count, np.inf)])
    elif norm == "l2":  # x_i - (sum of its unit segments) = 0
        segments = bound.repeat(m).astype(np.int64)
        owner = np.repeat(index, segments)
        unit = np.arange(owner.size) - np.repeat(np.cumsum(segments) - segments, segments)
        rows.add(
            x_count,
            np.concatenate([index, owner]),
            np.concatenate([index, x_count + np.arange(owner.size)]),
            np.concatenate([np.ones(x_count), -np.ones(owner.size)]),
            0.0,
            0.0,
        )
        cost = np.concatenate([np.zeros(x_count), 2.0 * (unit - noisy[owner]) + 1.0])
        var_hi = np.concatenate([upper, np.ones(owner.size)])
    else:
        raise ValueError(f"unknown norm {norm!r}; use one of {NORMS}")
    integrality = np.zeros(cost.size)
    integrality[:x_count] = 1
    result = milp(
        cost,
        constraints=rows.constraint(cost.size),
        integrality=integrality,
        bounds=Bounds(np.zeros(cost.size), var_hi),
        options={"time_limit": time_limit} if time_limit else {},
    )
    if result.x is None or result.status != 0:
        raise RuntimeError(f"milp: {result.message}")
    counts = np.rint(result.x[:x_count]).reshape(n, m).astype(np.int64)
    return MilpSolution(counts, objective(tree, counts, norm), time.perf_counter() - started)
