"""Post-processing of the cumulative group-size release (M_c, the paper's Model 2).

Pure numpy; nothing here knows about Spark.

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

**Exactness.** Each family's integer program is solved exactly (columns indexed 0..m-1 below).

*One chain* (the root, and every child on its own). For real targets ``t`` let ``h*`` be the
least-squares isotonic regression, ``h*_j = max_{a<=j} min_{b>=j} mean(t_a..t_b)`` (the
max-min formula). Write an integer chain in ``0..cap`` as the sum over levels ``l = 0..cap-1``
of the indicators of its nested upper sets ``{j : H_j > l}``; its cost is a constant plus, per
level, ``sum_{j in U_l} ((l+1-t_j)^2 - (l-t_j)^2) = 2 sum_{j in U_l} (l + 1/2 - t_j)``. Each
term is minimised over upper sets by ``{j : h*_j > l + 1/2}`` (the threshold property of
isotonic regression; ``{j : h*_j >= l + 1/2}`` is another minimiser), and these sets are
nested, so all levels are minimised at once: ``H_j = clip(ceil(h*_j - 1/2), 0, cap)`` is an
integer optimum, and so is the rounding half up, ``clip(floor(h*_j + 1/2), 0, cap)``.
``_integer_isotonic`` evaluates either in integer arithmetic (rounding is monotone, so it
commutes with max-min).

*A family* is a convex-cost integer flow. Hubs ``0..m``: hub ``j < m`` is the source of the
parent's ``x_j = P_j - P_{j-1}`` groups of size j, hub ``m`` the sink taking ``P_{m-1}``;
child c is a path ``v[c,0] -> ... -> v[c,m-1] -> sink`` whose arc j carries ``H[c,j]`` at cost
``(H[c,j] - H~[c,j])^2`` (the last arc has capacity ``cap^c``), fed by arcs hub j ->
``v[c,j]`` carrying ``H[c,j] - H[c,j-1] >= 0``. Linearised at the integers (a unit arc per
integer, marginal cost ``2(H - H~) + 1`` up, ``2(H~ - H) + 1`` down) this is a min-cost flow,
whose integer flows are exactly the family's feasible points and whose optimality
certificate is the absence of a negative-cost cycle in the residual network. A residual path
between two hubs runs along one child: up from hub a to hub b raises ``H[c,a..b-1]`` by one
(needs ``H[c,b-1] < H[c,b]``, with ``H[c,m] = cap^c``), down from b to a lowers them (needs
``H[c,a-1] < H[c,a]``, with ``H[c,-1] = 0``); ``_hub_graph`` keeps the cheapest child per
ordered hub pair, which loses no cycle or path cost. ``solve_cumulative_family``:

1. starts from an integer optimum of each child for targets ``H~ + shift`` (one chain,
   above; rounded half down or half up, child by child): every child minimises its own cost
   minus ``2 shift . H`` over its own chains, so no sum-preserving move (no residual cycle)
   lowers the cost: the flow is optimal for the column sums it has. The shift (multiples of
   1/2, where many children tie, so the chains are computed exactly in integers) and the
   children rounded up only steer those sums near ``P`` (a few Newton steps); any choice is
   valid;
2. runs successive shortest paths: while a hub has excess (its columns sum too low), send one
   unit along a shortest residual path (Bellman-Ford on the ``m + 1`` hubs, ties to the
   fewest hops) from any hub in excess to the nearest hub in deficit. One unit along a
   shortest path creates no negative cycle (reduced costs stay non-negative under the
   distances), and a fewest-hop shortest path never uses a child twice on overlapping columns
   (that walk would split into a cheaper or shorter one plus a non-negative cycle), so each step
   changes every ``H`` by at most one and costs exactly the path length. Each step lowers the
   total excess by one; if no deficit hub is reachable, no feasible point exists
   (``ValueError``);
3. checks at the end, by Bellman-Ford on the balanced flow, that no negative cycle is left.

Costs are integers held exactly in float64 (they stay far below 2^53).

Balanced and without a negative residual cycle, the flow is the integer optimum. The top-down
sequence as a whole is *not* the global optimum of Model 2 over the tree (a parent is fixed
before its children are seen), exactly as in TopDown; every family step is.
"""

from __future__ import annotations

import functools

import numpy as np

from censusdp_spark.group_sizes.solvers.tree import GroupTree

_SHIFT_DENOMINATOR = 2  # the start's column shifts are multiples of 1/2 (ties abound)
_SHIFT_ROUNDS = 4  # Newton steps on the start's column sums, at most


def to_cumulative(counts: np.ndarray) -> np.ndarray:
    """``H_j = sum_{i<=j} x_i`` for ``j < N`` (the last, ``G``, is public and left out)."""
    return np.cumsum(counts, axis=-1)[..., :-1]


def from_cumulative(cumulative: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Inverse of ``to_cumulative`` given each row's number of groups."""
    full = np.concatenate([cumulative, np.asarray(groups)[..., None]], axis=-1)
    return np.diff(full, axis=-1, prepend=0)


@functools.cache
def _spans(m: int) -> tuple[np.ndarray, np.ndarray]:
    """``ordered[a, b]`` (a <= b) and ``span[a, b]``, the number of columns a..b (1 if a > b)."""
    length = np.arange(m)[None, :] - np.arange(m)[:, None] + 1
    return length >= 1, np.maximum(length, 1)


def _integer_isotonic(
    scaled_targets: np.ndarray, scale: int, caps: np.ndarray, halves_up: bool = False
) -> np.ndarray:
    """Per row, an integer optimum of ``sum_j (H_j - scaled_targets_j / scale)^2`` over the
    chains ``0 <= H_0 <= ... <= H_{m-1} <= caps[row]`` (exact: integer arithmetic only); the
    isotonic fit rounded half down, or half up (another optimum when they differ)."""
    k, m = scaled_targets.shape
    ordered, span = _spans(m)
    prefix = np.zeros((k, m + 1), dtype=np.int64)
    np.cumsum(scaled_targets, axis=1, out=prefix[:, 1:])
    sums = prefix[:, None, 1:] - prefix[:, :-1, None]  # [c, a, b]: sum of a..b
    # floor(mean + 1/2) or ceil(mean - 1/2) with mean = sums / (scale * span), in integers
    if halves_up:
        rounded = (2 * sums + scale * span) // (2 * scale * span)
    else:
        rounded = -((scale * span - 2 * sums) // (2 * scale * span))
    limit = np.iinfo(np.int64).max
    rounded[:, ~ordered] = limit
    lowest_after = np.minimum.accumulate(rounded[:, :, ::-1], axis=2)[:, :, ::-1]
    lowest_after[:, ~ordered] = -limit
    return np.clip(lowest_after.max(axis=1), 0, caps[:, None])  # max_{a<=j} min_{b>=j}


def _hub_excess(missing: np.ndarray) -> np.ndarray:
    """Per hub ``0..m`` (last axis), the units it must still send (negative: receive) when the
    column sums lack ``missing`` (last axis ``m``)."""
    excess = np.zeros((*missing.shape[:-1], missing.shape[-1] + 1), dtype=np.int64)
    excess[..., :-1] += missing
    excess[..., 1:] -= missing
    return excess


def _newton_shift(chains: np.ndarray, caps: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """The column shift of the targets that would add ``missing`` to the column sums if every
    child's pooled blocks (runs of equal values strictly inside ``0..cap``) kept their shape,
    each block moving by the mean shift of its columns (least squares if singular)."""
    free = (chains > 0) & (chains < caps[:, None])
    starts = np.ones(chains.shape, dtype=bool)
    starts[:, 1:] = chains[:, 1:] != chains[:, :-1]
    block = np.cumsum(starts, axis=1)
    same = (block[:, :, None] == block[:, None, :]) & free[:, :, None]
    jacobian = (same / np.maximum(same.sum(axis=2, keepdims=True), 1)).sum(axis=0)
    step = np.linalg.lstsq(jacobian, missing.astype(np.float64), rcond=None)[0]
    unexplained = missing - jacobian @ step  # needs blocks to split: shift those columns apart
    return step + unexplained / np.maximum(free.sum(axis=0), 1)


def _shifted_start(noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each child's own optimum for the targets ``noisy + shift``, the column shift chosen by a
    few Newton steps to bring the column sums close to ``parent`` (the least excess is kept).
    Where a child's optimum is tied (half-way targets), the first children of the family take
    the upper one, as many as bring the sums closest to ``parent``."""
    k, m = noisy.shape
    scaled = noisy * _SHIFT_DENOMINATOR
    shift = np.zeros(m, dtype=np.int64)
    tried: list[tuple[int, np.ndarray]] = []
    for _ in range(_SHIFT_ROUNDS):
        lower = _integer_isotonic(scaled + shift, _SHIFT_DENOMINATOR, caps)
        upper = _integer_isotonic(scaled + shift, _SHIFT_DENOMINATOR, caps, halves_up=True)
        raised = np.zeros((k + 1, m), dtype=np.int64)  # [i]: sums with children < i raised
        np.cumsum(upper - lower, axis=0, out=raised[1:])
        excess = np.maximum(_hub_excess(parent - lower.sum(axis=0) - raised), 0).sum(axis=1)
        first = int(excess.argmin())
        chains = np.concatenate([upper[:first], lower[first:]])
        tried.append((int(excess[first]), chains))
        if excess[first] == 0:
            break
        missing = parent - chains.sum(axis=0)
        step = _newton_shift(chains, caps, missing)
        shift += np.rint(step * _SHIFT_DENOMINATOR).astype(np.int64)
    return min(tried, key=lambda excess_chains: excess_chains[0])[1]


def _hub_graph(
    noisy: np.ndarray, caps: np.ndarray, cumulative: np.ndarray
) -> tuple[list[list[float]], np.ndarray]:
    """``cost[a][b]``: the cheapest change in cost of moving one unit from hub a to hub b
    along a single child (inf if no child can), and ``child[a, b]``, that child."""
    k, m = cumulative.shape
    twice_gap = 2 * (cumulative - noisy)
    prefix = np.zeros((2, k, m + 1))
    np.cumsum(twice_gap + 1, axis=1, out=prefix[0, :, 1:])  # raising H[c, 0..j-1]
    np.cumsum(1 - twice_gap, axis=1, out=prefix[1, :, 1:])  # lowering H[c, 0..j-1]
    up, down = prefix
    bounds = np.empty((k, m + 2), dtype=np.int64)
    bounds[:, 0], bounds[:, 1:-1], bounds[:, -1] = 0, cumulative, caps
    room = bounds[:, 1:] > bounds[:, :-1]  # [c, b]: the move may end at hub b
    rising = np.arange(m + 1)[:, None] < np.arange(m + 1)[None, :]
    cost = np.where(rising, up[:, None, :] - up[:, :, None], down[:, :, None] - down[:, None, :])
    cost = np.where(room[:, None, :] & (rising | rising.T), cost, np.inf)
    cost = np.concatenate([cost, np.full((1, m + 1, m + 1), np.inf)])  # defined when k = 0
    return cost.min(axis=0).tolist(), cost.argmin(axis=0)


def _shortest_paths(cost: list[list[float]], sources: list[bool]) -> tuple[list[float], list[int]]:
    """Bellman-Ford from the ``sources`` hubs: distances and predecessors (-1 at a path's
    start), each path a fewest-hop one among the shortest. Raises if a negative cycle exists."""
    n = len(cost)
    dist = [0.0 if source else np.inf for source in sources]
    pred = [-1] * n
    for _ in range(n):
        reached = dist.copy()
        for a in range(n):
            if dist[a] < np.inf:
                for b, step in enumerate(cost[a]):
                    if dist[a] + step < reached[b]:
                        reached[b], pred[b] = dist[a] + step, a
        if reached == dist:
            return dist, pred
        dist = reached
    raise RuntimeError("cumulative family: negative cycle in the residual network")


def _send_one_unit(cumulative: np.ndarray, child: np.ndarray, pred: list[int], end: int) -> None:
    """Apply, in place, the path ending at hub ``end`` given by ``pred``: one unit per hop."""
    hub = end
    while pred[hub] >= 0:
        origin = pred[hub]
        c = child[origin, hub]
        if origin < hub:
            cumulative[c, origin:hub] += 1
        else:
            cumulative[c, hub:origin] -= 1
        hub = origin


def solve_cumulative_family(
    noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray | None
) -> np.ndarray:
    """Released cumulative counts (k x J) of one family (or of the root, ``parent=None``):
    monotone chains in ``0..caps[c]`` summing to ``parent`` column by column, at the least
    squared distance to ``noisy``. Raises ValueError if no such chains exist."""
    noisy = np.asarray(noisy, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64)
    if parent is None:
        return _integer_isotonic(noisy, 1, caps)
    parent = np.asarray(parent, dtype=np.int64)
    cumulative = _shifted_start(noisy, caps, parent)
    while True:
        excess = _hub_excess(parent - cumulative.sum(axis=0)).tolist()
        cost, child = _hub_graph(noisy, caps, cumulative)
        if max(excess) <= 0:
            _shortest_paths(cost, [True] * len(cost))  # the optimality certificate
            return cumulative
        dist, pred = _shortest_paths(cost, [e > 0 for e in excess])
        arrival = [d if e < 0 else np.inf for d, e in zip(dist, excess, strict=True)]
        end = arrival.index(min(arrival))
        if arrival[end] == np.inf:
            raise ValueError("no monotone cumulative counts meet the parent and the groups")
        _send_one_unit(cumulative, child, pred, end)


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
