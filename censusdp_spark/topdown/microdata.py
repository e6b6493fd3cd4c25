"""Person-level microdata regenerated from the block-level estimates: one row per person."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from censusdp_spark.topdown.schema import Schema


def attribute_columns(schema: Schema, cell: str = "cell") -> list[Column]:
    """One column per attribute of ``schema``, named after it: the level label of the row-major
    cell index in column ``cell`` (Spark's counterpart of ``Schema.labels_of``)."""
    strides = schema.strides()
    columns = []
    for pos, attr in enumerate(schema.attributes):
        index = (F.col(cell) / int(strides[pos])).cast("long") % attr.size
        labels = F.array(*[F.lit(v) for v in attr.levels])
        columns.append(F.element_at(labels, (index + 1).cast("int")).alias(attr.name))
    return columns


def microdata(block_estimates: DataFrame, schema: Schema) -> DataFrame:
    """``geocode`` plus one column per attribute (its level label), ``count`` rows per cell."""
    persons = block_estimates.select(
        "geocode",
        "cell",
        F.explode(F.array_repeat(F.lit(1), F.col("count").cast("int"))).alias("_one"),
    )
    return persons.select(F.col("geocode"), *attribute_columns(schema))
