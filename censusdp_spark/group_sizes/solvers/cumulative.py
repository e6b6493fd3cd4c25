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

**Exactness.** Each family's integer program is solved exactly (columns indexed 0..m-1 below).

*One chain* (the root, and every child on its own). For real targets ``t`` let ``h*`` be the
least-squares isotonic regression, ``h*_j = max_{a<=j} min_{b>=j} mean(t_a..t_b)`` (the
max-min formula). Write an integer chain in ``0..cap`` as the sum over levels ``l = 0..cap-1``
of the indicators of its nested upper sets ``{j : H_j > l}``; its cost is a constant plus, per
level, ``sum_{j in U_l} ((l+1-t_j)^2 - (l-t_j)^2) = 2 sum_{j in U_l} (l + 1/2 - t_j)``. Each
term is minimised over upper sets by ``{j : h*_j > l + 1/2}`` (the threshold property of
isotonic regression), and these sets are nested, so all levels are minimised at once:
``H_j = clip(ceil(h*_j - 1/2), 0, cap)`` is an integer optimum. ``_integer_isotonic``
evaluates it in integer arithmetic from the pooled blocks of ``h*`` (each block's sum and
length): for short chains by the max-min formula over all (a, b) at once (O(m^2) per chain,
vectorised over the children), for long ones from the blocks of scipy's pool-adjacent-
violators (O(m)), which are then *verified in integers* (block means non-decreasing, every
prefix of a block at or above its mean: the optimality conditions of isotonic regression)
and recomputed by an integer PAV in the rare case floating point pooled them wrongly.

*A family* is a convex-cost integer flow. Hubs ``0..m``: hub ``j < m`` is the source of the
parent's ``x_j = P_j - P_{j-1}`` groups of size j, hub ``m`` the sink taking ``P_{m-1}``;
child c is a path (a *rail*) ``v[c,0] -> ... -> v[c,m-1] -> hub m`` whose arc j carries
``H[c,j]`` at cost ``(H[c,j] - H~[c,j])^2`` (the last arc has capacity ``cap^c``), fed by
arcs hub j -> ``v[c,j]`` carrying ``x[c,j] = H[c,j] - H[c,j-1] >= 0``. Linearised at the
integers (marginal cost ``u = 2(H - H~) + 1`` up, ``2 - u`` down) this is a min-cost flow on
``m + 1 + k m`` nodes and ``4 k m`` arcs whose integer flows are exactly the family's feasible
points. The residual network: feeder up hub j -> v[c,j] (always), feeder down (if
``x[c,j] > 0``), rail up (cost u; the last one if ``H[c,m-1] < cap^c``) and rail down (cost
``2 - u``, if ``H[c,j] > 0``). A unit moved from hub a to hub b along rail c raises (a < b)
or lowers (a > b) ``H[c, a..b-1]`` by one. ``solve_cumulative_family``:

1. *Dual start.* By Lagrangian duality on the column sums, a flow is optimal iff there is a
   common shift ``s`` of the targets (one number per column) under which every child's chain
   is its own optimum for ``H~^c + s`` (a one-chain problem, above) and the columns sum to
   ``P``. Accelerated (Nesterov) gradient ascent on the continuous dual,
   ``s += (P - sum_c h*^c(H~^c + s)) / k`` at a look-ahead point (step 1/k: the column sums
   are k-Lipschitz in s; at most ``DUAL_STEPS_SHORT`` / ``DUAL_STEPS_LONG`` steps), brings
   ``s`` near the optimal shift; rounded to multiples of 1/2, it gives the start: each child's
   integer optimum for ``H~^c + s``. The start is optimal *for the column sums it has* (no
   residual cycle lowers its cost), and node potentials proving it follow in closed form: hub
   j gets ``Pi_j = 2 sum_{i<j} s_i``, rail node ``v[c,j]`` the cheapest walk to it from a hub
   along the rail (prefix and suffix minima, O(k m)). Any shift is valid; a good one only
   makes the remaining excess small (measured at N = 5,000: 60-100 units per family, against
   650-1,400 from ``s = 0``, and 2-5 phases instead of 14-19). The phases grow with the
   distance left between the start's shift and the optimal one, so with the noise scale when
   the start is poor: plain gradient steps (20) left 20-30 phases at eps = 0.1 and 200-400 at
   eps = 0.01; the accelerated 60 leave 2-5 and 3-17. Where a child's optimum is tied
   (half-way targets), the first children take the upper one, as many as bring the column
   sums closest to ``P``.
2. *Balancing*, from the start (optimal for its own column sums) to the balanced optimum, by
   one of two exact engines (``DENSE_SIZES`` picks; both end with the same certificate):

   - *short chains* (m <= 24): one unit at a time along a fewest-hop shortest path of the
     dense hub graph (hub pairs joined by their cheapest rail, which loses no path or cycle
     cost), vectorised Bellman-Ford on the ``m + 1`` hubs, from any hub in excess to the
     nearest in deficit. Such a path never uses a rail twice on overlapping columns (that
     walk would split into a cheaper or shorter one plus a non-negative cycle), so each step
     changes every H by at most one and costs exactly the path length. This was the old
     solver's only engine: at m = 7 a unit costs less than scipy's graph calls.
   - *long chains*: primal-dual phases (successive shortest paths, many paths at a time) on
     the sparse rail network. Per phase: Dijkstra (scipy) on the reduced costs ``c +
     pi(tail) - pi(head) >= 0`` from all hubs in excess; potentials ``pi += dist``
     (unreached nodes: + the largest distance, which keeps every reduced cost non-negative);
     then a maximum flow (scipy, Dinic) from the hubs in excess to the hubs in deficit
     through the arcs of reduced cost 0, each rail arc with capacity 1 (the next unit on it
     costs 2 more). Pushed along arcs of reduced cost 0 the flow keeps every reduced cost
     non-negative, so it stays optimal for its column sums; one phase pushes as many units
     as the current shortest paths can carry, and the next phase's paths are longer.

   If no deficit hub is reachable, no feasible point exists (``ValueError``).
3. *Certificate*, checked on every family: the final hub potentials give the shift
   ``s_j = (Pi_{j+1} - Pi_j) / 2``; every child's chain must cost, at targets ``H~^c + s``,
   exactly its own integer optimum (``_integer_isotonic``, independent of the flow code) and
   the columns must sum to ``P``. Then for any feasible H', ``sum_c f_c(H') = sum_c
   [f_c(H') - 2 s . H'^c] + 2 s . P >= sum_c [f_c(H) - 2 s . H^c] + 2 s . P = sum_c
   f_c(H)``: H is the integer optimum.

Why this design. The old solver balanced one unit per Bellman-Ford on the dense
hub graph, with ``(k, m, m)`` arrays for the one-chain fits: O(units x m^2) time, 2.5 GB and
more than 20 minutes at N = 4,919; profiling showed 80% of the time in the Bellman-Ford loop
and ~1-2 units of excess per column left by its start. Here the start comes from the dual
(the problem is a Lagrangian on the column sums over independent isotonic chains), the
one-chain fits are O(m), and the balancing runs on the sparse network (``4 k m`` arcs instead
of ``k (m + 1)^2``), many units per phase.

Work per family of k children and m sizes: the start is O(k m) per dual step (at most
``DUAL_STEPS_LONG``), each phase O(k m log(k m)) for Dijkstra plus a Dinic max flow on the
same graph (not linear in the worst case; here unit-capacity rails, and it costs about as much
as the Dijkstra), memory O(k m). Counted, not assumed: 2-5 phases per family from N = 100 to
N = 50,000 on the heavy-tailed benchmark tree (eps = 1 and 1/10) and on the unit tests'
families, whatever N; not bounded in theory: the count grows with the distance between the
start's shift and the optimal one (above). Integer costs are held exactly in
float64 for Dijkstra (far below 2^53) and capacities in int32 (clipped: a phase then sends
less, which is still correct).

Measured (``benchmarks/bench_cumulative_scaling.py``, ``BENCHMARKS.md``): a root -> 4 -> 28
tree with 300,000 groups takes 0.4-0.7 s at N = 5,000 (2.3-2.4x ``dp``'s post-processing,
eps = 1 and 1/10; the old solver took 8 s at N = 100 and did not finish at N = 400) and 3-4 s
at N = 50,000 (1.3-1.9x ``dp``); at N = 4-7 (the real CALM tree, a national-like spine) it is
1.5-2.4x faster than the old solver. Limits: about 600 bytes and 5-15 µs per (child, size)
cell of a family, so one family of 7 children at N = 400,000 (2.8 M cells) takes 15 s and
1.8 GiB; a 24 GiB machine holds families of roughly 30 M cells. Beyond that, or for many
families at such N per Spark task, memory is the limit.

The top-down sequence as a whole is *not* the global optimum of Model 2 over the tree (a
parent is fixed before its children are seen), exactly as in TopDown; every family step is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import isotonic_regression
from scipy.sparse.csgraph import dijkstra, maximum_flow

from censusdp_spark.group_sizes.solvers.tree import GroupTree

# Chains up to this length use the vectorised O(m^2) formulas and unit paths (faster there).
DENSE_SIZES = 24
# Gradient steps on the continuous dual for the start, at most: a unit path of a short family
# costs about two steps, a phase of a long one about ten, and at small eps (large noise) the
# phases grow with the distance left to the optimal shift (measured), so long ones take more.
DUAL_STEPS_SHORT = 8
DUAL_STEPS_LONG = 60
_SHIFT_DENOMINATOR = 2  # the start's target shifts are multiples of 1/2
_INT32_MAX = np.iinfo(np.int32).max
_INT64_SAFE = 2**62  # int64 intermediate products stay below this (room for a sum of two)


def to_cumulative(counts: np.ndarray) -> np.ndarray:
    """``H_j = sum_{i<=j} x_i`` for ``j < N`` (the last, ``G``, is public and left out)."""
    return np.cumsum(counts, axis=-1)[..., :-1]


def from_cumulative(cumulative: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Inverse of ``to_cumulative`` given each row's number of groups."""
    full = np.concatenate([cumulative, np.asarray(groups)[..., None]], axis=-1)
    return np.diff(full, axis=-1, prepend=0)


# --- one chain: isotonic regression ------------------------------------------------------------


def _rounded(sums: np.ndarray, lengths: np.ndarray, scale: int, halves_up: bool) -> np.ndarray:
    """``ceil(mean - 1/2)`` (or ``floor(mean + 1/2)``) of ``mean = sums / (scale lengths)``,
    in integers."""
    if halves_up:
        return (2 * sums + scale * lengths) // (2 * scale * lengths)
    return -((scale * lengths - 2 * sums) // (2 * scale * lengths))


@functools.cache
def _spans(m: int) -> tuple[np.ndarray, np.ndarray]:
    """``unordered[a, b]`` (a > b) and ``span[a, b]``, the number of columns a..b (1 if a > b)."""
    length = np.arange(m)[None, :] - np.arange(m)[:, None] + 1
    return length < 1, np.maximum(length, 1)


def _dense_isotonic(targets: np.ndarray, scale: int | None, halves_up: bool = False) -> np.ndarray:
    """Per row the max-min formula over all (a, b): with ``scale`` an integer, the integer fit
    ``ceil(h* - 1/2)`` (or ``floor(h* + 1/2)``) of ``targets / scale`` (integer arithmetic:
    rounding is monotone, so it commutes with max-min); with None, ``h*`` (floats)."""
    k, m = targets.shape
    unordered, span = _spans(m)
    prefix = np.zeros((k, m + 1), dtype=targets.dtype)
    np.cumsum(targets, axis=1, out=prefix[:, 1:])
    sums = prefix[:, None, 1:] - prefix[:, :-1, None]  # [c, a, b]: sum of a..b
    if scale is None:
        means = sums / span
        limit: float | int = np.inf
    else:
        means = _rounded(sums, span, scale, halves_up)
        limit = int(np.iinfo(np.int64).max)
    means[:, unordered] = limit
    lowest_after = np.minimum.accumulate(means[:, :, ::-1], axis=2)[:, :, ::-1]
    lowest_after[:, unordered] = -limit
    return lowest_after.max(axis=1)  # max_{a<=j} min_{b>=j}


def _integer_pav(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool adjacent violators in Python integers: the blocks' sums and lengths."""
    sums: list[int] = []
    lengths: list[int] = []
    for value in row.tolist():
        total, length = value, 1
        while sums and sums[-1] * length >= total * lengths[-1]:
            total += sums.pop()
            length += lengths.pop()
        sums.append(total)
        lengths.append(length)
    return np.array(sums, dtype=np.int64), np.array(lengths, dtype=np.int64)


def _isotonic_blocks(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The isotonic regression's blocks of an integer row (sums, lengths), exactly: scipy's PAV
    proposes them, integers verify the optimality conditions, an integer PAV redoes a failure
    (and rows whose products ``sum x length`` could overflow int64)."""
    if int(np.abs(row).max(initial=0)) * row.size**2 >= _INT64_SAFE:
        return _integer_pav(row)
    bounds = isotonic_regression(row.astype(np.float64)).blocks
    starts, lengths = bounds[:-1], np.diff(bounds)
    sums = np.add.reduceat(row, starts)
    if (sums[:-1] * lengths[1:] <= sums[1:] * lengths[:-1]).all():
        owner = np.repeat(np.arange(starts.size), lengths)
        within = np.cumsum(row) - np.repeat(np.cumsum(sums) - sums, lengths)
        position = np.arange(row.size) - np.repeat(starts, lengths) + 1
        if (within * lengths[owner] >= position * sums[owner]).all():
            return sums, lengths
    return _integer_pav(row)


def _integer_isotonic(
    scaled_targets: np.ndarray, scale: int, caps: np.ndarray, halves_up: bool = False
) -> np.ndarray:
    """Per row, an integer optimum of ``sum_j (H_j - scaled_targets_j / scale)^2`` over the
    chains ``0 <= H_0 <= ... <= H_{m-1} <= caps[row]`` (exact: integer arithmetic only): the
    isotonic fit rounded half down, or half up (another optimum where they differ)."""
    k, m = scaled_targets.shape
    if m <= DENSE_SIZES:
        fit = _dense_isotonic(scaled_targets, scale, halves_up)
    else:
        fit = np.empty((k, m), dtype=np.int64)
        for c in range(k):
            sums, lengths = _isotonic_blocks(scaled_targets[c])
            fit[c] = np.repeat(_rounded(sums, lengths, scale, halves_up), lengths)
    return np.clip(fit, 0, caps[:, None])


def _real_isotonic(targets: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Per row, the least-squares fit (reals) over chains in ``[0, caps[row]]``."""
    k, m = targets.shape
    if m <= DENSE_SIZES:
        fit = _dense_isotonic(targets, None)
    else:
        fit = np.stack([isotonic_regression(row).x for row in targets])
    return np.clip(fit, 0, caps[:, None])


def _shifted_cost(chains: np.ndarray, noisy: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Per child, ``4 sum_j (H_j - H~_j - shift_j / 2)^2`` (shift in halves; exact integers,
    Python's where int64 could overflow)."""
    gaps = 2 * chains - 2 * noisy - shift
    if int(np.abs(gaps).max(initial=0)) ** 2 * gaps.shape[1] >= _INT64_SAFE:
        gaps = gaps.astype(object)
    return np.square(gaps).sum(axis=1)


# --- a family: convex-cost flow ----------------------------------------------------------------


def _dual_start(noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """A shift of the targets (in halves, one per column) near the continuous optimum's:
    accelerated (Nesterov) gradient ascent on the dual of the column-sum constraints, step
    1/k (the column sums are k-Lipschitz in the shift)."""
    k, m = noisy.shape
    targets = noisy.astype(np.float64)
    shift = previous = np.zeros(m)
    for step in range(DUAL_STEPS_SHORT if m <= DENSE_SIZES else DUAL_STEPS_LONG):
        ahead = shift + step / (step + 3) * (shift - previous)
        missing = parent - _real_isotonic(targets + ahead, caps).sum(axis=0)
        previous, shift = shift, ahead + missing / k
        if np.abs(missing).max(initial=0.0) < 1 / 2:
            break
    return np.rint(shift * _SHIFT_DENOMINATOR).astype(np.int64)


def _start(
    noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray, shift: np.ndarray
) -> np.ndarray:
    """Every child's own integer optimum for ``H~ + shift / 2``; where a child's optimum is
    tied (half-way targets: the shift is in halves), the first children of the family take the
    upper one, as many as bring the column sums closest to ``parent`` (all choices are valid)."""
    scaled = _SHIFT_DENOMINATOR * noisy + shift
    lower = _integer_isotonic(scaled, _SHIFT_DENOMINATOR, caps)
    upper = _integer_isotonic(scaled, _SHIFT_DENOMINATOR, caps, halves_up=True)
    raised = np.zeros((noisy.shape[0] + 1, noisy.shape[1]), dtype=np.int64)
    np.cumsum(upper - lower, axis=0, out=raised[1:])  # [i]: sums with children < i raised
    missing = parent - lower.sum(axis=0) - raised
    excess = np.maximum(missing[:, 1:] - missing[:, :-1], 0).sum(axis=1)  # hubs 1..m-1
    excess += np.maximum(missing[:, 0], 0) + np.maximum(-missing[:, -1], 0)  # hubs 0 and m
    first = int(excess.argmin())
    return np.concatenate([upper[:first], lower[first:]])


def _hub_excess(missing: np.ndarray) -> np.ndarray:
    """Per hub ``0..m``, the units it must still send (negative: receive) when the column sums
    lack ``missing`` (``m``)."""
    excess = np.zeros(missing.size + 1, dtype=np.int64)
    excess[:-1] += missing
    excess[1:] -= missing
    return excess


class _Network:
    """The residual network of k rails of m columns as a fixed CSR structure, plus a super
    source (arcs to every hub) and a super sink (arcs from every hub); each phase only
    rewrites the arcs' values.

    Arcs, in this order (k m each): feeder up hub j -> v[c,j], feeder down v[c,j] -> hub j,
    rail up v[c,j] -> v[c,j+1] (v[c,m] = hub m), rail down back; then source -> hub j and
    hub j -> sink (m + 1 each). Nodes: hubs 0..m, v[c,j] = m + 1 + c m + j, source, sink."""

    def __init__(self, k: int, m: int) -> None:
        hub = np.broadcast_to(np.arange(m), (k, m)).ravel()
        rail = m + 1 + np.arange(k * m)
        after = rail.reshape(k, m) + 1
        after[:, -1] = m
        hubs = np.arange(m + 1)
        self.nodes = m + 3 + k * m
        self.source, self.sink = self.nodes - 2, self.nodes - 1
        self.rails = 4 * k * m
        self.tails = np.concatenate(
            [hub, rail, rail, after.ravel(), np.full(m + 1, self.source), hubs]
        )
        self.heads = np.concatenate(
            [rail, hub, after.ravel(), rail, hubs, np.full(m + 1, self.sink)]
        )
        self.order = np.argsort(self.tails, kind="stable")
        indptr = np.searchsorted(self.tails[self.order], np.arange(self.nodes + 1))
        shape = (self.nodes, self.nodes)
        indices = self.heads[self.order]
        self.weights = sparse.csr_matrix((np.zeros(indices.size), indices, indptr), shape=shape)
        capacities = np.zeros(indices.size, dtype=np.int32)
        self.capacities = sparse.csr_matrix((capacities, indices, indptr), shape=shape)
        self.raise_keys = (self.tails * self.nodes + self.heads)[2 * k * m : 3 * k * m]

    def shortest_distances(self, weights: np.ndarray) -> np.ndarray:
        """Dijkstra from the source over arcs of these (non-negative; inf: absent) weights."""
        self.weights.data[:] = weights[self.order]
        return dijkstra(self.weights, indices=self.source)[: self.source]

    def rails_raised(self, capacities: np.ndarray) -> np.ndarray:
        """A maximum flow from source to sink under these capacities: the net flow on every
        rail-up arc (k m; negative where the rail was lowered)."""
        self.capacities.data[:] = capacities[self.order]
        flow = maximum_flow(self.capacities, self.source, self.sink).flow
        rows = np.repeat(np.arange(self.nodes), np.diff(flow.indptr))
        keys = rows * self.nodes + flow.indices  # sorted: rows, then sorted columns
        return np.asarray(flow.data[np.searchsorted(keys, self.raise_keys)], dtype=np.int64)


def _residual(
    cumulative: np.ndarray, noisy: np.ndarray, caps: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rail arc (4 k m, the network's order): cost, capacity (-1: unbounded) and whether
    it is residual."""
    x = np.diff(cumulative, axis=1, prepend=0).ravel()
    up = (2 * (cumulative - noisy) + 1).ravel()
    full = np.zeros(cumulative.shape, dtype=bool)
    full[:, -1] = cumulative[:, -1] >= caps
    zero, one = np.zeros_like(up), np.ones_like(up)
    cost = np.concatenate([zero, zero, up, 2 - up])
    capacity = np.concatenate([-one, x, one, one])
    residual = np.concatenate([one > 0, x > 0, ~full.ravel(), cumulative.ravel() > 0])
    return cost, capacity, residual


def _start_potentials(cumulative: np.ndarray, noisy: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Node potentials (hubs, then rail nodes) proving that a start whose every child is its
    own optimum for ``H~ + shift / 2`` has no negative residual cycle: hub j gets ``sum_{i<j}
    shift_i``, v[c,j] the cheapest walk to it along rail c from a hub (up from i <= j, or
    down from i >= j while ``H > 0``)."""
    k, m = cumulative.shape
    hub = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(shift, out=hub[1:])
    up = 2 * (cumulative - noisy) + 1
    rise = np.zeros((k, m + 1), dtype=np.int64)  # rise[c, j]: walking up rail c to v[c, j]
    np.cumsum(up, axis=1, out=rise[:, 1:])
    fall = np.zeros((k, m + 1), dtype=np.int64)  # fall[c, j]: walking down, the opposite sign
    np.cumsum(2 - up, axis=1, out=fall[:, 1:])
    from_below = rise[:, :m] + np.minimum.accumulate(hub[:m] - rise[:, :m], axis=1)
    from_above = np.minimum.accumulate((hub + fall)[:, ::-1], axis=1)[:, ::-1][:, :m]
    from_above = np.where(cumulative > 0, from_above - fall[:, :m], hub[:m])
    return np.concatenate([hub, np.minimum(from_below, from_above).ravel()])


@dataclass(frozen=True)
class FamilySolution:
    """A family's released cumulative counts with the work done and the certificate's shift."""

    cumulative: np.ndarray  # k x m
    phases: int  # primal-dual phases (one Dijkstra and one max flow each) after the start
    shift: np.ndarray  # m, in halves: every child is its own optimum for H~ + shift / 2


def solve_family_certified(
    noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray
) -> FamilySolution:
    """``solve_cumulative_family`` for a family (``parent`` given), with its certificate."""
    noisy = np.asarray(noisy, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64)
    parent = np.asarray(parent, dtype=np.int64)
    k, m = noisy.shape
    if k == 0 or m == 0:
        if parent.any():
            raise ValueError("no monotone cumulative counts meet the parent and the groups")
        return FamilySolution(np.zeros((k, m), dtype=np.int64), 0, np.zeros(m, dtype=np.int64))
    shift = _dual_start(noisy, caps, parent)
    cumulative = _start(noisy, caps, parent, shift)
    excess = _hub_excess(parent - cumulative.sum(axis=0))
    phases = 0
    if (excess > 0).any():
        engine = _unit_paths if m <= DENSE_SIZES else _primal_dual
        cumulative, shift, phases = engine(noisy, caps, parent, cumulative, shift)
    own = _integer_isotonic(_SHIFT_DENOMINATOR * noisy + shift, _SHIFT_DENOMINATOR, caps)
    if (cumulative.sum(axis=0) != parent).any() or (
        _shifted_cost(cumulative, noisy, shift) != _shifted_cost(own, noisy, shift)
    ).any():
        raise RuntimeError("cumulative family: the optimality certificate does not hold (a bug)")
    return FamilySolution(cumulative, phases, shift)


def _hub_graph(
    noisy: np.ndarray, caps: np.ndarray, cumulative: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``cost[a, b]``: the cheapest change in cost of moving one unit from hub a to hub b
    along a single rail (inf if no rail can), and ``child[a, b]``, that rail."""
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
    return cost.min(axis=0), cost.argmin(axis=0)


def _hub_distances(cost: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bellman-Ford (vectorised, one hop per round) from the ``sources`` hubs: distances and
    predecessors (-1 at a path's start), each path a fewest-hop one among the shortest."""
    n = cost.shape[0]
    distance = np.where(sources, 0.0, np.inf)
    pred = np.full(n, -1)
    for _ in range(n):
        via = distance[:, None] + cost
        best = via.argmin(axis=0)
        reached = via[best, np.arange(n)]
        better = reached < distance
        if not better.any():
            return distance, pred
        distance = np.where(better, reached, distance)
        pred = np.where(better, best, pred)
    raise RuntimeError("cumulative family: negative cycle in the residual network (a bug)")


def _unit_paths(
    noisy: np.ndarray,
    caps: np.ndarray,
    parent: np.ndarray,
    cumulative: np.ndarray,
    shift: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Short chains: one unit at a time along a fewest-hop shortest path of the dense hub
    graph (hub pairs joined by their cheapest rail; that loses no path or cycle cost), from
    any hub in excess to the nearest in deficit. Such a path never uses a rail twice on
    overlapping columns (it would split into a cheaper or shorter walk plus a non-negative
    cycle), so it changes every H by at most one and costs exactly its length."""
    cumulative = cumulative.copy()
    rounds = 0
    while True:
        excess = _hub_excess(parent - cumulative.sum(axis=0))
        cost, child = _hub_graph(noisy, caps, cumulative)
        if not (excess > 0).any():
            potentials, _ = _hub_distances(cost, np.ones(excess.size, dtype=bool))
            return cumulative, np.diff(potentials).astype(np.int64), rounds
        rounds += 1
        distance, pred = _hub_distances(cost, excess > 0)
        arrival = np.where(excess < 0, distance, np.inf)
        hub = int(arrival.argmin())
        if arrival[hub] == np.inf:
            raise ValueError("no monotone cumulative counts meet the parent and the groups")
        while pred[hub] >= 0:
            origin = int(pred[hub])
            c = child[origin, hub]
            if origin < hub:
                cumulative[c, origin:hub] += 1
            else:
                cumulative[c, hub:origin] -= 1
            hub = origin


def _primal_dual(
    noisy: np.ndarray,
    caps: np.ndarray,
    parent: np.ndarray,
    cumulative: np.ndarray,
    shift: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Phases from a start optimal for its column sums (every child its own optimum for
    ``H~ + shift / 2``) to the balanced optimum: its chains, certifying shift and phases."""
    k, m = cumulative.shape
    potentials = _start_potentials(cumulative, noisy, shift)
    network = _Network(k, m)
    rails = network.rails
    tails, heads = network.tails[:rails], network.heads[:rails]
    phases = 0
    while True:
        excess = _hub_excess(parent - cumulative.sum(axis=0))
        cost, capacity, residual = _residual(cumulative, noisy, caps)
        reduced = np.where(residual, cost + potentials[tails] - potentials[heads], 0)
        if reduced.min(initial=0) < 0:
            raise RuntimeError("cumulative family: negative reduced cost (a bug)")
        if not (excess > 0).any():
            return cumulative, np.diff(potentials[: m + 1]), phases
        phases += 1
        weights = np.concatenate(
            [
                np.where(residual, reduced, np.inf),
                np.where(excess > 0, 0.0, np.inf),
                np.full(m + 1, np.inf),
            ]
        )
        distance = network.shortest_distances(weights)
        if not np.isfinite(distance[: m + 1][excess < 0]).all():
            raise ValueError("no monotone cumulative counts meet the parent and the groups")
        reached = np.isfinite(distance)
        distance = np.where(reached, distance, distance[reached].max()).astype(np.int64)
        potentials = potentials + distance
        admissible = residual & (reduced + distance[tails] - distance[heads] == 0)
        flow_cap = np.where(capacity < 0, _INT32_MAX, capacity) * admissible
        flow_cap = np.concatenate([flow_cap, np.maximum(excess, 0), np.maximum(-excess, 0)])
        raised = network.rails_raised(np.minimum(flow_cap, _INT32_MAX).astype(np.int32))
        cumulative = cumulative + raised.reshape(k, m)


def solve_cumulative_family(
    noisy: np.ndarray, caps: np.ndarray, parent: np.ndarray | None
) -> np.ndarray:
    """Released cumulative counts (k x J) of one family (or of the root, ``parent=None``):
    monotone chains in ``0..caps[c]`` summing to ``parent`` column by column, at the least
    squared distance to ``noisy``. Raises ValueError if no such chains exist."""
    if parent is None:
        noisy = np.asarray(noisy, dtype=np.int64)
        return _integer_isotonic(noisy, 1, np.asarray(caps, dtype=np.int64))
    return solve_family_certified(noisy, caps, parent).cumulative


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
