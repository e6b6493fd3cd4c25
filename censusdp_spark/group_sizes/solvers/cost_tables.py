"""Post-processing of the group-size release (PGSR): cost-table dynamic program, relaxed QP.

Pure numpy/scipy; nothing here knows about Spark. The Spark engine moves one family (a parent
and its children) at a time to these functions, bottom-up and then top-down.

Privacy claim
-------------
Every function here reads only the noisy histograms ``c~`` (ε-DP by the geometric mechanism
of the measurement pass) and public invariants: the hierarchy, the total number of groups
``G`` and, for node faithfulness only, every node's number of groups ``G^r``. By
post-processing immunity the outputs are ε-DP with the measurement's ε. No true count is read.

The problem (Fioretto, Van Hentenryck & Zhu, Model 1)
----------------------------------------------------
For every node ``r`` of a tree and size ``j = 1..N`` find integers ``x^r_j`` minimising
``sum_r sum_j f(x^r_j - c~^r_j)`` (``f`` = square "l2" or absolute value "l1") subject to

* consistency: ``x^r_j = sum_{c in ch(r)} x^c_j`` for every internal node and size;
* validity: ``x^r_j >= 0``, integer;
* faithfulness, one of two definitions (config ``faithfulness``):

  - ``"level"`` (the paper's condition 4): the counts of every level sum to
    the public ``G``. With consistency every level sums to the root's total, so this is
    ``sum_j x^root_j = G`` alone, and validity then bounds every cell by ``0 <= x^r_j <= G``;
    no per-node total is used or needed. Call this P_level.
  - ``"node"`` (Kuo et al.'s stricter invariant): ``sum_j x^r_j = G^r`` for every node, which
    needs every ``G^r`` to be public. Call this P_node.

P_level is exactly the paper's T^dp: a dummy root holding ``G`` above N independent per-size
trees. ``dp_release`` solves it **exactly**:

* Cost tables. ``phi^r_j(v)`` = least cost of node r's size-j subtree with ``x^r_j = v``.
  ``phi^r_j = f(. - c~^r_j) + (inf-convolution of the children's phi^c_j)``. Each table is convex
  piecewise linear with integer breakpoints (``CostTable``): the leaf term because f is convex
  (for l2 the interpolation of the square at the integers, equal to it there), the
  inf-convolution because the min-plus convolution of discrete convex functions is the *merge
  of their slope sequences* (start every child at its lower bound, then add units in increasing
  slope order), and sums of convex functions are convex. An l1 table has at most
  ``2 * height + 3`` slopes whatever the counts. An l2 table changes slope at every integer, so
  it is held explicitly only on a window (below); an l2 *leaf* is never listed: its slopes are
  the odd numbers ``2(v - c~) + 1``, and a family of leaves is merged in closed form, so a leaf
  costs the same whatever its domain ``0..G``. The l2 case runs vectorised over many families
  at once in ``group_sizes.solvers.batch`` (same tables, same ties); the functions here list
  every table and serve l1 and node faithfulness, family by family.
* Root: ``x^root = argmin sum_j phi^root_j(v_j) s.t. sum_j v_j = G``, the greedy merge of the N
  root tables (T^dp's dummy root). Its value is the optimum of P_level.
* Top-down: every family is split size by size by the same greedy (``split_family``), which
  replays the merge: each child gets the units it won. This is the paper's retrieval, and it
  attains the root's value, so the release is an exact integer optimum of P_level.
* l2 windows of internal nodes (below the root): ``x^r_j`` is kept in a window
  ``[centre - w, centre + w]`` clipped to ``0..G``. The windowed problem is solved exactly as
  above; if no cell of its optimum sits on a window bound other than 0 or G, it is also the
  optimum without windows, whatever the windows were: P_level is a separable convex-cost flow
  (one arc per cell), a flow is optimal iff its residual graph has no negative cycle under unit
  marginal costs, and with no window bound active both problems have the same residual arcs
  with the same costs. Otherwise the bound cells get wider windows and the solve runs again, so
  the returned release is always the exact optimum. ``dp_release`` centres the windows at the
  consistent least-squares estimate and widens only the cells that were on a bound (four
  times); the Spark engine centres them at ``c~`` and doubles a whole level's width.
  If a window misses its children's merged domain, the node's domain is the nearest point of
  that domain; a child's window bound then binds and the certificate sends the solve round
  again.

P_node couples the N per-size trees at every node: the graph has cycles and no tree dynamic
program solves it exactly. Under ``"node"``, tables live on ``0..G^r``, the root is solved as
above (a relaxation: ``lower_bound = opt(P_level with those bounds) <= opt(P_node)``), and
each family is split exactly for its children's totals (``solve_family``, a transportation
problem with convex costs, by successive shortest paths from the per-size split). The release
is feasible with ``lower_bound <= opt(P_node) <= objective``: a certificate of the gap, which
is 0 whenever no family needed a path. ``solve_exact_milp`` solves either problem exactly with
HiGHS as a reference.

The relaxed baseline (``relaxed_qp``)
-------------------------------------
The paper's M_H: the same problem (same faithfulness) without integrality, over the whole
tree, solved by a generic interior-point QP solver (Clarabel) and checked independently
(``solvers/relaxed.py``), then rounded to the nearest integer; the rounding may break
consistency and faithfulness, and ``violations`` counts how often. ``relaxed_families`` solves
the same relaxation family by family top-down instead (not the paper's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np

from censusdp_spark.group_sizes.config import NORMS


@dataclass(frozen=True)
class CostTable:
    """A convex piecewise-linear function on the integers ``lo..hi``.

    ``base`` is its value at ``lo``; then segment ``i`` has length ``lengths[i]`` (> 0) and slope
    ``slopes[i]`` (strictly increasing), so the domain ends at ``hi = lo + sum(lengths)``.
    """

    lo: int
    base: int
    lengths: np.ndarray
    slopes: np.ndarray

    @cached_property
    def hi(self) -> int:
        return self.lo + int(self.lengths.sum())

    @cached_property
    def breakpoints(self) -> np.ndarray:
        """The breakpoints ``lo = b_0 < b_1 < ... < b_m = hi``."""
        return self.lo + np.concatenate(([0], np.cumsum(self.lengths)))

    @property
    def dense(self) -> bool:
        """Whether every integer of the domain is a breakpoint (as for an l2 table)."""
        return self.slopes.size == self.hi - self.lo

    def value(self, v: int) -> int:
        if not self.lo <= v <= self.hi:
            raise ValueError(f"{v} outside the domain {self.lo}..{self.hi}")
        covered = np.minimum(np.maximum(v - self.breakpoints[:-1], 0), self.lengths)
        return self.base + int(covered @ self.slopes)

    def on(self, lo: int, hi: int) -> CostTable:
        """The same function on ``lo..hi`` (inside the domain)."""
        if not self.lo <= lo <= hi <= self.hi:
            raise ValueError(f"{lo}..{hi} not inside the domain {self.lo}..{self.hi}")
        b = self.breakpoints
        lengths = np.minimum(b[1:], hi) - np.maximum(b[:-1], lo)
        return _table(lo, self.value(lo), np.maximum(lengths, 0), self.slopes)

    def step_up(self, v: int) -> tuple[float, int]:
        """Cost of ``v -> v + 1`` and how many further units cost the same (inf, 0 at ``hi``)."""
        if v >= self.hi:
            return np.inf, 0
        b = self.breakpoints
        i = int(np.searchsorted(b, v, side="right")) - 1
        return float(self.slopes[i]), int(b[i + 1] - v)

    def step_down(self, v: int) -> tuple[float, int]:
        """Cost of ``v -> v - 1`` and how many further units cost the same (inf, 0 at ``lo``)."""
        if v <= self.lo:
            return np.inf, 0
        b = self.breakpoints
        i = int(np.searchsorted(b, v, side="left")) - 1
        return float(-self.slopes[i]), int(v - b[i])


def _table(lo: int, base: int, lengths: np.ndarray, slopes: np.ndarray) -> CostTable:
    keep = lengths > 0
    return CostTable(
        int(lo), int(base), lengths[keep].astype(np.int64), slopes[keep].astype(np.int64)
    )


def deviation_table(noisy: int, lo: int, hi: int, norm: str) -> CostTable:
    """``f(v - noisy)`` on ``lo..hi``: ``(v - noisy)^2`` ("l2") or ``|v - noisy|`` ("l1")."""
    if norm == "l2":
        units = np.arange(lo, hi, dtype=np.int64)
        return _table(
            lo, (lo - noisy) ** 2, np.ones(hi - lo, dtype=np.int64), 2 * (units - noisy) + 1
        )
    if norm == "l1":
        turn = min(max(noisy, lo), hi)
        return _table(lo, abs(lo - noisy), np.array([turn - lo, hi - turn]), np.array([-1, 1]))
    raise ValueError(f"unknown norm {norm!r}; use one of {NORMS}")


def add_tables(a: CostTable, b: CostTable) -> CostTable:
    """Pointwise sum of two tables on the same domain (slopes add piece by piece)."""
    if (a.lo, a.hi) != (b.lo, b.hi):
        raise ValueError(f"domains differ: {a.lo}..{a.hi} and {b.lo}..{b.hi}")
    ba, bb = a.breakpoints, b.breakpoints
    points = ba if a.dense else bb if b.dense else np.union1d(ba, bb)
    starts = points[:-1]
    slopes = (
        a.slopes[np.searchsorted(ba, starts, side="right") - 1]
        + b.slopes[np.searchsorted(bb, starts, side="right") - 1]
    )
    return _table(a.lo, a.base + b.base, np.diff(points), slopes)


def merge_tables(tables: Sequence[CostTable]) -> CostTable:
    """Infimal convolution ``v -> min { sum_c t_c(v_c) : sum_c v_c = v }``: a slope merge."""
    slopes = np.concatenate([t.slopes for t in tables])
    lengths = np.concatenate([t.lengths for t in tables])
    distinct, which = np.unique(slopes, return_inverse=True)
    merged = np.zeros(distinct.size, dtype=np.int64)
    np.add.at(merged, which, lengths)
    return _table(sum(t.lo for t in tables), sum(t.base for t in tables), merged, distinct)


def merge_family(children: Sequence[Sequence[CostTable]]) -> list[CostTable]:
    """Per size, the infimal convolution of the children's tables (children x sizes)."""
    return [merge_tables([child[j] for child in children]) for j in range(len(children[0]))]


def split_family(children: Sequence[Sequence[CostTable]], parent: np.ndarray) -> np.ndarray:
    """Children's histograms (k x N): per size, the parent's count split by the greedy merge."""
    columns = [
        _Pooled.of([child[j] for child in children]).split(int(v)) for j, v in enumerate(parent)
    ]
    return np.stack(columns, axis=1)


def node_tables(
    noisy: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    merged: Sequence[CostTable] | None,
    norm: str,
) -> list[CostTable]:
    """The N cost tables ``phi^r_j`` of one node on its bounds ``lo..hi`` (per size) met with
    its children's merged domain, from its noisy histogram and, for an internal node, its
    children's merged tables."""
    out = []
    for j, c in enumerate(noisy):
        if merged is None:
            out.append(deviation_table(int(c), int(lo[j]), int(hi[j]), norm))
            continue
        a, b = max(int(lo[j]), merged[j].lo), min(int(hi[j]), merged[j].hi)
        out.append(add_tables(deviation_table(int(c), a, b, norm), merged[j].on(a, b)))
    return out


def cell_bounds(
    noisy: np.ndarray, upper: int, width: int | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of cells: ``0..upper`` (G^r under node faithfulness, G under level), or with a
    ``width`` (one, or one per cell) the window ``noisy +/- width`` clipped to it (l2 internal
    nodes, level)."""
    zeros = np.zeros(noisy.size, dtype=np.int64)
    if width is None:
        return zeros, np.full(noisy.size, upper, dtype=np.int64)
    return np.clip(noisy - width, 0, upper), np.clip(noisy + width, 0, upper)


def window_bound(counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, upper: int) -> np.ndarray:
    """Cells on a window bound that is not a bound of the problem (0 or G): if there are none,
    the windowed optimum is the optimum (module docstring)."""
    return ((counts <= lo) & (lo > 0)) | ((counts >= hi) & (hi < upper))


@dataclass(frozen=True)
class _Pooled:
    """Several tables' segments side by side, tagged by owner (for repeated splits)."""

    lo: np.ndarray
    owner: np.ndarray
    slopes: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, tables: Sequence[CostTable]) -> _Pooled:
        return cls(
            np.array([t.lo for t in tables], dtype=np.int64),
            np.repeat(np.arange(len(tables)), [t.slopes.size for t in tables]),
            np.concatenate([t.slopes for t in tables]),
            np.concatenate([t.lengths for t in tables]),
        )

    def split(self, total: int, prices: np.ndarray | None = None) -> np.ndarray:
        need = total - int(self.lo.sum())
        if not 0 <= need <= int(self.lengths.sum()):
            raise ValueError(f"total {total} outside the merged domain of the tables")
        slopes = self.slopes if prices is None else self.slopes + prices[self.owner]
        order = np.lexsort((self.owner, slopes))
        lengths = self.lengths[order]
        take = np.clip(need - (np.cumsum(lengths) - lengths), 0, lengths)
        out = self.lo.copy()
        np.add.at(out, self.owner[order], take)
        return out


def split_by_slopes(tables: Sequence[CostTable], total: int) -> np.ndarray:
    """``argmin sum_c t_c(v_c) s.t. sum_c v_c = total``: fill units in increasing slope order.

    Ties go to the lower index, so the split is deterministic.
    """
    return _Pooled.of(tables).split(total)


WINDOW_WIDENING = 8
"""A cell found on its l2 window bound, or every window when G is out of the root tables'
reach (``WindowTooNarrow``), is solved again with a window this many times wider: the
in-process driver (``tree.dp_release``) and the Spark driver (``group_sizes.exact.bound_cells``,
``DpPlan.wider``) share it. Any factor > 1 gives the same exact optimum (the certificate holds
for any windows); 8 needed the fewest rounds on the national trees."""

FIRST_WINDOW_SCALES = 4
"""A level's first l2 window half-width spans this many noise scales of its cells ..."""
FIRST_WINDOW_SLACK = 4
"""... plus this many units, so that a level with a tiny noise scale still gets a window."""


def first_window(scale: Fraction) -> int:
    """The first l2 window half-width of a level whose cells have noise scale ``scale``:
    ``ceil(FIRST_WINDOW_SCALES * scale) + FIRST_WINDOW_SLACK``, where the Spark driver starts
    (``tree.dp_release`` takes its first half-width as an argument)."""
    return -(-FIRST_WINDOW_SCALES * scale.numerator // scale.denominator) + FIRST_WINDOW_SLACK


class WindowTooNarrow(ValueError):
    """The root's total G lies outside what the windowed tables can hold: widen and retry."""


def solve_root(tables: Sequence[CostTable], groups: int) -> np.ndarray:
    """The root's histogram: the dummy root of T^dp holding ``groups`` over the N size tables."""
    low, high = sum(t.lo for t in tables), sum(t.hi for t in tables)
    if not low <= groups <= high:
        raise WindowTooNarrow(f"G = {groups} outside the root tables' reach {low}..{high}")
    return split_by_slopes(tables, groups)


class _Steps:
    """Marginal costs of moving each cell of a family by one unit, kept up to date."""

    def __init__(self, tables: Sequence[Sequence[CostTable]], v: np.ndarray) -> None:
        self.tables = tables
        k, n = v.shape
        self.up = np.empty((k, n))
        self.down = np.empty((k, n))
        self.up_run = np.empty((k, n), dtype=np.int64)
        self.down_run = np.empty((k, n), dtype=np.int64)
        for c in range(k):
            for j in range(n):
                self.refresh(c, j, int(v[c, j]))

    def refresh(self, c: int, j: int, value: int) -> None:
        self.up[c, j], self.up_run[c, j] = self.tables[c][j].step_up(value)
        self.down[c, j], self.down_run[c, j] = self.tables[c][j].step_down(value)


def _priced_start(
    children: Sequence[Sequence[CostTable]], parent: np.ndarray, groups: np.ndarray, rounds: int = 6
) -> np.ndarray:
    """A per-size optimum under integer row prices, chosen to nearly meet the row sums.

    A price ``p_c`` on every unit of child c adds ``p_c * G^c`` to any solution meeting the row
    sums, so it changes no family optimum; and the per-size greedy under any prices is optimal
    for its own row sums, so it leaves no negative cycle and is a valid start for successive
    shortest paths. Prices only shrink the imbalance those paths must repair (l2 tables change
    slope at every unit, so each path moves one unit). Tatonnement: raise the price of a child
    holding too many groups; stop when the imbalance is small or stops falling.
    """
    k, n = len(children), len(parent)
    columns = [_Pooled.of([kid[j] for kid in children]) for j in range(n)]
    prices = np.zeros(k, dtype=np.int64)
    step = 2.0 / n  # an l2 leaf gives up about one unit per size for a price rise of 2
    best, best_v = None, None
    for _ in range(rounds):
        v = np.stack([columns[j].split(int(parent[j]), prices) for j in range(n)], axis=1)
        excess = v.sum(axis=1) - groups
        imbalance = int(np.abs(excess).sum())
        if best is not None and imbalance >= best:
            break
        best, best_v = imbalance, v
        if imbalance <= 2 * k:
            break
        moves = np.rint(step * excess).astype(np.int64)
        prices += np.where((moves == 0) & (excess != 0), np.sign(excess), moves)
    assert best_v is not None
    return best_v


def solve_family(
    children: Sequence[Sequence[CostTable]], parent: np.ndarray, groups: np.ndarray
) -> np.ndarray:
    """Children's histograms (k x N) for a parent's released histogram, exactly.

    Minimises ``sum_c sum_j children[c][j](v[c, j])`` s.t. column sums ``parent`` and row sums
    ``groups``. Starts from a per-size optimum (column sums only; ``_priced_start``), then
    moves units from children with too many groups to children with too few along shortest
    paths of the residual graph (child -> size: take a unit of that size; size -> child: give
    it), each time as many units as keep every marginal cost on the path unchanged.
    """
    k, n = len(children), len(parent)
    groups = np.asarray(groups, dtype=np.int64)
    if int(np.sum(parent)) != int(groups.sum()):
        raise ValueError(f"parent holds {np.sum(parent)} groups, the children {groups.sum()}")
    v = _priced_start(children, parent, groups)
    excess = v.sum(axis=1) - groups
    if not excess.any():
        return v
    steps = _Steps(children, v)
    while (excess > 0).any():
        dist_c = np.where(excess > 0, 0.0, np.inf)
        dist_s = np.full(n, np.inf)
        via_size = np.full(k, -1)  # size through which each child was reached
        via_child = np.full(n, -1)  # child from which each size was reached
        for _ in range(k + n + 2):
            reach_s = dist_c[:, None] + steps.down
            best_c = reach_s.argmin(axis=0)
            cand_s = reach_s[best_c, np.arange(n)]
            better_s = cand_s < dist_s
            dist_s[better_s], via_child[better_s] = cand_s[better_s], best_c[better_s]
            reach_c = dist_s[None, :] + steps.up
            best_j = reach_c.argmin(axis=1)
            cand_c = reach_c[np.arange(k), best_j]
            better_c = cand_c < dist_c
            dist_c[better_c], via_size[better_c] = cand_c[better_c], best_j[better_c]
            if not better_s.any() and not better_c.any():
                break
        else:
            raise RuntimeError("negative cycle in a family's residual graph (tables not convex?)")
        deficit = np.flatnonzero(excess < 0)
        target = int(deficit[np.argmin(dist_c[deficit])])
        if not np.isfinite(dist_c[target]):
            raise RuntimeError("no path from a child with surplus groups to one with too few")
        gains, losses, c = [], [], target
        while via_size[c] >= 0:
            j = int(via_size[c])
            gains.append((c, j))
            c = int(via_child[j])
            losses.append((c, j))
        amount = min(int(excess[c]), int(-excess[target]))
        amount = min(
            [amount]
            + [int(steps.up_run[g]) for g in gains]
            + [int(steps.down_run[g]) for g in losses]
        )
        for cell in gains:
            v[cell] += amount
        for cell in losses:
            v[cell] -= amount
        for cell in gains + losses:
            steps.refresh(cell[0], cell[1], int(v[cell]))
        excess[c] -= amount
        excess[target] += amount
    return v
