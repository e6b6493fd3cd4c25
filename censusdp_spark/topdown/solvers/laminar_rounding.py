"""Exact controlled rounding when every child's marginal groups are nested (a laminar family).

The problem is the one in ``rounding``: choose round-ups ``b_{c,j}`` in ``{0, 1}`` on the
fractional entries, meeting the cell sums (``column_need``) and child sums (``row_need``) that
are given, minimising ``sum_q sum_c sum_g |s_{q,c,g} - F_{q,c,g}|`` where ``s`` is the number of
round-ups in marginal cell ``g`` of child ``c`` and ``F`` the sum of its fractional parts.

Why a network. Restrict every query's marginal cells to child ``c``'s fractional entries. When
these sets are laminar (any two are disjoint or one contains the other), they form a tree per
child: leaves are the entries, each set's parent is the smallest set strictly containing it, and
the child's root sits on top. Rounding is then a flow: each constrained cell sends its
``column_need`` units, one per round-up, to leaves ``(c, j)`` (capacity 1), up child ``c``'s tree
to its root, and on to a common sink (or to a sink of its own taking exactly ``row_need[c]``).
At the root, where the cells are unconstrained, a common source feeds every cell. The flow
through the arc above set ``g`` is ``s_{q,c,g}``, and the cost ``|s - F|`` on integers is convex
with integer breakpoints. The constraint matrix of a network is totally unimodular, so such a
convex-cost flow has an integral optimum, and an integral flow is optimal, among all roundings,
exactly when its residual graph (unit steps, marginal costs ``|s + 1 - F| - |s - F|`` up an arc,
``|s - 1 - F| - |s - F|`` down) has no negative cycle (Ahuja, Magnanti & Orlin, *Network
Flows*, ch. 14).

Method: cycle cancelling on a condensed graph. A residual cycle alternates between cells (plus
the common sink or source) and paths inside one child's tree: enter at a leaf ``u`` whose entry
is not rounded up, leave at a leaf ``v`` whose entry is, or pass through the root to or from the
sink. The cheapest way through child ``c`` between two condensed nodes is the tree path, whose
cost is the change in ``c``'s deviation when ``b_{c,u}`` goes up and ``b_{c,v}`` down. So the
condensed graph on the ``n`` cells (plus one sink or source) with arc costs
``min_c cost_c(u -> v)`` has a negative cycle if and only if the full residual graph has one:
a negative full cycle costs at least its condensed image, and a negative condensed cycle expands
to a negative closed walk, which contains a negative simple cycle. Starting from a feasible
rounding (the largest fractions of each constrained line, or a maximum flow when both sums are
given), each step applies negative cycles of the condensed graph:

* first, as a shortcut, negative two-arc cycles, most negative first, each through two children
  that no cycle of this step has touched (so its cost is exact);
* when there are none, a negative cycle found with Karp's minimum-mean-cycle algorithm. If no
  child's tree is crossed twice by overlapping paths, the expanded walk is a simple cycle and
  applying it lowers the objective by exactly its cost. Otherwise the two overlapping passes
  through a child are swapped at the shared tree node, which splits the cycle into two smaller
  ones whose costs sum to at most the original (a tree path never costs more than a walk
  between the same leaves, by convexity); the more negative one is kept and the rule repeats.

The objective falls strictly at every step, so the method stops; it stops when Karp finds no
cycle with a mean cost per arc below ``-IMPROVEMENT_TOLERANCE``, so no cycle of the full
residual graph lowers the objective by more than round-off: the rounding is optimal.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sparse
from scipy.sparse.csgraph import maximum_flow

IMPROVEMENT_TOLERANCE = 1e-12
"""Cycles whose mean cost per arc is above ``-IMPROVEMENT_TOLERANCE`` count as round-off."""

_ROOT = -1
"""The tree node above all of a child's marginal cells (any bitmask is >= 0)."""


def is_laminar(marginals: tuple[np.ndarray, ...], moving: np.ndarray) -> bool:
    """Whether, for every child, the queries' marginal cells restricted to its moving entries
    are pairwise disjoint or nested."""
    children, cells = np.nonzero(moving)
    groups = [np.asarray(m, dtype=np.int64)[cells] for m in marginals]
    sizes = [int(g.max(initial=0)) + 1 for g in groups]
    for first in range(len(groups)):
        a = children * sizes[first] + groups[first]
        count_a = _multiplicity(a, moving.shape[0] * sizes[first])
        for second in range(first + 1, len(groups)):
            b = children * sizes[second] + groups[second]
            count_b = _multiplicity(b, moving.shape[0] * sizes[second])
            common = _multiplicity(
                a * sizes[second] + groups[second], moving.shape[0] * sizes[first] * sizes[second]
            )
            if np.any((common != count_a) & (common != count_b)):
                return False
    return True


def _multiplicity(keys: np.ndarray, bound: int) -> np.ndarray:
    """How often each entry's key occurs; keys lie in ``[0, bound)``."""
    if bound <= max(1 << 16, 8 * keys.size):
        return np.bincount(keys, minlength=bound)[keys]
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return counts[inverse]


def round_laminar(
    marginals: tuple[np.ndarray, ...],
    fraction: np.ndarray,
    moving: np.ndarray,
    column_need: np.ndarray | None,
    row_need: np.ndarray | None,
) -> np.ndarray:
    """Optimal 0/1 round-ups (int64, shape ``(k, n)``) for a laminar family (see the module).

    ``moving`` marks the fractional entries; round-ups are 0 elsewhere. At least one of
    ``column_need`` and ``row_need`` is given; without ``column_need`` (the root) there must be
    one child. Raises ``ValueError`` if no rounding meets both sums.
    """
    network = _Network(marginals, fraction, moving, column_need, row_need)
    b = _start(fraction, moving, column_need, row_need)
    costs = np.full((b.shape[0], network.size, network.size), np.inf)
    network.update_costs(costs, b, np.arange(b.shape[0]))
    while True:
        cheapest, child = network.condensed(costs)
        changed = network.cancel_two_cycles(cheapest, child, b)
        if not changed:
            cycle = _negative_cycle(cheapest)
            if cycle is None:
                return b
            arcs = [(u, v, int(child[u, v])) for u, v in zip(cycle[:-1], cycle[1:], strict=True)]
            arcs, gain = network.untangle(arcs, costs)
            if gain >= -IMPROVEMENT_TOLERANCE:
                return b
            changed = network.apply(arcs, b)
        network.update_costs(costs, b, np.array(sorted(changed)))


class _Network:
    """The per-child trees of one family and the costs of moving a round-up through them.

    Condensed nodes are the ``n`` cells, then one extra node: the common sink ``T`` when child
    sums are free, or the common source ``S`` at the root, when cell sums are free. Marginal
    cells of all queries are numbered together: ``member`` (``n x M``) says which cells each
    contains.
    """

    def __init__(
        self,
        marginals: tuple[np.ndarray, ...],
        fraction: np.ndarray,
        moving: np.ndarray,
        column_need: np.ndarray | None,
        row_need: np.ndarray | None,
    ) -> None:
        k, n = fraction.shape
        if column_need is None and (row_need is None or k != 1):
            raise ValueError("without cell sums there must be one child with a fixed total")
        self.n = n
        self.moving = moving
        self.sink = row_need is None
        self.source = column_need is None
        self.size = n + int(self.sink or self.source)
        self.maps = [np.asarray(m, dtype=np.int64) for m in marginals]
        numbers = []
        offset = 0
        for cell_to_marginal in self.maps:
            _, number = np.unique(cell_to_marginal, return_inverse=True)
            numbers.append(number + offset)
            offset += int(number.max()) + 1
        self.marginal_of = np.stack(numbers)
        self.member = np.zeros((n, offset))
        for number in numbers:
            self.member[np.arange(n), number] = 1.0
        self.target = fraction @ self.member
        self.split = np.stack([m[:, None] != m[None, :] for m in self.maps]).astype(float)
        self._same_group: list[list[int]] | None = None

    def update_costs(self, costs: np.ndarray, b: np.ndarray, rows: np.ndarray) -> None:
        """Set ``costs[c, u, v]``, for the children ``rows``, to the change in child ``c``'s
        deviation when a round-up moves in at condensed node ``u`` and out at ``v`` (``inf``
        where that move is not possible)."""
        n = self.n
        ups = b[rows]
        # For integer s, |s + 1 - F| - |s - F| = clip(2 (s - F) + 1, -1, 1), and going down
        # is the mirror image.
        excess = 2.0 * (ups @ self.member - self.target[rows])
        up = np.clip(excess + 1.0, -1.0, 1.0)[:, self.marginal_of]
        down = np.clip(1.0 - excess, -1.0, 1.0)[:, self.marginal_of]
        pair = np.einsum("rqu,quv->ruv", up, self.split) + np.einsum(
            "rqv,quv->ruv", down, self.split
        )
        can_up = self.moving[rows] & (ups == 0)
        can_down = ups == 1
        costs[rows, :n, :n] = np.where(can_up[:, :, None] & can_down[:, None, :], pair, np.inf)
        if self.sink:
            costs[rows, :n, n] = np.where(can_up, up.sum(axis=1), np.inf)
            costs[rows, n, :n] = np.where(can_down, down.sum(axis=1), np.inf)

    def condensed(self, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cheapest arc between condensed nodes and the child it goes through (-1: a free arc
        between the source and a cell)."""
        child = costs.argmin(axis=0)
        cheapest = costs.min(axis=0)
        if self.source:
            cheapest[self.n, : self.n] = 0.0
            cheapest[: self.n, self.n] = 0.0
            child[self.n, : self.n] = -1
            child[: self.n, self.n] = -1
        return cheapest, child

    def cancel_two_cycles(self, cheapest: np.ndarray, child: np.ndarray, b: np.ndarray) -> set[int]:
        """Apply negative two-arc cycles through distinct children, most negative first; return
        the children changed.

        The two arcs of such a cycle always use two different children (one must hold the
        round-up the other takes), and a cycle through children untouched so far changes the
        deviation by exactly its cost.
        """
        loop = cheapest + cheapest.T
        first, second = np.nonzero(loop < -IMPROVEMENT_TOLERANCE)
        first, second = first[first < second], second[first < second]
        changed: set[int] = set()
        for index in np.argsort(loop[first, second], kind="stable"):
            u, v = int(first[index]), int(second[index])
            there, back = int(child[u, v]), int(child[v, u])
            if there in changed or back in changed:
                continue
            changed |= self.apply([(u, v, there), (v, u, back)], b)
        return changed

    def untangle(
        self, arcs: list[tuple[int, int, int]], costs: np.ndarray
    ) -> tuple[list[tuple[int, int, int]], float]:
        """A cycle whose passes through each child's tree are node-disjoint, costing no more
        than ``arcs`` if ``arcs`` is negative; and its cost (the exact change in deviation)."""
        while True:
            overlap = self._overlapping_passes(arcs)
            if overlap is None:
                return arcs, _cycle_cost(arcs, costs)
            first, second = overlap
            c = arcs[first][2]
            outer = [*arcs[:first], (arcs[first][0], arcs[second][1], c), *arcs[second + 1 :]]
            inner = [*arcs[first + 1 : second], (arcs[second][0], arcs[first][1], c)]
            candidates = [[arc for arc in cycle if arc[0] != arc[1]] for cycle in (outer, inner)]
            arcs = min(
                (cycle for cycle in candidates if cycle),
                key=lambda cycle: _cycle_cost(cycle, costs),
            )

    def _overlapping_passes(self, arcs: list[tuple[int, int, int]]) -> tuple[int, int] | None:
        """Positions of two arcs through the same child whose tree paths share a node."""
        through = [c for _, _, c in arcs if c >= 0]
        if len(set(through)) == len(through):
            return None
        seen: dict[int, list[tuple[int, set[int]]]] = {}
        for position, (u, v, c) in enumerate(arcs):
            if c < 0:
                continue
            nodes = self._tree_path(c, u, v)
            for earlier, earlier_nodes in seen.get(c, []):
                if nodes & earlier_nodes:
                    return earlier, position
            seen.setdefault(c, []).append((position, nodes))
        return None

    def _tree_path(self, c: int, u: int, v: int) -> set[int]:
        """The tree nodes (marginal cells as bitmasks of child ``c``'s moving entries, or
        ``_ROOT``) on the path from condensed node ``u`` to ``v`` through child ``c``."""
        if self._same_group is None:
            self._same_group = [[_bitmask(m == m[j]) for j in range(self.n)] for m in self.maps]
        mask = _bitmask(self.moving[c])
        if u >= self.n or v >= self.n:
            leaf = v if u >= self.n else u
            return {groups[leaf] & mask for groups in self._same_group} | {_ROOT}
        nodes: set[int] = set()
        common = []
        for groups, cell_to_marginal in zip(self._same_group, self.maps, strict=True):
            if cell_to_marginal[u] == cell_to_marginal[v]:
                common.append(groups[u] & mask)
            else:
                nodes.add(groups[u] & mask)
                nodes.add(groups[v] & mask)
        nodes.add(min(common, key=int.bit_count) if common else _ROOT)
        return nodes

    def apply(self, arcs: list[tuple[int, int, int]], b: np.ndarray) -> set[int]:
        """Move the round-ups along an untangled cycle; return the children changed."""
        changed = set()
        for u, v, c in arcs:
            if c < 0:
                continue
            changed.add(c)
            if u < self.n:
                b[c, u] = 1
            if v < self.n:
                b[c, v] = 0
        return changed


def _bitmask(flags: np.ndarray) -> int:
    return sum(1 << int(j) for j in np.flatnonzero(flags))


def _cycle_cost(arcs: list[tuple[int, int, int]], costs: np.ndarray) -> float:
    return float(sum(costs[c, u, v] for u, v, c in arcs if c >= 0))


def _negative_cycle(cheapest: np.ndarray) -> list[int] | None:
    """A negative cycle ``[v0, v1, ..., v0]`` of the dense graph, or None if there is none.

    Karp's algorithm: ``walk[r, v]`` is the cheapest walk of ``r`` arcs ending at ``v`` (from
    anywhere), and ``min_v max_r (walk[N, v] - walk[r, v]) / (N - r)`` is the minimum mean cost
    of a cycle. If it is negative, the cheapest ``N``-arc walk to the minimising node is cheaper
    than every shorter walk to it, so the cycles it contains cost less than nothing in total;
    the cheapest of them is returned.
    """
    size = cheapest.shape[0]
    walk = np.zeros((size + 1, size))
    came_from = np.zeros((size + 1, size), dtype=np.int64)
    columns = np.arange(size)
    for arcs in range(1, size + 1):
        candidates = walk[arcs - 1][:, None] + cheapest
        came_from[arcs] = candidates.argmin(axis=0)
        walk[arcs] = candidates[came_from[arcs], columns]
    with np.errstate(invalid="ignore"):
        mean = ((walk[size] - walk[:size]) / (size - np.arange(size))[:, None]).max(axis=0)
    mean = np.where(np.isfinite(walk[size]), mean, np.inf)
    end = int(np.argmin(mean))
    if not mean[end] < -IMPROVEMENT_TOLERANCE:
        return None
    nodes = [end]
    for arcs in range(size, 0, -1):
        nodes.append(int(came_from[arcs][nodes[-1]]))
    nodes.reverse()
    best: list[int] | None = None
    best_cost = 0.0
    stack: list[int] = []
    position: dict[int, int] = {}
    for node in nodes:
        if node in position:
            start = position[node]
            cycle = [*stack[start:], node]
            cost = float(sum(cheapest[a, b] for a, b in zip(cycle[:-1], cycle[1:], strict=True)))
            if cost < best_cost:
                best, best_cost = cycle, cost
            for dropped in stack[start + 1 :]:
                del position[dropped]
            del stack[start + 1 :]
        else:
            position[node] = len(stack)
            stack.append(node)
    return best


def _start(
    fraction: np.ndarray,
    moving: np.ndarray,
    column_need: np.ndarray | None,
    row_need: np.ndarray | None,
) -> np.ndarray:
    """A feasible rounding: the largest fractions of each cell (of the one child at the root),
    then, when child sums are given too, the fewest changes that meet them."""
    if column_need is None:
        assert row_need is not None
        return _largest(fraction.T, moving.T, row_need).T.copy()
    b = _largest(fraction, moving, column_need)
    if row_need is not None:
        _meet_row_sums(b, moving, row_need)
    return b


def _largest(fraction: np.ndarray, moving: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Round up the ``need[j]`` largest fractions of every column ``j``."""
    order = np.where(moving, fraction, -1.0)
    rank = np.empty_like(order, dtype=np.int64)
    np.put_along_axis(
        rank, np.argsort(-order, axis=0, kind="stable"), np.arange(order.shape[0])[:, None], 0
    )
    return (rank < need[None, :]).astype(np.int64)


def _meet_row_sums(b: np.ndarray, moving: np.ndarray, row_need: np.ndarray) -> None:
    """Move round-ups within columns, in place, until every child has ``row_need``.

    A maximum flow from the children with too many round-ups to those with too few, through
    ``child -> cell`` (give up a round-up) and ``cell -> child`` (take one) arcs of capacity 1,
    keeps every column sum. If a rounding meets both sums, the difference between it and ``b``
    is such a flow, so the maximum flow moves the whole excess.
    """
    k, n = b.shape
    excess = b.sum(axis=1) - row_need
    if not excess.any():
        return
    give_child, give_cell = np.nonzero(b == 1)
    take_child, take_cell = np.nonzero(moving & (b == 0))
    over, under = np.flatnonzero(excess > 0), np.flatnonzero(excess < 0)
    source, sink = k + n, k + n + 1
    tails = np.concatenate([np.full(over.size, source), give_child, k + take_cell, under])
    heads = np.concatenate([over, k + give_cell, take_child, np.full(under.size, sink)])
    capacity = np.concatenate(
        [excess[over], np.ones(give_child.size + take_child.size, np.int64), -excess[under]]
    )
    graph = sparse.csr_matrix(
        (capacity.astype(np.int32), (tails, heads)), shape=(k + n + 2, k + n + 2)
    )
    result = maximum_flow(graph, source, sink)
    if result.flow_value != int(excess[over].sum()):
        raise ValueError("x_hat: its sums do not match parent and child_totals together")
    flow = result.flow.tocsr()
    b[give_child, give_cell] -= np.asarray(flow[give_child, k + give_cell]).ravel()
    b[take_child, take_cell] += np.asarray(flow[k + take_cell, take_child]).ravel()
