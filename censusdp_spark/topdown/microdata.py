"""Person-level microdata regenerated from the block-level estimates: one row per person."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.topdown.schema import Schema


def microdata(block_estimates: DataFrame, schema: Schema) -> DataFrame:
    """``geocode`` plus one column per attribute (its level label), ``count`` rows per cell."""
    persons = block_estimates.select(
        "geocode",
        "cell",
        F.explode(F.array_repeat(F.lit(1), F.col("count").cast("int"))).alias("_one"),
    )
    strides = schema.strides()
    columns = [F.col("geocode")]
    for pos, attr in enumerate(schema.attributes):
        index = (F.col("cell") / int(strides[pos])).cast("long") % attr.size
        labels = F.array(*[F.lit(v) for v in attr.levels])
        columns.append(F.element_at(labels, (index + 1).cast("int")).alias(attr.name))
    return persons.select(*columns)
