"""Exact privacy accounting with ``fractions.Fraction``.

zCDP (TopDown). Query ``q`` at level ``l`` receives rho(l, q) = rho * level_share(l) *
query_share(l, q) (or an absolute rho in per-query mode). Every query is a marginal with squared
L2 sensitivity 2 under the change-one-record neighbour, so the discrete Gaussian with
sigma^2 = 1 / rho(l, q) on every cell is rho(l, q)-zCDP (rho = Delta^2 / (2 sigma^2), CKS20
Thm 14). Nodes within a level are disjoint (parallel composition); queries and levels compose
by adding rho. Abowd et al. 2022, Theorem 2: with query shares summing to 1 within each level
and level shares summing to 1 along every root-to-leaf path, the whole measurement is
rho-zCDP. Both requirements are checked exactly here, and the spent budget is re-added and
compared with the configured total.

Bypassing single-child parents (Abowd et al. 2021, geographic spines, Algorithm 3 under zCDP).
A parent with exactly one child (a fact of the public geography, never of the data) is not
measured; its share moves to that child, and down a chain of single-child parents to the chain's
lowest node. That node, measured at level ``m`` with ``m``'s queries, spends the shares of every
level of its chain: ``rho(node, q) = (sum over the chain's levels l of level_rho(l)) *
query_share(m, q)`` (``node_budget``). Each person is in one node per level, and a root-to-leaf
path crosses the chain whole, so the path still spends every level's rho once: cut the path
into the chains its measured nodes stand for, add their node rho, and the sum is the configured
total. ``bypass_paths`` checks this exactly for every way a path can be cut (2^(L-1) for L
levels, the leaf always measured) and ``path_rho`` for any one path, and the measurement draws
its noise from ``node_budget`` itself, so what is checked is what is spent. Theorem 2's
change-one-record argument carries over (the spine paper's Theorem 3): two paths part below a
node with two or more children, which is measured and ends its chain on both, so below it the
chains of each path cover the remaining levels once; a record that moves costs half of each
path's rho below the parting and the full node rho above it, rho in all.

Pure DP (geometric mechanism). A total epsilon split over levels by shares that sum to 1;
level l then adds two-sided geometric noise of scale Delta / epsilon_l to each node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from censusdp_spark.privacy.conversions import bun_steinke_epsilon, zcdp_to_approx_dp


class BudgetError(ValueError):
    """A budget breaks an accounting rule; the message names the offending entry."""


@dataclass(frozen=True)
class QueryBudget:
    level: str
    query: str
    rho: Fraction
    level_share: Fraction
    query_share: Fraction

    @property
    def sigma2(self) -> Fraction:
        """Discrete Gaussian variance parameter for a marginal (squared sensitivity 2)."""
        return 1 / self.rho


@dataclass(frozen=True)
class ZcdpAllocation:
    total_rho: Fraction
    entries: tuple[QueryBudget, ...]

    def __post_init__(self) -> None:
        spent = sum((e.rho for e in self.entries), Fraction(0))
        if spent != self.total_rho:
            raise BudgetError(f"allocated rho {spent} differs from the total {self.total_rho}")

    def rho_for(self, level: str, query: str) -> Fraction:
        return self._entry(level, query).rho

    def sigma2_for(self, level: str, query: str) -> Fraction:
        return self._entry(level, query).sigma2

    def queries_at(self, level: str) -> tuple[str, ...]:
        return tuple(e.query for e in self.entries if e.level == level)

    def level_rho(self, level: str) -> Fraction:
        return sum((e.rho for e in self.entries if e.level == level), Fraction(0))

    @property
    def levels(self) -> tuple[str, ...]:
        """The levels, root first (the root-to-leaf path)."""
        return tuple(dict.fromkeys(e.level for e in self.entries))

    def node_budget(self, chain: Sequence[str]) -> tuple[QueryBudget, ...]:
        """The per-query budget of a node measured at ``chain[-1]`` that stands in for its
        bypassed single-child ancestors at the other levels of ``chain`` (consecutive levels,
        root side first; ``(level,)`` for a node without any): that level's queries, each with
        the query share of its level times the rho of every level of the chain.
        ``node_budget((level,))`` is the level's own entries. Raises ``BudgetError`` unless
        ``chain`` is a run of consecutive levels."""
        chain = tuple(chain)
        levels = self.levels
        if not chain or any(lv not in levels for lv in chain):
            raise BudgetError(f"bypass chain {list(chain)}: unknown level(s); levels are {levels}")
        start = levels.index(chain[0])
        if levels[start : start + len(chain)] != chain:
            raise BudgetError(f"bypass chain {list(chain)}: not consecutive levels of {levels}")
        if len(chain) == 1:
            return tuple(e for e in self.entries if e.level == chain[0])
        rho = sum((self.level_rho(lv) for lv in chain), Fraction(0))
        share = sum((self._level_share(lv) for lv in chain), Fraction(0))
        return tuple(
            QueryBudget(e.level, e.query, rho * e.query_share, share, e.query_share)
            for e in self.entries
            if e.level == chain[-1]
        )

    def node_rho(self, chain: Sequence[str]) -> Fraction:
        """The rho a node of ``chain`` (``node_budget``) spends over all its queries."""
        return sum((e.rho for e in self.node_budget(chain)), Fraction(0))

    def _level_share(self, level: str) -> Fraction:
        return next(e.level_share for e in self.entries if e.level == level)

    def _entry(self, level: str, query: str) -> QueryBudget:
        for e in self.entries:
            if e.level == level and e.query == query:
                return e
        raise KeyError(f"no budget for query {query!r} at level {level!r}")


def _positive(value: Fraction, what: str) -> Fraction:
    if not isinstance(value, Fraction | int) or isinstance(value, bool):
        raise BudgetError(f"{what}: {value!r} must be an exact fraction (e.g. '1/10'), not a float")
    value = Fraction(value)
    if value <= 0:
        raise BudgetError(f"{what}: {value} must be > 0")
    return value


def allocate_by_shares(
    total_rho: Fraction,
    level_shares: Mapping[str, Fraction],
    query_shares: Mapping[str, Mapping[str, Fraction]],
    levels: Sequence[str],
) -> ZcdpAllocation:
    """rho(l, q) = total * level_share(l) * query_share(l, q), with Theorem 2's checks.

    ``levels`` is the root-to-leaf path (every leaf has the same path in a full hierarchy).
    """
    total_rho = _positive(total_rho, "budget.rho")
    for level in levels:
        if level not in level_shares:
            raise BudgetError(f"budget.levels.{level}: missing level share")
        if not query_shares.get(level):
            raise BudgetError(f"budget.levels.{level}.queries: missing query shares")
    extra = set(level_shares) - set(levels)
    if extra:
        raise BudgetError(f"budget.levels: unknown levels {sorted(extra)}")
    path_sum = sum(
        (_positive(level_shares[lv], f"budget.levels.{lv}.share") for lv in levels), Fraction(0)
    )
    if path_sum != 1:
        raise BudgetError(
            f"budget.levels: level shares sum to {path_sum} along the root-to-leaf path, not 1"
        )
    entries = []
    for level in levels:
        shares = {
            q: _positive(s, f"budget.levels.{level}.queries.{q}")
            for q, s in query_shares[level].items()
        }
        level_sum = sum(shares.values(), Fraction(0))
        if level_sum != 1:
            raise BudgetError(f"budget.levels.{level}.queries: shares sum to {level_sum}, not 1")
        for query, share in shares.items():
            rho = total_rho * Fraction(level_shares[level]) * share
            entries.append(QueryBudget(level, query, rho, Fraction(level_shares[level]), share))
    return ZcdpAllocation(total_rho, tuple(entries))


def allocate_per_query_rho(
    rhos: Mapping[str, Mapping[str, Fraction]], levels: Sequence[str]
) -> ZcdpAllocation:
    """Absolute per-query rho; shares are derived so the table reads the same way."""
    for level in levels:
        if not rhos.get(level):
            raise BudgetError(f"budget.levels.{level}.queries: missing query rho values")
    extra = set(rhos) - set(levels)
    if extra:
        raise BudgetError(f"budget.levels: unknown levels {sorted(extra)}")
    checked = {
        lv: {q: _positive(r, f"budget.levels.{lv}.queries.{q}") for q, r in rhos[lv].items()}
        for lv in levels
    }
    total = sum((r for lv in levels for r in checked[lv].values()), Fraction(0))
    entries = []
    for level in levels:
        level_rho = sum(checked[level].values(), Fraction(0))
        for query, rho in checked[level].items():
            entries.append(QueryBudget(level, query, rho, level_rho / total, rho / level_rho))
    return ZcdpAllocation(total, tuple(entries))


PathCut = tuple[tuple[str, ...], ...]
"""A root-to-leaf path cut into the chains of its measured nodes, root first: each chain is the
levels one measured node spends (``ZcdpAllocation.node_budget``), its last level the node's."""


def path_rho(allocation: ZcdpAllocation, cut: PathCut) -> Fraction:
    """What a person on a path cut as ``cut`` is charged: the node rho of each chain, added up.
    Raises ``BudgetError`` unless the chains cover every level of the path once, in order, and
    the sum is the configured total (Theorem 2's path condition with bypassing)."""
    levels = tuple(lv for chain in cut for lv in chain)
    if levels != allocation.levels:
        raise BudgetError(
            f"bypass: the chains {[list(c) for c in cut]} do not cover the levels"
            f" {list(allocation.levels)} once each, in order"
        )
    spent = sum((allocation.node_rho(chain) for chain in cut), Fraction(0))
    if spent != allocation.total_rho:
        raise BudgetError(
            f"bypass: the path cut {[list(c) for c in cut]} spends rho {spent},"
            f" not the total {allocation.total_rho}"
        )
    return spent


def cut_at(levels: Sequence[str], measured: Sequence[bool]) -> PathCut:
    """The chains of a path whose node at ``levels[i]`` is measured iff ``measured[i]``: each
    chain ends at a measured node (the leaf's must be)."""
    if not measured or not measured[-1]:
        raise BudgetError("bypass: the leaf of every path is measured")
    cut, chain = [], []
    for level, here in zip(levels, measured, strict=True):
        chain.append(level)
        if here:
            cut.append(tuple(chain))
            chain = []
    return tuple(cut)


def bypass_paths(allocation: ZcdpAllocation) -> list[tuple[PathCut, Fraction]]:
    """Every way bypassing can cut a root-to-leaf path (any level above the leaf may be a
    bypassed single-child parent: 2^(L-1) cuts), each with its exactly re-added rho; raises
    ``BudgetError`` if any differs from the total."""
    levels = allocation.levels
    out = []
    for mask in range(2 ** (len(levels) - 1)):
        measured = [not (mask >> i) & 1 for i in range(len(levels) - 1)] + [True]
        cut = cut_at(levels, measured)
        out.append((cut, path_rho(allocation, cut)))
    return out


def bypass_table(allocation: ZcdpAllocation) -> list[str]:
    """The lines ``budget_table`` adds for ``[budget] bypass_single_child = true``: each chain
    a measured node can stand for, with its node rho and query sigmas, then the path check."""
    levels = allocation.levels
    lines = [
        "bypass_single_child = true: a parent with exactly one child (from the geography, never"
        " the data) is not measured;",
        "its share moves to the child, down to the lowest node of a single-child chain, which is"
        " measured with its level's queries at:",
        f"{'chain (levels spent)':<44}{'measured at':<14}{'node rho':>12}  query sigmas",
    ]
    for end in range(len(levels)):
        for start in range(end):
            chain = levels[start : end + 1]
            sigmas = ", ".join(
                f"{e.query} {float(e.sigma2) ** 0.5:.3f}" for e in allocation.node_budget(chain)
            )
            lines.append(
                f"{'+'.join(chain):<44}{chain[-1]:<14}{float(allocation.node_rho(chain)):>12.6f}"
                f"  {sigmas}"
            )
    paths = bypass_paths(allocation)
    lines.append(
        f"every root-to-leaf path: all {len(paths)} ways bypassing can cut it re-added, each"
        f" spends rho = {allocation.total_rho} exactly"
    )
    return lines


def budget_table(
    allocation: ZcdpAllocation, delta: float, bypass_single_child: bool = False
) -> str:
    """A printable table: per level and query the shares, rho, sigma; then totals and epsilon;
    with ``bypass_single_child``, the node budgets of bypass chains and the per-path check."""
    header = (
        f"{'level':<14}{'query':<34}{'level share':>14}{'query share':>14}{'rho':>12}{'sigma':>10}"
    )
    lines = [header, "-" * len(header)]
    for e in allocation.entries:
        sigma = float(e.sigma2) ** 0.5
        lines.append(
            f"{e.level:<14}{e.query:<34}{str(e.level_share):>14}{str(e.query_share):>14}"
            f"{float(e.rho):>12.6f}{sigma:>10.3f}"
        )
    lines.append("-" * len(header))
    for level in dict.fromkeys(e.level for e in allocation.entries):
        level_rho = allocation.level_rho(level)
        lines.append(f"{level:<14}{'(level total)':<34}{'':>28}{float(level_rho):>12.6f}")
    rho = allocation.total_rho
    lines += [
        "-" * len(header),
        f"total rho = {rho} = {float(rho):.6f} (re-added from the entries: exact match)",
    ]
    if bypass_single_child:
        lines += [*bypass_table(allocation), "-" * len(header)]
    lines.append(
        f"epsilon at delta={delta:g}: {zcdp_to_approx_dp(rho, delta):.4f} (tight, CKS20 Cor. 13); "
        f"{bun_steinke_epsilon(rho, delta):.4f} (Bun-Steinke bound)"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class PureDpSplit:
    """A total epsilon split over levels; ``scale(level, sensitivity)`` is the geometric scale."""

    total_epsilon: Fraction
    level_epsilon: Mapping[str, Fraction]

    def __post_init__(self) -> None:
        spent = sum(self.level_epsilon.values(), Fraction(0))
        if spent != self.total_epsilon:
            raise BudgetError(
                f"allocated epsilon {spent} differs from the total {self.total_epsilon}"
            )

    def scale(self, level: str, sensitivity: int) -> Fraction:
        return Fraction(sensitivity) / self.level_epsilon[level]


def split_epsilon(total: Fraction, shares: Mapping[str, Fraction]) -> PureDpSplit:
    """Split a pure-DP epsilon over levels by exact shares that must sum to 1."""
    total = _positive(total, "budget.epsilon")
    checked = {lv: _positive(s, f"budget.levels.{lv}.share") for lv, s in shares.items()}
    share_sum = sum(checked.values(), Fraction(0))
    if share_sum != 1:
        raise BudgetError(f"budget.levels: epsilon shares sum to {share_sum}, not 1")
    return PureDpSplit(total, {lv: total * s for lv, s in checked.items()})
