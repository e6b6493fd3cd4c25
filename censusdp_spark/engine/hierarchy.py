"""True node histograms for every level of the hierarchy, aggregated from the blocks in Spark.

``node_histograms`` returns ``level, geocode, cells, counts`` for every node of every level
(zero-population nodes included, with empty arrays). These are confidential: they feed the
measurement pass, the invariants and the evaluation, and are never written to a released table.
"""

from __future__ import annotations

from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from censusdp_spark.model.geography import Hierarchy


def geocode_prefix(digits: int) -> Column:
    """The ``geocode`` column's first ``digits`` characters: a row's ancestor at the level with
    that many digits (the root's empty geocode for 0)."""
    return F.substring("geocode", 1, digits) if digits > 0 else F.lit("")


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
    """The single-child structure of the geography, from the geocodes alone (lazy).

    ``nodes`` has ``level, geocode`` for every node of every level (any other column is
    ignored). Returns, for each node, ``level, geocode`` and:

    * ``children``: its number of children (0 at the leaves);
    * ``single_above``: per level above it, root first, whether its ancestor there has exactly
      one child;
    * ``chain_top``: the index of the highest level of the run of single-child ancestors
      directly above it, its own level's index when its parent has two or more children (or it
      is the root). The node and those ancestors hold the same leaves.

    Built top-down, one join per level on the parent's geocode, each level kept before the
    next reads it (one small job per level; the levels above the leaves are small). The result
    is persisted and materialised here: ``unpersist`` it when done.
    """
    levels = hierarchy.levels
    geocodes = nodes.select("level", "geocode")
    frames: list[DataFrame] = []
    above: DataFrame | None = None
    for i, level in enumerate(levels):
        here = geocodes.filter(F.col("level") == level.name).select("geocode")
        if i + 1 < len(levels):
            counts = (
                geocodes.filter(F.col("level") == levels[i + 1].name)
                .groupBy(geocode_prefix(level.digits).alias("geocode"))
                .agg(F.count(F.lit(1)).cast("int").alias("children"))
            )
            here = here.join(counts, "geocode", "left").fillna(0, ["children"])
        else:
            here = here.withColumn("children", F.lit(0))
        if above is None:
            here = here.select(
                "geocode",
                "children",
                F.array().cast("array<boolean>").alias("single_above"),
                F.lit(i).alias("chain_top"),
            )
        else:
            single = F.col("parent_children") == 1
            parents = above.select(
                F.col("geocode").alias("parent"),
                F.col("children").alias("parent_children"),
                F.col("single_above").alias("parent_single_above"),
                F.col("chain_top").alias("parent_chain_top"),
            ).select(
                "parent",
                F.concat("parent_single_above", F.array(single)).alias("single_above"),
                F.when(single, F.col("parent_chain_top")).otherwise(F.lit(i)).alias("chain_top"),
            )
            here = (
                here.withColumn("parent", geocode_prefix(levels[i - 1].digits))
                .join(parents, "parent")
                .select("geocode", "children", "single_above", "chain_top")
            )
        # Kept and counted, so that the next level's join reads it instead of redoing every
        # join above it.
        here = here.persist(StorageLevel.MEMORY_AND_DISK)
        here.count()
        above = here
        frames.append(here)
    result = reduce(
        DataFrame.unionByName,
        [
            f.select(F.lit(lv.name).alias("level"), "*")
            for f, lv in zip(frames, levels, strict=True)
        ],
    ).persist(StorageLevel.MEMORY_AND_DISK)
    result.count()
    for frame in frames:
        frame.unpersist()
    return result
