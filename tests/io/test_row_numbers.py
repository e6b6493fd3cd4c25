"""``row_number_of`` names a row by its place in the input, over any number of partitions."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from censusdp_spark.io.readers import row_number_of


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_the_first_matching_row_is_named_by_its_place_in_order(spark, partitions):
    df = spark.range(0, 1000, numPartitions=partitions)
    assert row_number_of(df, F.col("id") == 0) == 1
    assert row_number_of(df, F.col("id") == 777) == 778
    # several matches, in different partitions: the first in order wins
    assert row_number_of(df, (F.col("id") == 951) | (F.col("id") == 402)) == 403


def test_a_null_condition_is_no_match(spark):
    df = spark.createDataFrame([(None,), (5,), (7,)], "x int")
    assert row_number_of(df, F.col("x") > 6) == 3


def test_a_csv_row_is_numbered_in_file_order(spark, tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("v\n" + "".join(f"{i}\n" for i in range(5000)))
    spark.conf.set("spark.sql.files.maxPartitionBytes", "4096")  # several splits of one file
    try:
        df = spark.read.option("header", True).csv(str(path))
        assert df.select(F.spark_partition_id().alias("p")).distinct().count() > 1
        assert row_number_of(df, F.col("v") == "4321") == 4322
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
