"""Guarantees checked after every TopDown run; a violation fails the run loudly.

1. every released count is a non-negative integer;
2. at every level, the children of each parent sum to the parent cell by cell;
3. every invariant node total equals its true value;
4. every row of ``noisy_measurements`` was drawn with the variance the accounting gives its
   node: ``sigma2 = 1 / rho`` of ``ZcdpAllocation.node_budget(budget_levels)`` for its query,
   at the level its ``budget_levels`` end with (its own level alone without bypassing);
5. every way the geography cuts a root-to-leaf path into measured nodes spends exactly the
   configured rho (``path_cuts.path_rho``; with bypassing, the distinct cuts of the run's
   leaves, else the one cut where every level is measured).
The checks are Spark aggregations over the released tables; only violation counts, and for 4
the few distinct (level, budget_levels, query, sigma2) rows, reach the driver (never counts
themselves).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import children_not_summing_to_parent
from censusdp_spark.model.errors import GuaranteeViolation
from censusdp_spark.model.geography import EVERY_LEVEL, Hierarchy, LevelSpan
from censusdp_spark.privacy.accounting import BudgetError, ZcdpAllocation
from censusdp_spark.topdown.path_cuts import PathCut, cut_at, path_rho

GUARANTEES = ("negative_counts", "children_not_summing_to_parent", "invariants_broken")
"""The guarantees ``check_estimates`` counts the violations of (1 to 3 of the module docstring)."""


def check_estimates(
    estimates: DataFrame,
    hierarchy: Hierarchy,
    invariant_totals: DataFrame,
    invariant_levels: Sequence[str],
    span: LevelSpan = EVERY_LEVEL,
) -> dict[str, int]:
    """Return the number of violations per guarantee (all zero) or raise ``GuaranteeViolation``;
    one Spark query counts them all.

    ``estimates`` is long format ``level, geocode, cell, count`` of the levels of ``span``;
    ``invariant_totals`` is ``level, geocode, inv_total`` of every node of the
    ``invariant_levels``.
    """
    node = ["level", "geocode"]
    totals = (
        estimates.filter(F.col("level").isin(list(invariant_levels)))
        .groupBy(*node)
        .agg(F.sum("count").alias("total"))
    )
    broken_invariants = invariant_totals.join(totals, node, "left").filter(
        F.coalesce(F.col("total"), F.lit(0)) != F.col("inv_total")
    )
    negatives, inconsistent, broken = GUARANTEES
    violations = (
        estimates.filter(F.col("count") < 0)
        .select(F.lit(negatives).alias("guarantee"))
        .unionByName(
            children_not_summing_to_parent(estimates, hierarchy, "cell", span).select(
                F.lit(inconsistent).alias("guarantee")
            )
        )
        .unionByName(broken_invariants.select(F.lit(broken).alias("guarantee")))
    )
    found = {r["guarantee"]: r["count"] for r in violations.groupBy("guarantee").count().collect()}
    result = {guarantee: int(found.get(guarantee, 0)) for guarantee in GUARANTEES}
    if any(result.values()):
        raise GuaranteeViolation(f"released estimates break guarantees: {result}")
    return result


def check_measurements(
    noisy: DataFrame, budget: ZcdpAllocation, paths: Sequence[PathCut] | None = None
) -> dict[str, int]:
    """Guarantees 4 and 5 (module docstring) for ``noisy_measurements`` and the path cuts
    ``paths`` (None: every level measured). Returns the violation counts (all zero) or raises
    ``GuaranteeViolation``."""
    classes = noisy.groupBy("level", "budget_levels", "query", "sigma2").count().collect()
    off = 0
    for row in classes:
        chain = tuple(row["budget_levels"])
        try:
            wanted = {e.query: e.sigma2 for e in budget.node_budget(chain)}
        except BudgetError:
            off += int(row["count"])
            continue
        if chain[-1] != row["level"] or wanted.get(row["query"]) != Fraction(row["sigma2"]):
            off += int(row["count"])
    cuts = paths if paths is not None else [cut_at(budget.levels, [True] * len(budget.levels))]
    broken = 0
    for cut in cuts:
        try:
            path_rho(budget, cut)
        except BudgetError:
            broken += 1
    result = {"noise_variances_not_from_budget": off, "paths_not_spending_rho": broken}
    if any(result.values()):
        raise GuaranteeViolation(f"noisy measurements break the accounting: {result}")
    return result
