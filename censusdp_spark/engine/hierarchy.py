"""True node histograms for every level of the hierarchy, aggregated from the blocks in Spark.

``node_histograms`` returns ``level, geocode, cells, counts`` for every node of every level
(zero-population nodes included, with empty arrays). These are confidential: they feed the
measurement pass, the invariants and the evaluation, and are never written to a released table.
``children_not_summing_to_parent`` finds, in a release's long rows, the parent cells that their
children's do not sum to (the consistency both TopDown's and group sizes' checks promise).
"""

from __future__ import annotations

from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from censusdp_spark.model.geography import EVERY_LEVEL, Hierarchy, LevelSpan


def geocode_prefix(digits: int) -> Column:
    """The ``geocode`` column's first ``digits`` characters: a row's ancestor at the level with
    that many digits (the root's empty geocode for 0)."""
    return F.substring("geocode", 1, digits) if digits > 0 else F.lit("")


def children_not_summing_to_parent(
    rows: DataFrame, hierarchy: Hierarchy, cell: str, span: LevelSpan = EVERY_LEVEL
) -> DataFrame:
    """The ``level, geocode, <cell>`` cells of the nodes above the lowest level whose ``count``
    is not the sum of their children's (lazy; a row a cell). ``rows``: long format ``level,
    geocode, <cell>, count`` of the levels of ``span``; a cell missing on either side counts
    0."""
    sums = None
    levels = span.of(hierarchy)
    for parent, child in zip(levels, levels[1:], strict=False):
        prefix = geocode_prefix(parent.digits)
        part = rows.filter(F.col("level") == child.name).select(
            F.lit(parent.name).alias("level"), prefix.alias("geocode"), cell, "count"
        )
        sums = part if sums is None else sums.unionByName(part)
    assert sums is not None
    children = sums.groupBy("level", "geocode", cell).agg(F.sum("count").alias("children"))
    parents = rows.filter(F.col("level").isin([lv.name for lv in levels[:-1]]))
    return parents.join(children, ["level", "geocode", cell], "full_outer").filter(
        F.coalesce(F.col("count"), F.lit(0)) != F.coalesce(F.col("children"), F.lit(0))
    )


def node_histograms(blocks: DataFrame, hierarchy: Hierarchy) -> DataFrame:
    """All levels' node histograms, built bottom-up: the leaves are the block rows as they are;
    each level above sums the (node, cell) counts of the level below, so only the leaf level is
    ever exploded to one row per non-zero cell, and every aggregation after the first is small.
    Zero-population nodes keep a row with empty arrays."""
    levels = [
        blocks.select(F.lit(hierarchy.leaf.name).alias("level"), "geocode", "cells", "counts")
    ]
    below = blocks.select(
        "geocode", F.explode_outer(F.arrays_zip("cells", "counts")).alias("e")
    ).select("geocode", F.col("e.cells").alias("cell"), F.col("e.counts").alias("count"))
    for i, level in enumerate(reversed(hierarchy.levels[:-1])):
        node = geocode_prefix(level.digits)
        below = below.groupBy(node.alias("geocode"), "cell").agg(F.sum("count").alias("count"))
        if i == 0:
            # Every level above reads this one; Spark does not reuse its shuffle across the
            # union's branches, so keep it (a few million rows nationally) instead of redoing it.
            below = below.persist(StorageLevel.MEMORY_AND_DISK)
        levels.append(_sparse(below, level.name))
    return reduce(DataFrame.unionByName, levels)


def _sparse(long: DataFrame, level: str) -> DataFrame:
    """``geocode, cell, count`` (a null cell marks an empty node) -> one row per node."""
    nodes = long.groupBy("geocode").agg(
        F.sort_array(
            F.collect_list(F.when(F.col("cell").isNotNull(), F.struct("cell", "count")))
        ).alias("h")
    )
    return nodes.select(
        F.lit(level).alias("level"),
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


def nodes_per_level(leaves: DataFrame, hierarchy: Hierarchy) -> dict[str, int]:
    """The number of nodes of every level above (and at) the leaves ``geocode``s, in one job."""
    counts = leaves.agg(
        *[F.countDistinct(geocode_prefix(lv.digits)).alias(lv.name) for lv in hierarchy.levels]
    ).first()
    assert counts is not None
    return {lv.name: int(counts[lv.name]) for lv in hierarchy.levels}


def single_child_chains(nodes: DataFrame, hierarchy: Hierarchy) -> DataFrame:
    """The single-child structure of the geography, from the geocodes alone.

    ``nodes`` has ``level, geocode`` for every node of every level (any other column is
    ignored). Returns, for each node, ``level, geocode`` and:

    * ``children``: its number of children (0 at the leaves);
    * ``single_above``: per level above it, root first, whether its ancestor there has exactly
      one child;
    * ``chain_top``: the index of the highest level of the run of single-child ancestors
      directly above it, its own level's index when its parent has two or more children (or it
      is the root). The node and those ancestors hold the same leaves.

    A flat plan: the child counts of every node in one aggregation, then one join of every
    node's ancestors (exploded from its geocode's prefixes) with them. The result is persisted
    and materialised here: ``unpersist`` it when done.
    """
    names = F.array(*[F.lit(lv.name) for lv in hierarchy.levels])
    digits = F.array(*[F.lit(lv.digits) for lv in hierarchy.levels])
    indexed = nodes.select(
        "level", "geocode", (F.array_position(names, F.col("level")) - 1).cast("int").alias("i")
    )

    # The row's ancestor at level index ``j`` (columns ``digits`` and ``j``).
    ancestor = F.expr("substring(geocode, 1, element_at(digits, j + 1))").alias("ancestor")
    counts = (
        indexed.filter(F.col("i") > 0)
        .withColumn("digits", digits)
        .withColumn("j", F.col("i") - 1)
        .select("j", ancestor)
        .groupBy("j", "ancestor")
        .agg(F.count(F.lit(1)).cast("int").alias("children"))
    )
    above = (
        indexed.withColumn("digits", digits)
        .withColumn("j", F.explode(F.sequence(F.lit(0), F.col("i"))))  # itself too: j = i
        .withColumn("ancestor", ancestor)
        .join(counts, ["j", "ancestor"], "left")
        .groupBy("level", "geocode", "i")
        .agg(
            F.sort_array(
                F.collect_list(
                    F.when(
                        F.col("j") < F.col("i"),
                        F.struct("j", (F.col("children") == 1).alias("single")),
                    )
                )
            ).alias("a"),
            F.max(F.when(F.col("j") == F.col("i"), F.col("children"))).alias("own"),
        )
    )
    run = F.aggregate(
        F.col("single_above"), F.lit(0), lambda acc, x: F.when(x, acc + 1).otherwise(F.lit(0))
    )
    result = (
        above.select(
            "level",
            "geocode",
            "i",
            F.col("a.single").alias("single_above"),
            F.coalesce(F.col("own"), F.lit(0)).alias("children"),
        )
        .select(
            "level",
            "geocode",
            "children",
            "single_above",
            (F.col("i") - run).cast("int").alias("chain_top"),
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    result.count()
    return result
