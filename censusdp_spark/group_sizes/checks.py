"""The guarantees a group-size release promises, checked on its written rows in one Spark job:
no negative count, every (parent, size) the sum of its children's, and faithfulness (every
level sums to G, or every node to its public G^r). The job fails an ``exact`` or
``cumulative`` release that breaks one; the rounded relaxations report them."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import children_not_summing_to_parent
from censusdp_spark.model.geography import Hierarchy


def release_violations(
    released: DataFrame, noisy: DataFrame, hierarchy: Hierarchy, faithfulness: str, total: int
) -> dict[str, int]:
    """Counts of broken guarantees, in one Spark job: negative cells, (parent, size) pairs whose
    children do not sum to the parent, and faithfulness breaches: levels whose counts do not sum
    to G (level faithfulness) or nodes whose sizes do not sum to their public number of groups
    or that are missing (node). Only the three counts reach the driver."""
    inconsistent = children_not_summing_to_parent(released, hierarchy, "size")
    if faithfulness == "level":
        levels = released.sparkSession.createDataFrame(
            [(lv,) for lv in hierarchy.names], "level string"
        )
        per_level = released.groupBy("level").agg(F.sum("count").alias("total"))
        unfaithful = levels.join(per_level, "level", "left").filter(
            F.coalesce(F.col("total"), F.lit(-1)) != F.lit(total)
        )
    else:
        totals = released.groupBy("level", "geocode").agg(F.sum("count").alias("total"))
        unfaithful = (
            noisy.select("level", "geocode", "groups")
            .join(totals, ["level", "geocode"], "full_outer")
            .filter(F.coalesce(F.col("total"), F.lit(-1)) != F.coalesce(F.col("groups"), F.lit(-1)))
        )
    kinds = {
        "negative_counts": released.filter(F.col("count") < 0),
        "children_not_summing_to_parent": inconsistent,
        "unfaithful": unfaithful,
    }
    flags = None
    for kind, rows in kinds.items():
        part = rows.select(F.lit(kind).alias("kind"))
        flags = part if flags is None else flags.unionByName(part)
    assert flags is not None
    found = {r["kind"]: int(r["count"]) for r in flags.groupBy("kind").count().collect()}
    return {kind: found.get(kind, 0) for kind in kinds}
