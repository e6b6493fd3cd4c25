"""The public shape of a group-size release's geography, for the memory check at the door
(``group_sizes.memory``): the nodes of every level and the rows of a Spark Python call. No
count of groups is read."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.group_sizes.memory import ARROW_BATCH_ROWS
from censusdp_spark.model.geography import Hierarchy


def leaf_nodes(leaves: DataFrame, hierarchy: Hierarchy) -> DataFrame:
    """``level, geocode`` of every node above and at the leaves' ``geocode``s (one scan)."""
    node = [
        F.struct(F.lit(lv.name).alias("level"), geocode_prefix(lv.digits).alias("geocode"))
        for lv in hierarchy.levels
    ]
    pairs = leaves.select(F.explode(F.array(*node)).alias("node"))
    return pairs.select("node.level", "node.geocode").distinct()


def arrow_batch_rows(spark: SparkSession) -> int:
    """Rows per Python call of the session (``spark.sql.execution.arrow.maxRecordsPerBatch``;
    0 or less: no limit)."""
    value = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", None)
    return ARROW_BATCH_ROWS if value is None else int(value)
