"""Delta Lake tables of a release: each written whole in one transaction, read back by name."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

NOISY_MEASUREMENTS = "noisy_measurements"
ESTIMATES = "estimates"
MICRODATA = "microdata"
EVALUATION_TABLE = "table"
"""The Delta table of errors against the truth, in a run's evaluation folder (never its output)."""
EVALUATION_CSV = "errors.csv"


def table_path(output: Path, name: str) -> str:
    """Absolute: a Spark Connect server resolves a relative path from its own folder."""
    return str((output / name).absolute())


def write_table(df: DataFrame, output: Path, name: str, partition_by: str | None = None) -> None:
    """Create a table in one Delta transaction; an existing table is an error."""
    writer = df.write.format("delta").mode("error")  # "errorifexists"; Connect knows this name
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.save(table_path(output, name))


def write_level(df: DataFrame, output: Path, name: str, level: str) -> None:
    """Write one level's partition atomically (re-running a level replaces only that level)."""
    write_levels(df, output, name, [level])


def write_levels(df: DataFrame, output: Path, name: str, levels: Sequence[str]) -> None:
    """Write the partitions of ``levels`` in one atomic commit (``df`` holds only their rows;
    other levels' partitions are kept)."""
    listed = ", ".join(f"'{level}'" for level in levels)
    (
        df.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"level IN ({listed})")
        .partitionBy("level")
        .save(table_path(output, name))
    )


def read_table(spark: SparkSession, output: Path, name: str) -> DataFrame:
    return spark.read.format("delta").load(table_path(output, name))


def is_table(output: Path, name: str) -> bool:
    """Whether ``output/name`` holds a Delta table (at least one commit)."""
    return any((output / name / "_delta_log").glob("*.json"))


def remove_uncommitted_files(spark: SparkSession, output: Path, name: str) -> list[Path]:
    """Delete what a killed write left in table ``name``: the data files its Delta log does not
    reference (the whole folder when nothing was committed). Delta readers never see such files,
    but a plain-Parquet reader of the folder would count them. Only files the current version
    does not reference go, as ``VACUUM ... RETAIN 0 HOURS`` would remove them: older versions
    are not kept for time travel. Call only under the run's lock (no concurrent writer).
    Returns what was removed."""
    folder = output / name
    if not folder.is_dir():
        return []
    if not is_table(output, name):
        shutil.rmtree(folder)
        return [folder]
    live = {
        Path(unquote(urlparse(uri).path)).resolve()
        for uri in read_table(spark, output, name).inputFiles()
    }
    removed = []
    for path in sorted(folder.rglob("*.parquet")):
        if "_delta_log" in path.relative_to(folder).parts or path.resolve() in live:
            continue
        path.unlink()
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)  # the local file system's
        removed.append(path)
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        if "_delta_log" not in sub.relative_to(folder).parts and not any(sub.iterdir()):
            sub.rmdir()
    return removed


def long_cells(hist: DataFrame) -> DataFrame:
    """``level, geocode, cells, counts`` -> one row per non-zero cell ``level, geocode, cell, count``."""
    return hist.select(
        "level", "geocode", F.explode(F.arrays_zip("cells", "counts")).alias("e")
    ).select("level", "geocode", F.col("e.cells").alias("cell"), F.col("e.counts").alias("count"))


def sparse_nodes(long: DataFrame) -> DataFrame:
    """Inverse of ``long_cells`` (nodes with no non-zero cell do not appear)."""
    return (
        long.groupBy("level", "geocode")
        .agg(F.sort_array(F.collect_list(F.struct("cell", "count"))).alias("h"))
        .select(
            "level", "geocode", F.col("h.cell").alias("cells"), F.col("h.count").alias("counts")
        )
    )
