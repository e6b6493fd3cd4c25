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
path crosses the chain whole, so the path still spends every level's rho once; TopDown checks
this exactly for every way a path can be cut, with the argument (``topdown.path_cuts``).

Pure DP (geometric mechanism). A total epsilon split over levels by shares that sum to 1;
level l then adds two-sided geometric noise of scale Delta / epsilon_l to each node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction


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
