"""True node histograms for every level of the hierarchy, aggregated from the blocks in Spark.

``node_histograms`` returns ``level, geocode, cells, counts`` for every node of every level
(zero-population nodes included, with empty arrays). These are confidential: they feed the
measurement pass, the invariants and the evaluation, and are never written to a released table.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.model.geography import Hierarchy


def node_histograms(blocks: DataFrame, hierarchy: Hierarchy) -> DataFrame:
    """All levels' node histograms in one aggregation: every block row is fanned out to its
    ancestor at each level, then summed by (level, node, cell). Zero-population nodes keep a
    row with empty arrays."""
    ancestors = F.array(
        *[
            F.struct(
                F.lit(lv.name).alias("level"),
                (F.substring("geocode", 1, lv.digits) if lv.digits else F.lit("")).alias("node"),
            )
            for lv in hierarchy.levels
        ]
    )
    fanned = blocks.select(
        F.explode(ancestors).alias("a"), F.explode_outer(F.arrays_zip("cells", "counts")).alias("e")
    )
    sums = fanned.groupBy(
        F.col("a.level").alias("level"),
        F.col("a.node").alias("geocode"),
        F.col("e.cells").alias("cell"),
    ).agg(F.sum("e.counts").alias("count"))
    nodes = sums.groupBy("level", "geocode").agg(
        F.sort_array(
            F.collect_list(F.when(F.col("cell").isNotNull(), F.struct("cell", "count")))
        ).alias("h")
    )
    return nodes.select(
        "level",
        "geocode",
        F.col("h.cell").cast("array<int>").alias("cells"),
        F.col("h.count").cast("array<bigint>").alias("counts"),
    )


def node_totals(nodes: DataFrame) -> DataFrame:
    """``level, geocode, total`` for node histograms."""
    return nodes.select(
        "level",
        "geocode",
        F.aggregate("counts", F.lit(0).cast("long"), lambda a, b: a + b).alias("total"),
    )
