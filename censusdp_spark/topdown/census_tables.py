"""The released P.L. 94-171 tables (``[output.pl94_tables]``): P1-P5 and H1 of every node in the
Census's shape, as the Delta table ``pl94_tables`` and one CSV per level in ``pl94_tables_csv/``.

Post-processing of the released ``estimates`` only (``topdown.pl94_tables`` computes every field
from a node's estimated cells), so they cost no privacy budget. The geography is the run's node list,
which depends on the spine alone: a node whose estimates are all zero (absent from the sparse
``estimates``) has every field 0. Columns: ``level``, ``SUMLEV`` (the Census summary level of
the level's digits, null for other digits), ``GEOCODE`` (the node's geocode: ``STATE + COUNTY +
TRACT + ...``, as in the legacy geoheader), then every field of every table asked for
(``P0010001`` ...), in the file's order. The CSV files hold the same rows sorted by geocode,
without ``level`` (it names the file), with a header row.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.io import delta
from censusdp_spark.model.geography import EVERY_LEVEL, LevelSpan
from censusdp_spark.topdown.config import Pl94TablesSpec, TopDownConfig
from censusdp_spark.topdown.pl94_tables import (
    SUMMARY_LEVEL_OF_DIGITS,
    field_matrix,
    table_fields,
    table_values,
)
from censusdp_spark.topdown.schema import Schema

PL94_TABLES = "pl94_tables"
PL94_TABLES_CSV = "pl94_tables_csv"
STAGING = "_staging"  # Spark's CSV output, before each level's one file is moved out of it


def cell_codes(spec: Pl94TablesSpec, schema: Schema) -> dict[str, np.ndarray]:
    """Each Census variable's code at every cell of ``schema``."""
    levels = schema.levels_of(np.arange(schema.n_cells))
    codes = {}
    for v in spec.variables:
        pos = schema.names.index(v.attribute)
        code_of = {level: code for code, level in v.level_of.items()}
        codes[v.name] = np.array([code_of[lv] for lv in schema.attributes[pos].levels])[
            levels[:, pos]
        ]
    return codes


def table_matrix(spec: Pl94TablesSpec, schema: Schema) -> tuple[tuple[str, ...], np.ndarray]:
    """The field names of the tables asked for, and the matrix from schema cells to them."""
    fields = table_fields(spec.tables)
    matrix = field_matrix(fields, cell_codes(spec, schema), schema.n_cells)
    return tuple(f.name for f in fields), matrix


def census_tables(estimates: DataFrame, geography: DataFrame, config: TopDownConfig) -> DataFrame:
    """Every node's tables from the long ``estimates`` (``level, geocode, cell, count``), one row
    per node of ``geography`` (``level, geocode``)."""
    assert config.pl94_tables is not None
    names, matrix = table_matrix(config.pl94_tables, config.schema)
    ddl = ", ".join(["level string", "geocode string", *(f"{n} bigint" for n in names)])
    values = delta.sparse_nodes(estimates).mapInPandas(
        partial(_fields, names=names, matrix=matrix), ddl
    )
    sumlev = F.create_map(
        *[
            F.lit(x)
            for lv in config.hierarchy.levels
            if lv.digits in SUMMARY_LEVEL_OF_DIGITS
            for x in (lv.name, SUMMARY_LEVEL_OF_DIGITS[lv.digits])
        ]
    )
    return (
        geography.join(values, ["level", "geocode"], "left")
        .fillna(0, list(names))
        .select(
            "level",
            sumlev[F.col("level")].alias("SUMLEV"),
            F.col("geocode").alias("GEOCODE"),
            *names,
        )
    )


def _fields(
    batches: Iterable[pd.DataFrame], names: tuple[str, ...], matrix: np.ndarray
) -> Iterable[pd.DataFrame]:
    for batch in batches:
        values = table_values(list(batch["cells"]), list(batch["counts"]), matrix)
        fields = pd.DataFrame(values, columns=list(names), index=batch.index)
        yield pd.concat([batch[["level", "geocode"]], fields], axis=1)


def write_census_tables(
    spark: SparkSession,
    estimates: DataFrame,
    geography: DataFrame,
    config: TopDownConfig,
    span: LevelSpan = EVERY_LEVEL,
) -> list[str]:
    """Write ``pl94_tables`` (replacing what an earlier attempt left) and its CSV copies from
    it, of the levels of ``span``; returns the CSV files, relative to the output folder."""
    output = config.run.output
    for name in (PL94_TABLES, PL94_TABLES_CSV):
        shutil.rmtree(output / name, ignore_errors=True)  # an earlier attempt's: rewritten whole
    tables = census_tables(estimates, geography, config)
    delta.write_table(tables, output, PL94_TABLES, partition_by="level")
    written = delta.read_table(spark, output, PL94_TABLES)
    levels = span.names(config.hierarchy)
    return [
        str(p.relative_to(output)) for p in _write_csv(written, output / PL94_TABLES_CSV, levels)
    ]


def _write_csv(tables: DataFrame, folder: Path, levels: Iterable[str]) -> list[Path]:
    """``<level>.csv`` per level, sorted by geocode: one Spark job, each level's rows in one
    task (so one file), moved out of the staging folder."""
    staging = folder / STAGING
    (
        tables.repartition("level")
        .sortWithinPartitions("level", "GEOCODE")
        .write.partitionBy("level")
        .option("header", True)
        .csv(delta.table_path(folder, STAGING))
    )
    files = []
    for level in levels:
        (part,) = (staging / f"level={level}").glob("part-*.csv")
        files.append(part.rename(folder / f"{level}.csv"))
    shutil.rmtree(staging)
    return files
