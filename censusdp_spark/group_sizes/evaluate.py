"""The evaluation of a group-size release against the truth (``--evaluate``): per level, the
mean L1 and earthmover distances per node, as a table and a plot. It reads the true
histograms, so it is internal: written beside the release (``<output>.evaluation``), never in
it, and never for release."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from censusdp_spark.io import delta
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.release.error_plot import ErrorLine, plot_error_by_level


def evaluation(nodes: DataFrame, released: DataFrame) -> DataFrame:
    """Per level, over its nodes: ``l1_mean``, the mean L1 distance between released and true
    histograms (``sum_j |x_j - n_j|``, as ``bench_pgsr.py`` and ``docs/how-it-works.md`` report it), and
    the earthmover distance (L1 between cumulative histograms), mean and max. Uses the truth:
    internal only."""
    truth = nodes.select(
        "level", "geocode", F.explode(F.arrays_zip("cells", "counts")).alias("e")
    ).select(
        "level", "geocode", (F.col("e.cells") + 1).alias("size"), F.col("e.counts").alias("true")
    )
    diff = released.join(truth, ["level", "geocode", "size"], "full_outer").select(
        "level",
        "geocode",
        "size",
        (F.coalesce("count", F.lit(0)) - F.coalesce("true", F.lit(0))).alias("d"),
    )
    running = F.sum("d").over(Window.partitionBy("level", "geocode").orderBy("size"))
    per_node = (
        diff.withColumn("cumulative", running)
        .groupBy("level", "geocode")
        .agg(
            F.sum(F.abs("d")).alias("l1"),
            F.sum(F.abs("cumulative")).alias("emd"),
        )
    )
    return per_node.groupBy("level").agg(
        F.count("*").alias("nodes"),
        F.avg("l1").alias("l1_mean"),
        F.avg("emd").alias("emd_mean"),
        F.max("emd").cast("double").alias("emd_max"),
    )


def plot_level_errors(frame: pd.DataFrame, path: Path, title: str) -> None:
    """PNG of the mean L1 and EMD per node, level by level (internal, like the table)."""
    plot_error_by_level(
        list(frame["level"]),
        [
            ErrorLine(frame[metric], label, {"marker": "o"})
            for metric, label in (("l1_mean", "L1 per node"), ("emd_mean", "EMD per node"))
        ],
        "mean error per node (groups)",
        title,
        path,
    )


def write_evaluation(
    spark: SparkSession,
    nodes: DataFrame,
    released: DataFrame,
    folder: Path,
    hierarchy: Hierarchy,
    title: str,
) -> list[dict[str, Any]]:
    """Write the evaluation of ``released`` against the true ``nodes`` to ``folder`` (a Delta
    table, the same as CSV with the levels root first, and ``error_by_level.png`` titled
    ``title``); return its rows, root first."""
    delta.write_table(evaluation(nodes, released), folder, delta.EVALUATION_TABLE)
    frame = pd.DataFrame(delta.read_table(spark, folder, delta.EVALUATION_TABLE).toPandas())
    order = {lv: i for i, lv in enumerate(hierarchy.names)}
    frame = frame.sort_values("level", key=lambda s: s.map(order)).reset_index(drop=True)
    frame.to_csv(folder / delta.EVALUATION_CSV, index=False)
    plot_level_errors(frame, folder / "error_by_level.png", title)
    return frame.to_dict("records")
