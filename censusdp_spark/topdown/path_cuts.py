"""The path condition of bypassing single-child parents, checked exactly with ``Fraction``.

Pure Python, no Spark. With ``[budget] bypass_single_child = true`` (``topdown.bypass``), a
measured node spends the rho of every level of its chain of bypassed single-child parents
(``ZcdpAllocation.node_budget``), and a root-to-leaf path crosses every chain whole: cut the
path into the chains its measured nodes stand for (:data:`PathCut`), add their node rho, and
the sum is the configured total. ``bypass_paths`` checks this exactly for every way a path can
be cut (2^(L-1) for L levels, the leaf always measured) and ``path_rho`` for any one path, and
the measurement draws its noise from ``node_budget`` itself, so what is checked is what is
spent. Theorem 2's change-one-record argument (Abowd et al. 2022) carries over (Abowd et al.
2021, geographic spines, Theorem 3): two paths part below a node with two or more children,
which is measured and ends its chain on both, so below it the chains of each path cover the
remaining levels once; a record that moves costs half of each path's rho below the parting and
the full node rho above it, rho in all.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from censusdp_spark.privacy.accounting import BudgetError, ZcdpAllocation

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
