"""The group-size dynamic program for l2 under level faithfulness, vectorised over many families.

Same problem, same cost tables and same tie-breaking as the per-family functions of
``solvers.group_sizes`` (read its module docstring first); what changes is that one call
handles every family of a batch (a Spark task's share of a level, or a whole level of a tree)
with a handful of numpy passes instead of Python loops per node and size, so the work per cell
is a few array operations whatever the counts.

Cells. Under level faithfulness the N per-size trees are independent below the dummy root, so
the unit of work is a *cell*: a (node, size) pair. A family is a parent cell and its children
cells (the same size of every child). Arrays of children are ordered by family, and within a
family by child (geocode) order; ``family`` holds each child's family index ``0..F-1`` and is
non-decreasing, and every family has at least one child.

Tables. A cell's cost table ``phi`` on ``lo..lo + width`` is held *dense*: ``base = phi(lo)``
and one slope per unit, ``phi(v + 1) - phi(v)`` for ``v = lo..lo + width - 1`` (``Tables``);
windows keep ``width <= 2w``. A parent's table on its domain ``[a, b]`` (its window met with
its children's merged domain ``[L, U]``, ``L = sum lo_c``) is, for ``v`` in ``[a, b)``, the
``(v - L + 1)``-th smallest slope of all its children's slopes plus its own deviation slope
``2 (v - c~) + 1``; its base is ``sum base_c + (sum of the a - L smallest slopes) + (a - c~)^2``.

Leaves are never listed (their domain is ``0..G``): leaf ``c``'s slopes are the odd numbers
``f_c, f_c + 2, ...`` with ``f_c = 1 - 2 c~_c``. With a family's ``f`` sorted, ``f_1 <= ... <=
f_k``, prefix sums ``S_m`` and the rank ``E_m = (m f_{m+1} - S_m) / 2`` reached by the first m
leaves before leaf m + 1 starts, the t-th smallest slope is the smallest odd
``s >= (2t + S_m - 2m) / m`` for the smallest ``m`` with ``E_m >= t``, and the sum of the
slopes below ``s`` is ``(m (s - 1)^2 - sum_{i<=m} (f_i - 1)^2) / 4``. A leaf's cap of G slopes
never binds: no rank asked for exceeds G.

Splits (top-down). A parent's value ``v`` goes to its children as the ``v - L`` smallest
slopes of the family, ties to the lower child index, exactly as ``split_family``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from censusdp_spark.solvers.group_sizes import CostTable, cell_bounds, solve_root

_RANK_SPAN = np.int64(1) << np.int64(40)
ACTIVE_SET_ROUNDS = 16
"""At most this many active-set rounds when centring ``dp_release``'s windows."""
_MAX_FAMILIES = 1 << 22
"""Ranks are looked up as ``family * _RANK_SPAN + rank`` in int64: ranks stay below G < 2^40
and a batch holds fewer than 2^22 families (checked)."""


def _starts(family: np.ndarray, families: int) -> np.ndarray:
    """Where each family's run begins in a non-decreasing ``family`` array (length F + 1)."""
    return np.searchsorted(family, np.arange(families + 1))


def _segmented_cumsum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running sums that restart at every family (``values`` ordered by family)."""
    total = np.cumsum(values)
    sizes = np.diff(starts)
    before = np.concatenate(([0], total))[starts[:-1]]
    return total - np.repeat(before, sizes)


def _ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``first[i], first[i] + 1, ..., first[i] + count[i] - 1`` for every i, concatenated."""
    offsets = np.repeat(np.cumsum(count) - count, count)
    return np.repeat(first, count) + np.arange(int(count.sum()), dtype=np.int64) - offsets


@dataclass(frozen=True)
class Tables:
    """Cost tables of many cells, dense: cell i lives on ``lo[i]..lo[i] + width[i]`` and its
    ``width[i]`` unit slopes are ``slopes[offsets[i]:offsets[i + 1]]``."""

    lo: np.ndarray
    base: np.ndarray
    width: np.ndarray
    slopes: np.ndarray

    @cached_property
    def offsets(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.width)))

    def cost_table(self, i: int) -> CostTable:
        """Cell i as a ``CostTable`` (equal consecutive slopes joined into one segment)."""
        return compress(
            int(self.lo[i]), int(self.base[i]), self.slopes[self.offsets[i] : self.offsets[i + 1]]
        )

    def segments(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Every cell as ``CostTable`` segments (runs of equal slopes): lengths and slopes."""
        cell = np.repeat(np.arange(self.lo.size), self.width)
        new = np.ones(self.slopes.size, dtype=bool)
        new[1:] = (self.slopes[1:] != self.slopes[:-1]) | (cell[1:] != cell[:-1])
        first = np.flatnonzero(new)
        lengths = np.diff(np.append(first, self.slopes.size))
        bounds = np.cumsum(np.bincount(cell[first], minlength=self.lo.size))[:-1]
        return np.split(lengths, bounds), np.split(self.slopes[first], bounds)

    @classmethod
    def of_segments(
        cls, lo: np.ndarray, base: np.ndarray, lengths: list[np.ndarray], slopes: list[np.ndarray]
    ) -> Tables:
        """Cells given as ``CostTable`` segments, made dense."""
        count = np.fromiter((x.size for x in lengths), dtype=np.int64, count=len(lengths))
        flat = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        cell = np.repeat(np.arange(count.size), count)
        width = np.zeros(count.size, dtype=np.int64)
        np.add.at(width, cell, flat)
        dense = np.repeat(np.concatenate(slopes) if slopes else flat, flat)
        return cls(lo, base, width, dense.astype(np.int64))

    def take(self, index: np.ndarray) -> Tables:
        """The cells ``index``, in that order."""
        slopes = self.slopes[_ranges(self.offsets[index], self.width[index])]
        return Tables(self.lo[index], self.base[index], self.width[index], slopes)


def compress(lo: int, base: int, slopes: np.ndarray) -> CostTable:
    """A dense table as a ``CostTable``: runs of equal slopes become one segment."""
    if slopes.size == 0:
        return CostTable(lo, base, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    new = np.flatnonzero(np.concatenate(([True], slopes[1:] != slopes[:-1])))
    lengths = np.diff(np.append(new, slopes.size))
    return CostTable(lo, base, lengths.astype(np.int64), slopes[new].astype(np.int64))


def _meet(lo: np.ndarray, hi: np.ndarray, low: np.ndarray, high: np.ndarray):
    """Each parent's domain: its bounds met with its children's merged domain ``low..high``;
    if they miss, a window as wide as the bounds slid to the near end of the merged domain
    (any windows keep the solve exact: only the certificate of ``solvers.group_sizes`` reads
    them)."""
    a, b = np.maximum(lo, low), np.minimum(hi, high)
    apart = a > b
    span = hi - lo
    below = high < lo  # the children cannot reach the window: take the top of their domain
    a = np.where(apart & below, np.maximum(high - span, low), np.where(apart, low, a))
    b = np.where(apart & below, high, np.where(apart, np.minimum(low + span, high), b))
    return a, b


def _parent_tables(
    noisy: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    merged: np.ndarray,
    prefix: np.ndarray,
    base: np.ndarray,
) -> Tables:
    """Parents' tables from the merged slopes at their units (flat, parent after parent), the
    sums of the children's slopes below ``a`` and the children's bases."""
    width = b - a
    v = _ranges(a, width)
    deviation = 2 * (v - np.repeat(noisy, width)) + 1
    return Tables(a, base + prefix + (a - noisy) ** 2, width, merged + deviation)


# --- leaves (implicit) -------------------------------------------------------------------------


@dataclass(frozen=True)
class LeafFamilies:
    """Sibling l2 leaves of many families, each on ``0..G``: their noisy values by family."""

    family: np.ndarray  # (n,) non-decreasing
    noisy: np.ndarray  # (n,)
    families: int

    @cached_property
    def _first(self) -> np.ndarray:
        return 1 - 2 * self.noisy.astype(np.int64)

    @cached_property
    def starts(self) -> np.ndarray:
        return _starts(self.family, self.families)

    @cached_property
    def _by_first(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per family, first slopes sorted: the lookup keys (family, E_m), S_m, Q_m."""
        low = int(self._first.min()) if self._first.size else 0
        span = int(self._first.max()) - low + 1 if self._first.size else 0
        if self.families * span < 1 << 62:
            order = np.argsort(self.family * span + (self._first - low), kind="stable")
        else:
            order = np.lexsort((self._first, self.family))
        f = self._first[order]
        s = _segmented_cumsum(f, self.starts)
        q = _segmented_cumsum((f - 1) ** 2, self.starts)
        m = (
            np.arange(f.size, dtype=np.int64)
            - np.repeat(self.starts[:-1], np.diff(self.starts))
            + 1
        )
        last = np.zeros(f.size, dtype=bool)
        last[self.starts[1:] - 1] = True
        nxt = np.append(f[1:], 0)
        reach = np.where(last, _RANK_SPAN - 1, np.minimum((m * nxt - s) // 2, _RANK_SPAN - 1))
        return self.family[order] * _RANK_SPAN + reach, s, q, m

    def slope_at(self, family: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``rank``-th smallest slope (rank >= 1) of each asked family, and the index of the
        family's last active leaf in sorted order (for the sums below it)."""
        keys, s, _, m = self._by_first
        if self.families >= _MAX_FAMILIES or (rank.size and int(rank.max()) >= _RANK_SPAN):
            raise ValueError("too many families or too large a rank for the packed lookup keys")
        g = np.searchsorted(keys, family * _RANK_SPAN + rank, side="left")
        active = m[g]
        x = -((-(2 * rank + s[g] - 2 * active)) // active)  # ceil
        return x + (x % 2 == 0), g

    def smallest_sum(self, family: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Sum of the ``count`` smallest slopes of each asked family (0 for count 0)."""
        _, s, q, m = self._by_first
        slope, g = self.slope_at(family, np.maximum(count, 1))
        active = m[g]
        below = (active * slope - s[g]) // 2
        total = (active * (slope - 1) ** 2 - q[g]) // 4 + (count - below) * slope
        return np.where(count > 0, total, 0)

    def base(self) -> np.ndarray:
        """Each family's summed leaf costs at 0: ``sum c~^2``."""
        return np.add.reduceat(self.noisy.astype(np.int64) ** 2, self.starts[:-1])

    def parent_tables(self, noisy: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Tables:
        """The parents' tables on their bounds ``lo..hi`` (within ``0..G``)."""
        width = hi - lo
        fam = np.repeat(np.arange(self.families, dtype=np.int64), width)
        ranks = _ranges(lo, width) + 1
        merged, _ = self.slope_at(fam, ranks)
        prefix = self.smallest_sum(np.arange(self.families, dtype=np.int64), lo)
        return _parent_tables(noisy, lo, hi, merged, prefix, self.base())

    def split(self, values: np.ndarray) -> np.ndarray:
        """Each leaf's value when family f holds ``values[f]`` (the greedy merge's split)."""
        families = np.arange(self.families, dtype=np.int64)
        slope, _ = self.slope_at(families, np.maximum(values, 1))
        s = np.repeat(slope, np.diff(self.starts))
        out = np.maximum((s - self._first) // 2, 0)
        holders = (self._first <= s).astype(np.int64)
        left = values - np.add.reduceat(out, self.starts[:-1])
        turn = _segmented_cumsum(holders, self.starts)
        out += (holders == 1) & (turn <= np.repeat(left, np.diff(self.starts)))
        return np.where(np.repeat(values, np.diff(self.starts)) > 0, out, 0)


# --- internal children (listed tables) ---------------------------------------------------------


@dataclass(frozen=True)
class TableFamilies:
    """Sibling internal cells of many families with their dense tables."""

    family: np.ndarray  # (n,) non-decreasing
    tables: Tables
    families: int

    @cached_property
    def starts(self) -> np.ndarray:
        return _starts(self.family, self.families)

    @cached_property
    def _owner(self) -> np.ndarray:
        return np.repeat(np.arange(self.family.size, dtype=np.int64), self.tables.width)

    @cached_property
    def _sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every unit slope sorted by (family, slope, child); each family's first position."""
        owner, slopes = self._owner, self.tables.slopes
        low = int(slopes.min()) if slopes.size else 0
        span = int(slopes.max()) - low + 1 if slopes.size else 0
        if self.families * span < 1 << 62:
            # One integer key; the units come family-major and child-major, each child's slopes
            # non-decreasing, so a stable sort keeps ties by child and merges sorted runs.
            key = self.family[owner] * span + (slopes - low)
            order = np.argsort(key, kind="stable")
        else:
            order = np.lexsort((owner, slopes, self.family[owner]))
        units = np.add.reduceat(self.tables.width, self.starts[:-1])
        first = np.concatenate(([0], np.cumsum(units)))
        return order, self.tables.slopes[order], first

    def merged_domain(self) -> tuple[np.ndarray, np.ndarray]:
        low = np.add.reduceat(self.tables.lo, self.starts[:-1])
        return low, low + np.add.reduceat(self.tables.width, self.starts[:-1])

    def parent_tables(self, noisy: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Tables:
        """The parents' tables on their bounds ``lo..hi`` met with the merged domains."""
        low, high = self.merged_domain()
        a, b = _meet(lo, hi, low, high)
        _, slopes, first = self._sorted
        at = _ranges(first[:-1] + a - low, b - a)
        running = np.concatenate(([0], np.cumsum(slopes)))
        prefix = running[first[:-1] + a - low] - running[first[:-1]]
        base = np.add.reduceat(self.tables.base, self.starts[:-1])
        return _parent_tables(noisy, a, b, slopes[at], prefix, base)

    def split(self, values: np.ndarray) -> np.ndarray:
        """Each child's value when family f holds ``values[f]`` (the greedy merge's split)."""
        low, high = self.merged_domain()
        outside = np.flatnonzero((values < low) | (values > high))
        if outside.size:
            f = int(outside[0])
            raise ValueError(
                f"family {f}: total {int(values[f])} outside its children's merged domain "
                f"{int(low[f])}..{int(high[f])}"
            )
        order, _, first = self._sorted
        position = np.arange(order.size, dtype=np.int64)
        family = np.repeat(np.arange(self.families, dtype=np.int64), np.diff(first))
        taken = position - first[family] < (values - low)[family]
        won = np.bincount(self._owner[order[taken]], minlength=self.family.size)
        return self.tables.lo + won


# --- a whole tree, level by level (the reference runs and the benchmarks) ---------------------


@dataclass(frozen=True)
class TreeLevels:
    """A tree's nodes by depth, each level ordered by (parent's position above, node index), so
    that siblings are contiguous; ``parent_position[d]`` is each node's parent's position in
    level ``d - 1``."""

    nodes: list[np.ndarray]
    parent_position: list[np.ndarray]

    def first_child(self, d: int) -> np.ndarray:
        """Where each node of level ``d - 1`` has its first child in level ``d``."""
        return np.searchsorted(self.parent_position[d], np.arange(self.nodes[d - 1].size))

    @classmethod
    def of(cls, parent: np.ndarray) -> TreeLevels:
        nodes, positions = [np.array([0])], [np.array([-1])]
        position = np.full(parent.size, -1)
        position[0] = 0
        while True:
            above = nodes[-1]
            kids = np.flatnonzero((parent >= 0) & np.isin(parent, above))
            if kids.size == 0:
                break
            at = position[parent[kids]]
            order = np.argsort(at, kind="stable")
            kids, at = kids[order], at[order]
            if np.unique(at).size != above.size:
                raise ValueError("every leaf must be at the same depth (levels must be even)")
            position[kids] = np.arange(kids.size)
            nodes.append(kids)
            positions.append(at)
        return cls(nodes, positions)


def family_order(parent_position: np.ndarray, sizes: int) -> tuple[np.ndarray, np.ndarray]:
    """Children cells (node-major) put in family order: the permutation, and each cell's family
    ``parent_position * sizes + size`` in that order."""
    family = (parent_position[:, None] * sizes + np.arange(sizes)).ravel()
    order = np.argsort(family, kind="stable")
    return order, family[order]


def consistent_estimate(
    noisy: np.ndarray, levels: TreeLevels, groups: int, zero: np.ndarray | None = None
) -> np.ndarray:
    """The least-squares estimate (reals, n x N) that is consistent and sums to ``groups`` at
    the root, ignoring integrality and non-negativity except that leaf cells marked in
    ``zero`` (n x N) are held at 0: the usual two passes for equal-variance tree measurements
    (children sums combined with a node's own measurement by inverse variance bottom-up,
    differences handed down in proportion to variance; a cell held at 0 has variance 0)."""
    sizes = noisy.shape[1]
    estimate = noisy.astype(np.float64)
    variance = np.ones(noisy.shape)
    if zero is not None:
        estimate[zero], variance[zero] = 0.0, 0.0
    for d in reversed(range(1, len(levels.nodes))):
        kids, up, first = levels.nodes[d], levels.nodes[d - 1], levels.first_child(d)
        sums = np.add.reduceat(estimate[kids], first, axis=0)
        spread = np.add.reduceat(variance[kids], first, axis=0)
        # own measurement (variance 1) against the children's sum (variance ``spread``)
        estimate[up] = (spread * estimate[up] + sums) / (1 + spread)
        variance[up] = spread / (1 + spread)
    root = variance[0]
    if root.sum() > 0:
        estimate[0] += root / root.sum() * (groups - estimate[0].sum())
    for d in range(1, len(levels.nodes)):
        kids, up, first = levels.nodes[d], levels.nodes[d - 1], levels.first_child(d)
        position = levels.parent_position[d]
        gap = estimate[up] - np.add.reduceat(estimate[kids], first, axis=0)
        spread = np.add.reduceat(variance[kids], first, axis=0)
        share = np.zeros((kids.size, sizes))
        np.divide(variance[kids], spread[position], out=share, where=spread[position] > 0)
        estimate[kids] += share * gap[position]
    return estimate


def window_centres(noisy: np.ndarray, levels: TreeLevels, groups: int) -> np.ndarray:
    """Where ``dp_release`` centres its l2 windows: the consistent least-squares estimate, with
    leaf cells that come out negative held at 0 and the estimate redone (active-set rounds,
    until fewer than one leaf cell in a thousand turns negative), rounded. Leaves pinned at 0
    lift their ancestors as non-negativity lifts the exact optimum, so the windows of the whole
    tree sit near it; the certificate fixes what this approximation misses."""
    zero = np.zeros(noisy.shape, dtype=bool)
    leaves = levels.nodes[-1]
    for _ in range(ACTIVE_SET_ROUNDS):
        estimate = consistent_estimate(noisy, levels, groups, zero)
        negative = np.zeros(noisy.shape, dtype=bool)
        negative[leaves] = estimate[leaves] < -0.5
        zero |= negative
        if negative.sum() * 1000 < leaves.size * noisy.shape[1]:
            break
    return np.rint(estimate).astype(np.int64)


@dataclass(frozen=True)
class TreeProblem:
    """P_level with l2 over a whole tree, ready for passes with different windows (what does
    not depend on the windows, the levels and the leaf families, is built once)."""

    noisy: np.ndarray  # (n, N)
    groups: int
    levels: TreeLevels

    @classmethod
    def of(cls, noisy: np.ndarray, parent: np.ndarray, groups: int) -> TreeProblem:
        return cls(noisy.astype(np.int64), groups, TreeLevels.of(parent))

    @cached_property
    def _orders(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per level d >= 1, its cells in family order: the permutation and the families."""
        sizes = self.noisy.shape[1]
        return [(np.empty(0, np.int64),) * 2] + [
            family_order(p, sizes) for p in self.levels.parent_position[1:]
        ]

    @cached_property
    def _leaves(self) -> LeafFamilies:
        order, family = self._orders[-1]
        count = self.levels.nodes[-2].size * self.noisy.shape[1]
        return LeafFamilies(family, self.noisy[self.levels.nodes[-1]].ravel()[order], count)

    def solve(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, int]:
        """One pass with the cell bounds ``lo..hi`` (n x N; read for internal nodes below the
        root): the counts (n x N) and the root tables' optimum. Raises ``WindowTooNarrow`` if G
        is out of the root tables' reach."""
        nodes, sizes = self.levels.nodes, self.noisy.shape[1]
        depth = len(nodes) - 1
        families: list[LeafFamilies | TableFamilies] = []
        below: Tables | None = None
        for d in reversed(range(depth)):
            order, family = self._orders[d + 1]
            if below is None:
                fam: LeafFamilies | TableFamilies = self._leaves
            else:
                fam = TableFamilies(family, below.take(order), nodes[d].size * sizes)
            families.append(fam)
            here = self.noisy[nodes[d]].ravel()
            if d > 0:
                bounds = lo[nodes[d]].ravel(), hi[nodes[d]].ravel()
            else:
                bounds = cell_bounds(here, self.groups, None)
            below = fam.parent_tables(here, *bounds)
        assert below is not None
        root = [below.cost_table(j) for j in range(sizes)]
        counts = np.zeros(self.noisy.shape, dtype=np.int64)
        counts[0] = solve_root(root, self.groups)
        lower = sum(t.value(int(v)) for t, v in zip(root, counts[0], strict=True))
        for d, fam in zip(range(depth), reversed(families), strict=True):
            order = self._orders[d + 1][0]
            cells = np.empty(order.size, dtype=np.int64)
            cells[order] = fam.split(counts[nodes[d]].ravel())
            counts[nodes[d + 1]] = cells.reshape(-1, sizes)
        return counts, int(lower)
