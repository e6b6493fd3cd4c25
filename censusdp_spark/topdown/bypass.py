"""Bypassing single-child parents (``[budget] bypass_single_child = true``): which nodes are
measured, what each measured node spends, and the record of both for the manifest.

The rule (Abowd et al. 2021, geographic spines, Algorithm 3 under zCDP). A node with exactly
one child holds the same people as that child, so measuring both spends two levels' budget on
one histogram. Bypassing measures only the lowest node of every chain of single-child parents
(nation -> state in a one-state run, a county with one tract, a tract with one block group),
with its own level's queries at the rho of every level of the chain
(``ZcdpAllocation.node_budget``); the parents of the chain are not measured and are released as
that node's value. The chains come from the geography (the spine, or the block list of a
block-count input) through ``engine.hierarchy.single_child_chains``, never from a count: the set
of measured nodes, their budgets and their noise streams are public functions of the geography.

The plan (``measurement_plan``) has one row per node: ``level, geocode, measured`` and
``budget_levels``, the levels whose share the node's measurement spends (its own level last;
null for a bypassed node). ``noisy_measurements`` carries ``budget_levels`` and the exact
``sigma2`` of every row, so the estimators weight each node by what it was given, and a
bypassed node of level ``l`` is estimated from the one measured node whose ``budget_levels``
contain ``l`` (``estimate.level_measurements``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import single_child_chains
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy.accounting import ZcdpAllocation
from censusdp_spark.topdown.path_cuts import cut_at, path_rho

PLAN_COLUMNS = ("level", "geocode", "measured", "budget_levels")


def measurement_plan(nodes: DataFrame, hierarchy: Hierarchy) -> DataFrame:
    """``level, geocode, measured, budget_levels`` for every node of ``nodes`` (only its
    ``level, geocode`` are read), with ``single_above`` kept for ``plan_summary``. Persisted
    and materialised here: ``unpersist`` it when done."""
    chains = single_child_chains(nodes, hierarchy)
    names = F.array(*[F.lit(n) for n in hierarchy.names])
    position = F.array_position(names, F.col("level")).cast("int")  # 1-based
    measured = F.col("children") != 1
    spent = F.slice(names, F.col("chain_top") + 1, position - F.col("chain_top"))
    plan = chains.select(
        "level",
        "geocode",
        measured.alias("measured"),
        F.when(measured, spent).alias("budget_levels"),
        "single_above",
    ).persist(StorageLevel.MEMORY_AND_DISK)
    plan.count()
    chains.unpersist()
    return plan


@dataclass(frozen=True)
class NodeBudget:
    """The measured nodes of one level that spend the levels ``chain``: how many, and their
    exact per-query rho and sigma^2."""

    level: str
    chain: tuple[str, ...]
    nodes: int
    rho: Fraction
    queries: tuple[tuple[str, Fraction, Fraction], ...]  # (query, rho, sigma2)

    def manifest(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "budget_levels": list(self.chain),
            "nodes": self.nodes,
            "rho": str(self.rho),
            "queries": [{"query": q, "rho": str(r), "sigma2": str(s)} for q, r, s in self.queries],
        }


@dataclass(frozen=True)
class BypassSummary:
    """What the geography made of the rule: the bypassed nodes per level, the node budgets of
    the measured ones, and every distinct way a root-to-leaf path is cut, with its leaves and
    its exactly re-added rho (each checked to equal the total)."""

    bypassed: dict[str, list[str]]
    node_budgets: list[NodeBudget]
    paths: list[tuple[tuple[tuple[str, ...], ...], int, Fraction]] = field(default_factory=list)

    def manifest(self) -> dict[str, Any]:
        return {
            "bypass_single_child": True,
            "rule": "a parent with exactly one child is not measured; its rho share moves to"
            " the child (chains collapse to their lowest node); its released value is the"
            " child's",
            "bypassed_nodes": {lv: len(g) for lv, g in self.bypassed.items()},
            "bypassed": self.bypassed,
            "node_budgets": [b.manifest() for b in self.node_budgets],
            "paths": [
                {"cut": [list(c) for c in cut], "leaves": n, "rho": str(rho)}
                for cut, n, rho in self.paths
            ],
        }

    def text(self) -> str:
        counts = ", ".join(f"{lv} {len(g)}" for lv, g in self.bypassed.items() if g)
        return f"  bypassed single-child parents: {counts or 'none'}"


def plan_summary(plan: DataFrame, budget: ZcdpAllocation, hierarchy: Hierarchy) -> BypassSummary:
    """Collect the plan's public facts (three small Spark jobs: the bypassed geocodes, the
    counts per (level, budget_levels) and the distinct leaf paths) and check every path's rho
    exactly (``BudgetError`` if one is off)."""
    names = hierarchy.names
    bypassed: dict[str, list[str]] = {lv: [] for lv in names}
    for row in plan.filter(~F.col("measured")).select("level", "geocode").collect():
        bypassed[row["level"]].append(row["geocode"])
    for geocodes in bypassed.values():
        geocodes.sort()
    classes = Counter(
        {
            (r["level"], tuple(r["budget_levels"])): int(r["count"])
            for r in plan.filter(F.col("measured"))
            .groupBy("level", "budget_levels")
            .count()
            .collect()
        }
    )
    budgets = [
        NodeBudget(
            level,
            chain,
            n,
            budget.node_rho(chain),
            tuple((e.query, e.rho, e.sigma2) for e in budget.node_budget(chain)),
        )
        for (level, chain), n in sorted(
            classes.items(), key=lambda c: (names.index(c[0][0]), c[0][1])
        )
    ]
    leaves = plan.filter(F.col("level") == hierarchy.leaf.name).groupBy("single_above").count()
    paths = []
    for row in leaves.collect():
        cut = cut_at(names, [not single for single in row["single_above"]] + [True])
        paths.append((cut, int(row["count"]), path_rho(budget, cut)))
    paths.sort(key=lambda p: -p[1])
    return BypassSummary(bypassed, budgets, paths)
