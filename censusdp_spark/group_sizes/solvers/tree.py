"""The group-size post-processing of a whole tree in one process:
the exact dp driver over the cost tables and batch kernels, objective and violations.

``dp_release`` is the in-process driver of the dynamic program whose Spark driver is
``group_sizes.exact``: the same tables and splits, whole-tree windows centred at a
least-squares estimate. It serves the solver tests, the benchmarks and the e2e cross-check;
``group_sizes.exact`` says why the two drivers are not merged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from censusdp_spark.group_sizes.config import FAITHFULNESS
from censusdp_spark.group_sizes.solvers.cost_tables import (
    WINDOW_WIDENING,
    CostTable,
    WindowTooNarrow,
    cell_bounds,
    merge_family,
    node_tables,
    solve_family,
    solve_root,
    split_family,
    window_bound,
)


@dataclass(frozen=True)
class GroupTree:
    """A hierarchy with one row per node, parents before children (node 0 is the root).

    ``noisy`` holds the noisy histograms (n x N); ``groups`` every node's number of groups
    (under level faithfulness only the root's, G, is read).
    """

    parent: np.ndarray
    noisy: np.ndarray
    groups: np.ndarray

    def __post_init__(self) -> None:
        n = self.parent.size
        if self.parent[0] != -1 or (n > 1 and not (self.parent[1:] < np.arange(1, n)).all()):
            raise ValueError("node 0 must be the root and every parent must precede its children")
        if n > 1 and (self.parent[1:] < 0).any():
            raise ValueError("only node 0 may be a root")
        sums = np.zeros(n, dtype=np.int64)
        np.add.at(sums, self.parent[1:], self.groups[1:])
        internal = np.bincount(self.parent[1:], minlength=n) > 0
        if (sums[internal] != self.groups[internal]).any():
            raise ValueError("every internal node's groups must equal the sum of its children's")

    @property
    def sizes(self) -> int:
        return int(self.noisy.shape[1])

    def depth(self) -> np.ndarray:
        depth = np.zeros(self.parent.size, dtype=np.int64)
        for r in range(1, self.parent.size):
            depth[r] = depth[self.parent[r]] + 1
        return depth

    def children(self) -> list[np.ndarray]:
        order = np.argsort(self.parent[1:], kind="stable") + 1
        bounds = np.searchsorted(self.parent[order], np.arange(self.parent.size + 1))
        return [order[bounds[r] : bounds[r + 1]] for r in range(self.parent.size)]


@dataclass(frozen=True)
class DpRelease:
    counts: np.ndarray  # (n, N) integers
    objective: int  # sum of f(x - noisy) over the tree
    lower_bound: int  # the root tables' optimum: = objective under level faithfulness
    width: int | None  # the l2 window that certified the optimum (None: no windows)


def objective(tree: GroupTree, counts: np.ndarray, norm: str) -> int:
    diff = counts.astype(np.int64) - tree.noisy
    return int(np.square(diff).sum() if norm == "l2" else np.abs(diff).sum())


def check_faithfulness(faithfulness: str) -> None:
    if faithfulness not in FAITHFULNESS:
        raise ValueError(f"faithfulness must be one of {FAITHFULNESS}, not {faithfulness!r}")


def dp_release(
    tree: GroupTree, norm: str, faithfulness: str = "level", width: int = 4
) -> DpRelease:
    """M_H^dp post-processing of a whole tree in one process (the Spark engine splits it).

    Under level faithfulness with l2, the cells of internal nodes below the root get windows of
    half-width ``width`` around ``window_centres`` (a non-negative least-squares estimate); every cell whose
    optimum sits on its window bound gets a window ``WINDOW_WIDENING`` times wider, until the certificate
    holds (module docstring; it holds for any windows). The returned ``width`` is the widest.
    """
    check_faithfulness(faithfulness)
    if not (faithfulness == "level" and norm == "l2"):
        return _dp_listed(tree, norm, faithfulness)
    from censusdp_spark.group_sizes.solvers import batch

    total = int(tree.groups[0])
    problem = batch.TreeProblem.of(tree.noisy, tree.parent, total)
    centre = batch.window_centres(problem)
    widths = np.full(centre.shape, width, dtype=np.int64)
    while True:
        lo, hi = np.clip(centre - widths, 0, total), np.clip(centre + widths, 0, total)
        try:
            counts, lower = problem.solve(lo, hi)
        except WindowTooNarrow:
            widths *= WINDOW_WIDENING
            continue
        bound = window_bound(counts[:, problem.windowed], lo, hi, total)
        if not bound.any():
            counts = problem.levels.by_node(counts)
            widest = int(widths.max(initial=width))
            return DpRelease(counts, objective(tree, counts, norm), lower, widest)
        widths[bound] *= WINDOW_WIDENING


def _dp_listed(tree: GroupTree, norm: str, faithfulness: str) -> DpRelease:
    """l1, or node faithfulness: every table listed on ``0..upper``, no windows."""
    kids = tree.children()
    n, m = tree.noisy.shape
    total = int(tree.groups[0])
    level = faithfulness == "level"
    tables: list[list[CostTable]] = [[] for _ in kids]
    for r in reversed(range(n)):
        upper = total if level else int(tree.groups[r])
        lo, hi = cell_bounds(tree.noisy[r], upper, None)
        merged = merge_family([tables[c] for c in kids[r]]) if kids[r].size else None
        tables[r] = node_tables(tree.noisy[r], lo, hi, merged, norm)
    counts = np.zeros_like(tree.noisy)
    counts[0] = solve_root(tables[0], total)
    lower = sum(t.value(int(v)) for t, v in zip(tables[0], counts[0], strict=True))
    for r in range(n):
        family = [tables[c] for c in kids[r]]
        if not family:
            continue
        if level:
            counts[kids[r]] = split_family(family, counts[r])
        else:
            counts[kids[r]] = solve_family(family, counts[r], tree.groups[kids[r]])
    return DpRelease(counts, objective(tree, counts, norm), int(lower), None)


def violations(tree: GroupTree, counts: np.ndarray, faithfulness: str = "level") -> dict[str, int]:
    """Cells that are negative or not integers, (parent, size) pairs whose children do not sum
    to the parent, and faithfulness breaches: levels whose counts do not sum to G ("level") or
    nodes whose sizes do not sum to their number of groups ("node")."""
    check_faithfulness(faithfulness)
    whole = np.equal(np.mod(counts, 1), 0)
    sums = np.zeros(counts.shape, dtype=counts.dtype)
    np.add.at(sums, tree.parent[1:], counts[1:])
    internal = np.bincount(tree.parent[1:], minlength=tree.parent.size) > 0
    if faithfulness == "level":
        depth = tree.depth()
        per_level = np.bincount(depth, weights=counts.sum(axis=1).astype(np.float64))
        unfaithful = int((per_level != tree.groups[0]).sum())
    else:
        unfaithful = int((counts.sum(axis=1) != tree.groups).sum())
    return {
        "negative_or_fractional": int((~whole | (counts < 0)).sum()),
        "inconsistent": int((sums[internal] != counts[internal]).sum()),
        "unfaithful": unfaithful,
    }
