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
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy.accounting import BudgetError, ZcdpAllocation
from censusdp_spark.topdown.path_cuts import PathCut, cut_at, path_rho


def check_estimates(
    estimates: DataFrame, hierarchy: Hierarchy, invariant_totals: DataFrame
) -> dict[str, int]:
    """Return the number of violations per guarantee (all zero) or raise ``GuaranteeViolation``.

    ``estimates`` is long format ``level, geocode, cell, count``; ``invariant_totals`` is
    ``level, geocode, inv_total``.
    """
    negatives = estimates.filter(F.col("count") < 0).count()
    inconsistent = children_not_summing_to_parent(estimates, hierarchy, "cell").count()
    invariant_levels = [r["level"] for r in invariant_totals.select("level").distinct().collect()]
    totals = (
        estimates.filter(F.col("level").isin(invariant_levels))
        .groupBy("level", "geocode")
        .agg(F.sum("count").alias("total"))
    )
    broken_invariants = (
        invariant_totals.join(totals, ["level", "geocode"], "left")
        .filter(F.coalesce(F.col("total"), F.lit(0)) != F.col("inv_total"))
        .count()
    )
    result = {
        "negative_counts": negatives,
        "children_not_summing_to_parent": inconsistent,
        "invariants_broken": broken_invariants,
    }
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
