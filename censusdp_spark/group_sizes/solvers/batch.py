"""The group-size dynamic program for l2 under level faithfulness, vectorised over many families.

Same problem, same cost tables and same tie-breaking as the per-family functions of
``group_sizes.solvers.cost_tables`` (read its module docstring first); what changes is that one call
handles every family of a batch (a Spark task's share of a level, or a whole level of a tree)
with a handful of numpy passes instead of Python loops per node and size, so the work per cell
is a few array operations whatever the counts. A large batch is cut into runs of whole
families of about ``BLOCK_ITEMS`` children (or unit slopes) so that each pass stays in the
CPU's caches; runs change nothing in the result.

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

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cached_property
from typing import TypeVar

import numpy as np

from censusdp_spark.group_sizes.solvers.cost_tables import CostTable, cell_bounds, solve_root

_RANK_SPAN = np.int64(1) << np.int64(40)
ACTIVE_SET_ROUNDS = 16
"""At most this many active-set rounds when centring ``dp_release``'s windows."""
_MAX_FAMILIES = 1 << 22
"""Ranks are looked up as ``family * _RANK_SPAN + rank`` in int64: ranks stay below G < 2^40
and a batch holds fewer than 2^22 families (checked)."""


BLOCK_ITEMS = 1 << 17
"""Families are handled in runs of about this many children (leaves) or unit slopes (tables):
numpy's passes over a run stay in the CPU's caches and reuse freed memory, which made a whole
national level's leaf tables 2.5x faster than passes over the level at once."""


_Run = TypeVar("_Run")


def _in_runs(
    item_starts: np.ndarray, child_starts: np.ndarray, piece: Callable[[slice, int, int], _Run]
) -> list[tuple[int, int, _Run]] | None:
    """The families cut into consecutive runs ``[f0, f1)`` of whole families holding about
    ``BLOCK_ITEMS`` items each (``item_starts``: where each family's items begin, length F + 1;
    a larger family is a run of its own), each as ``piece(its children's rows, f0, f1 - f0)``
    (``child_starts``: where each family's children begin); None if they make one run."""
    families, items = item_starts.size - 1, int(item_starts[-1])
    marks = np.arange(BLOCK_ITEMS, items, BLOCK_ITEMS)
    cuts = np.searchsorted(item_starts, marks, side="right") - 1  # the family holding each mark
    edges = np.unique(np.concatenate(([0], cuts, [families]))).tolist()
    if len(edges) <= 2:
        return None
    return [
        (f0, f1, piece(slice(int(child_starts[f0]), int(child_starts[f1])), f0, f1 - f0))
        for f0, f1 in zip(edges[:-1], edges[1:], strict=True)
    ]


def _starts(family: np.ndarray, families: int) -> np.ndarray:
    """Where each family's run begins in a non-decreasing ``family`` array (length F + 1)."""
    return np.searchsorted(family, np.arange(families + 1))


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

    def cells(self, first: int, stop: int) -> Tables:
        """The cells ``first..stop - 1``."""
        units = slice(int(self.offsets[first]), int(self.offsets[stop]))
        return Tables(
            self.lo[first:stop], self.base[first:stop], self.width[first:stop], self.slopes[units]
        )

    @classmethod
    def concatenate(cls, parts: list[Tables]) -> Tables:
        """The cells of ``parts``, one after the other."""
        names = [f.name for f in fields(cls)]
        return cls(*(np.concatenate([getattr(t, k) for t in parts]) for k in names))

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
    (any windows keep the solve exact: only the certificate of ``group_sizes.solvers.cost_tables`` reads
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
        return 1 - 2 * self.noisy.astype(np.int64, copy=False)

    @cached_property
    def starts(self) -> np.ndarray:
        return _starts(self.family, self.families)

    @cached_property
    def _sorted_first(self) -> np.ndarray:
        """Each family's first slopes sorted (families in order, as ``starts``)."""
        low = int(self._first.min()) if self._first.size else 0
        span = int(self._first.max()) - low + 1 if self._first.size else 0
        if self.families * span < 1 << 62:
            # ``family`` is non-decreasing: sorting one integer key keeps every family in place
            offset = self.family * span - low
            return np.sort(offset + self._first, kind="stable") - offset
        return self._first[np.lexsort((self._first, self.family))]

    @cached_property
    def _runs(self) -> list[tuple[int, int, LeafFamilies]] | None:
        """The families in cache-sized runs ``[f0, f1)`` (``BLOCK_ITEMS``), each with its
        leaves, or None if they make one run."""
        return _in_runs(
            self.starts,
            self.starts,
            lambda rows, f0, n: LeafFamilies(self.family[rows] - f0, self.noisy[rows], n),
        )

    def largest_first(self) -> np.ndarray:
        """Each family's noisy values, largest first (families in order, as ``starts``)."""
        if self._runs is not None:
            return np.concatenate([run.largest_first() for _, _, run in self._runs])
        return (1 - self._sorted_first) // 2

    @cached_property
    def _by_first(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per family, first slopes sorted: the lookup keys (family, E_m), and the running sums
        over the whole batch (from 0) of the sorted first slopes and of their ``(f - 1)^2``."""
        f = self._sorted_first
        sizes = np.diff(self.starts)
        running = np.concatenate(([0], np.cumsum(f)))
        squares = np.concatenate(([0], np.cumsum((f - 1) ** 2)))
        start = np.repeat(self.starts[:-1], sizes)
        m = np.arange(1, f.size + 1, dtype=np.int64) - start
        s = running[1:] - np.repeat(running[self.starts[:-1]], sizes)
        nxt = np.append(f[1:], 0)
        reach = np.minimum((m * nxt - s) >> 1, _RANK_SPAN - 1)  # m f_{m+1} - S_m is even
        reach[self.starts[1:] - 1] = _RANK_SPAN - 1  # a family's last leaf: no rank beyond
        return self.family * _RANK_SPAN + reach, running, squares

    def _active(
        self, family: np.ndarray, rank: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each asked family and rank >= 1: where its leaves active at that rank end in
        sorted order (exclusive), how many they are (m) and the sum of their first slopes."""
        keys, running, _ = self._by_first
        if self.families >= _MAX_FAMILIES or (rank.size and int(rank.max()) >= _RANK_SPAN):
            raise ValueError("too many families or too large a rank for the packed lookup keys")
        end = np.searchsorted(keys, family * _RANK_SPAN + rank, side="left") + 1
        start = self.starts[family]
        return end, end - start, running[end] - running[start]

    def slope_at(self, family: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``rank``-th smallest slope (rank >= 1) of each asked family, and how many of the
        family's leaves are active there."""
        _, active, s = self._active(family, rank)
        return self._slope(rank, active, s), active

    @staticmethod
    def _slope(rank: np.ndarray, active: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The smallest odd number ``>= (2 rank + S_m - 2m) / m``."""
        x = -((-(2 * rank + s - 2 * active)) // active)  # ceil
        return x | 1

    def smallest_sum(self, family: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Sum of the ``count`` smallest slopes of each asked family (0 for count 0)."""
        _, _, squares = self._by_first
        rank = np.maximum(count, 1)
        end, active, s = self._active(family, rank)
        slope = self._slope(rank, active, s)
        q = squares[end] - squares[self.starts[family]]
        below = (active * slope - s) >> 1  # m s - S_m is even
        total = ((active * (slope - 1) ** 2 - q) >> 2) + (count - below) * slope
        return np.where(count > 0, total, 0)

    def base(self) -> np.ndarray:
        """Each family's summed leaf costs at 0: ``sum c~^2``."""
        return self._base

    @cached_property
    def _base(self) -> np.ndarray:
        return np.add.reduceat(self.noisy.astype(np.int64) ** 2, self.starts[:-1])

    def parent_tables(self, noisy: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Tables:
        """The parents' tables on their bounds ``lo..hi`` (within ``0..G``)."""
        if self._runs is not None:
            return Tables.concatenate(
                [run.parent_tables(noisy[a:b], lo[a:b], hi[a:b]) for a, b, run in self._runs]
            )
        families = np.arange(self.families, dtype=np.int64)
        width = hi - lo
        ranks = _ranges(lo, width) + 1
        # The leaves active at a window's first and last ranks; ranks in between are looked up
        # one by one only in the windows where they differ.
        first_end, first_active, first_s = self._active(families, lo + 1)
        last_end, _, _ = self._active(families, np.maximum(hi, lo + 1))
        active, s = np.repeat(first_active, width), np.repeat(first_s, width)
        moving = np.flatnonzero(np.repeat(first_end != last_end, width))
        if moving.size:
            owner = np.repeat(families, width)[moving]
            _, active[moving], s[moving] = self._active(owner, ranks[moving])
        merged = self._slope(ranks, active, s)
        prefix = self.smallest_sum(families, lo)
        return _parent_tables(noisy, lo, hi, merged, prefix, self.base())

    def split(self, values: np.ndarray) -> np.ndarray:
        """Each leaf's value when family f holds ``values[f]`` (the greedy merge's split): every
        leaf takes its units below the family's ``values[f]``-th slope s, and the leaves whose
        next slope is s take one more each, in child order, until the family is full (a family
        holding 0 takes nothing: s is then its smallest first slope)."""
        if self._runs is not None:
            return np.concatenate([run.split(values[a:b]) for a, b, run in self._runs])
        families = np.arange(self.families, dtype=np.int64)
        slope, _ = self.slope_at(families, np.maximum(values, 1))
        sizes = np.diff(self.starts)
        s = np.repeat(slope, sizes)
        out = np.maximum((s - self._first) >> 1, 0)  # both odd: the difference is even
        holders = self._first <= s
        left = values - np.add.reduceat(out, self.starts[:-1])
        turn = np.cumsum(holders)  # over the batch: compared with each family's own limit
        before = np.concatenate(([0], turn))[self.starts[:-1]]
        out += holders & (turn <= np.repeat(before + left, sizes))
        return out


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

    @cached_property
    def _runs(self) -> list[tuple[int, int, TableFamilies]] | None:
        """The families in cache-sized runs ``[f0, f1)`` (``BLOCK_ITEMS`` unit slopes), each
        with its children, or None if they make one run."""
        return _in_runs(
            self.tables.offsets[self.starts],
            self.starts,
            lambda rows, f0, n: TableFamilies(
                self.family[rows] - f0, self.tables.cells(rows.start, rows.stop), n
            ),
        )

    def merged_domain(self) -> tuple[np.ndarray, np.ndarray]:
        low = np.add.reduceat(self.tables.lo, self.starts[:-1])
        return low, low + np.add.reduceat(self.tables.width, self.starts[:-1])

    def parent_tables(self, noisy: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Tables:
        """The parents' tables on their bounds ``lo..hi`` met with the merged domains."""
        if self._runs is not None:
            return Tables.concatenate(
                [run.parent_tables(noisy[a:b], lo[a:b], hi[a:b]) for a, b, run in self._runs]
            )
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
        return self._split(values)

    def _split(self, values: np.ndarray) -> np.ndarray:
        """``split`` of totals within the merged domains: each family's ``values - low``
        smallest unit slopes, counted per child."""
        if self._runs is not None:
            return np.concatenate([run._split(values[a:b]) for a, b, run in self._runs])
        order, _, first = self._sorted
        low, _ = self.merged_domain()
        taken = order[_ranges(first[:-1], values - low)]
        return self.tables.lo + np.bincount(self._owner[taken], minlength=self.family.size)


# --- a whole tree, level by level (the reference runs and the benchmarks) ---------------------


@dataclass(frozen=True)
class TreeLevels:
    """A tree's nodes by depth, each level ordered by (parent's position above, node index), so
    that siblings are contiguous; ``parent_position[d]`` is each node's parent's position in
    level ``d - 1``.

    The *level layout* of per-node values (n x N) is size-major (N x n) with the nodes in level
    order: level ``d`` is the column slice ``span(d)``, and read row by row it lists its cells
    in family order for the level above (family = size x parents + parent's position)."""

    nodes: list[np.ndarray]
    parent_position: list[np.ndarray]

    def first_child(self, d: int) -> np.ndarray:
        """Where each node of level ``d - 1`` has its first child in level ``d``."""
        return self._first_children[d]

    def children(self, d: int) -> np.ndarray:
        """How many children each node of level ``d - 1`` has in level ``d``."""
        return self._children[d]

    @cached_property
    def _first_children(self) -> list[np.ndarray]:
        return [np.zeros(0, dtype=np.int64)] + [
            np.searchsorted(self.parent_position[d], np.arange(self.nodes[d - 1].size))
            for d in range(1, len(self.nodes))
        ]

    @cached_property
    def _children(self) -> list[np.ndarray]:
        return [np.zeros(0, dtype=np.int64)] + [
            np.diff(np.append(self._first_children[d], self.nodes[d].size))
            for d in range(1, len(self.nodes))
        ]

    @cached_property
    def _order(self) -> np.ndarray | None:
        """Every node in level order, or None if the nodes are numbered that way already."""
        order = np.concatenate(self.nodes)
        return None if (order == np.arange(order.size)).all() else order

    @cached_property
    def _starts(self) -> np.ndarray:
        return np.cumsum([0] + [level.size for level in self.nodes])

    def span(self, d: int) -> slice:
        """Level ``d``'s columns in the level layout."""
        return slice(int(self._starts[d]), int(self._starts[d + 1]))

    def to_levels(self, x: np.ndarray) -> np.ndarray:
        """Per-node values (n x N) in the level layout (N x n)."""
        return np.ascontiguousarray((x if self._order is None else x[self._order]).T)

    def by_node(self, y: np.ndarray) -> np.ndarray:
        """Values in the level layout (N x n) back per node (n x N)."""
        if self._order is None:
            return np.ascontiguousarray(y.T)
        out = np.empty(y.shape[::-1], dtype=y.dtype)
        out[self._order] = y.T
        return out

    @classmethod
    def of(cls, parent: np.ndarray) -> TreeLevels:
        nodes, positions = [np.array([0])], [np.array([-1])]
        position = np.full(parent.size, -1)
        position[0] = 0
        above_mark = np.zeros(parent.size + 1, dtype=bool)  # the last entry stands for -1
        while True:
            above = nodes[-1]
            above_mark[:] = False
            above_mark[above] = True
            kids = np.flatnonzero(above_mark[parent])
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


@dataclass(frozen=True)
class TreeProblem:
    """P_level with l2 over a whole tree, ready for passes with different windows. Values are
    in the ``TreeLevels`` level layout (N x n), so a level's cells are already in family order
    for the level above and no pass permutes cells. The cells that get windows, those of the
    internal levels below the root, are the columns ``windowed``; bounds are given for them
    only (the root and the leaves are on ``0..G``)."""

    noisy: np.ndarray  # (N, n), level layout
    groups: int
    levels: TreeLevels

    @classmethod
    def of(cls, noisy: np.ndarray, parent: np.ndarray, groups: int) -> TreeProblem:
        """The problem of per-node noisy histograms (n x N)."""
        levels = TreeLevels.of(parent)
        return cls(levels.to_levels(noisy.astype(np.int64, copy=False)), groups, levels)

    @property
    def depth(self) -> int:
        return len(self.levels.nodes) - 1

    @cached_property
    def windowed(self) -> slice:
        """The columns of the internal levels below the root."""
        return slice(1, self.levels.span(self.depth).start)

    def cells(self, x: np.ndarray, d: int, first: int = 0) -> np.ndarray:
        """Level ``d``'s cells of ``x`` (the level layout from column ``first`` on), flat in
        family order."""
        span = self.levels.span(d)
        return x[:, span.start - first : span.stop - first].ravel()

    @cached_property
    def _noisy_cells(self) -> list[np.ndarray]:
        return [self.cells(self.noisy, d) for d in range(self.depth + 1)]

    def _families(self, d: int) -> np.ndarray:
        """Each cell of level ``d`` (flat, family order): its family, i.e. its parent cell."""
        sizes, above = self.noisy.shape[0], self.levels.nodes[d - 1].size
        by_size = np.arange(sizes, dtype=np.int64)[:, None] * above
        return (by_size + self.levels.parent_position[d]).ravel()

    @cached_property
    def _family_of(self) -> list[np.ndarray]:
        return [np.empty(0, np.int64)] + [self._families(d) for d in range(1, self.depth + 1)]

    @cached_property
    def _leaves(self) -> LeafFamilies:
        families = self.noisy.shape[0] * self.levels.nodes[-2].size
        return LeafFamilies(self._family_of[-1], self._noisy_cells[-1], families)

    def solve(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, int]:
        """One pass with the bounds ``lo..hi`` of the windowed cells (N x windowed columns):
        the counts (level layout) and the root tables' optimum. Raises ``WindowTooNarrow`` if
        G is out of the root tables' reach."""
        sizes = self.noisy.shape[0]
        families: list[LeafFamilies | TableFamilies] = []
        below: Tables | None = None
        for d in reversed(range(self.depth)):
            if below is None:
                fam: LeafFamilies | TableFamilies = self._leaves
            else:
                parents = sizes * self.levels.nodes[d].size
                fam = TableFamilies(self._family_of[d + 1], below, parents)
            families.append(fam)
            here = self._noisy_cells[d]
            if d > 0:
                bounds = self.cells(lo, d, first=1), self.cells(hi, d, first=1)
            else:
                bounds = cell_bounds(here, self.groups, None)
            below = fam.parent_tables(here, *bounds)
        assert below is not None
        root = [below.cost_table(j) for j in range(sizes)]
        counts = np.zeros(self.noisy.shape, dtype=np.int64)
        counts[:, 0] = solve_root(root, self.groups)
        lower = sum(t.value(int(v)) for t, v in zip(root, counts[:, 0], strict=True))
        for d, fam in zip(range(self.depth), reversed(families), strict=True):
            split = fam.split(self.cells(counts, d))
            counts[:, self.levels.span(d + 1)] = split.reshape(sizes, -1)
        return counts, int(lower)


def window_centres(problem: TreeProblem) -> np.ndarray:
    """Where ``dp_release`` centres its l2 windows (the windowed cells of ``problem``): the
    consistent least-squares estimate with leaf cells that come out negative held at 0 and the
    estimate redone (active-set rounds, until no free leaf cell is negative or after
    ``ACTIVE_SET_ROUNDS``), rounded. Leaves pinned at 0 lift their ancestors as non-negativity
    lifts the exact optimum, so the windows of the whole tree sit near it; the certificate
    fixes what this misses."""
    estimate = _PinnedLeastSquares.of(problem)
    for _ in range(ACTIVE_SET_ROUNDS):
        if not estimate.pin_negative_leaves():
            break
    internal = [np.zeros((problem.noisy.shape[0], 0)), *estimate.estimate[1:]]
    return np.rint(np.concatenate(internal, axis=1)).astype(np.int64)


@dataclass(kw_only=True)
class _PinnedLeastSquares:
    """The least-squares estimate (reals) of a tree's cells that is consistent and sums to G at
    the root, ignoring integrality and non-negativity except that pinned leaf cells are held
    at 0: the usual two passes for equal-variance tree measurements (children sums combined
    with a node's own measurement by inverse variance bottom-up, differences handed down in
    proportion to variance; a pinned cell has variance 0).

    A leaf family's free leaves all get the same shift from their noisy values, so the ones
    that come out negative are its smallest: the pinned leaves of a family are always the end
    of its noisy values sorted largest first, and the family enters the estimate only through
    where its free leaves end. A round costs a few operations per internal cell and per leaf
    family, plus a binary search in each family that pins more leaves."""

    problem: TreeProblem
    noisy: list[np.ndarray]  # per level above the leaves, (N, nodes), float
    leaves: np.ndarray  # each leaf family's noisy values, largest first (flat)
    running: np.ndarray  # their running sums, from 0
    starts: np.ndarray  # where each leaf family starts in ``leaves`` (length families + 1)
    free_end: np.ndarray  # where each leaf family's free leaves end in ``leaves``
    free_sum: np.ndarray  # per leaf family (flat): the free leaves' noisy values summed
    free_count: np.ndarray  # per leaf family (flat): how many leaves are free, float
    smallest: np.ndarray  # per leaf family (flat): its smallest free noisy value (inf: none)
    estimate: list[np.ndarray]  # per level above the leaves, (N, nodes)
    shift: np.ndarray  # per leaf family (flat): what every free leaf adds to its noisy value

    @classmethod
    def of(cls, problem: TreeProblem) -> _PinnedLeastSquares:
        levels, family = problem.levels, problem._leaves
        noisy = [problem.noisy[:, levels.span(d)].astype(np.float64) for d in range(problem.depth)]
        leaves = family.largest_first()
        starts = family.starts
        running = np.concatenate(([0], np.cumsum(leaves)))
        count = np.diff(starts)
        smallest = np.where(count > 0, leaves[starts[1:] - 1], np.inf)
        out = cls(
            problem=problem,
            noisy=noisy,
            leaves=leaves,
            running=running,
            starts=starts,
            free_end=starts[1:].copy(),
            free_sum=(running[starts[1:]] - running[starts[:-1]]).astype(np.float64),
            free_count=count.astype(np.float64),
            smallest=smallest.astype(np.float64),
            estimate=[],
            shift=np.zeros(0),
        )
        out.solve()
        return out

    def solve(self) -> None:
        """The estimate of every level above the leaves, and the leaves' shifts."""
        levels, depth = self.problem.levels, self.problem.depth
        shape = self.noisy[-1].shape
        sums, spread = self.free_sum.reshape(shape), self.free_count.reshape(shape)
        estimate: list[np.ndarray] = [np.empty(0)] * depth
        variance: list[np.ndarray] = [np.empty(0)] * depth
        below = [(sums, spread)] * (depth + 1)  # per level: its nodes' children's sums, spread
        for d in reversed(range(depth)):
            if d < depth - 1:
                first = levels.first_child(d + 1)
                sums = np.add.reduceat(estimate[d + 1], first, axis=1)
                spread = np.add.reduceat(variance[d + 1], first, axis=1)
                below[d + 1] = sums, spread
            # own measurement (variance 1) against the children's sum (variance ``spread``)
            weight = 1 + spread
            estimate[d] = (spread * self.noisy[d] + sums) / weight
            variance[d] = spread / weight
        # every node takes its share of its parent's gap (the root's: G less its sum) in
        # proportion to its variance: ``gap / spread`` per parent
        root = variance[0].sum()
        per_variance = (self.problem.groups - estimate[0].sum()) / root if root > 0 else 0.0
        estimate[0] += variance[0] * per_variance
        for d in range(1, depth):
            sums, spread = below[d]
            per_variance = (estimate[d - 1] - sums) / np.where(spread > 0, spread, 1)
            estimate[d] += variance[d] * np.repeat(per_variance, levels.children(d), axis=1)
        self.shift = (estimate[-1].ravel() - self.free_sum) / np.maximum(self.free_count, 1)
        self.estimate = estimate

    def pin_negative_leaves(self) -> bool:
        """Pin the free leaf cells whose estimate is below -1/2 and redo the estimate; whether
        there were any."""
        threshold = -0.5 - self.shift  # free leaves below it come out negative
        pinning = np.flatnonzero(self.smallest < threshold)
        if pinning.size == 0:
            return False
        start = self.starts[pinning]
        end = _first_below(self.leaves, start, self.free_end[pinning], threshold[pinning])
        self.free_end[pinning] = end
        self.free_sum[pinning] = self.running[end] - self.running[start]
        self.free_count[pinning] = end - start
        self.smallest[pinning] = np.where(end > start, self.leaves[end - 1], np.inf)
        self.solve()
        return True


def _first_below(
    values: np.ndarray, lo: np.ndarray, hi: np.ndarray, threshold: np.ndarray
) -> np.ndarray:
    """For runs ``values[lo[i]:hi[i]]`` sorted largest first: where each run first falls below
    ``threshold[i]`` (``hi[i]`` if it never does), by one vectorised binary search."""
    while (open_ := lo < hi).any():
        mid = (lo + hi) // 2
        above = values[np.where(open_, mid, 0)] >= threshold
        lo = np.where(open_ & above, mid + 1, lo)
        hi = np.where(open_ & ~above, mid, hi)
    return lo
