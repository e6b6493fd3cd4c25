"""Read and write the Census Noisy Measurement File (NMF) layout in Spark (``topdown.nmf_layout``
says what the layout is and which of its parts we write and read).

``write_nmf`` writes a run's ``noisy_measurements`` table and its invariants in the layout, one
file per folder as BlueDown's reader wants. ``read_nmf`` reads such a file (ours or the
Census's) back as our tables; it is a Spark job end to end (a national file is hundreds of GB):
only small aggregates reach the driver (the first rule broken; the distinct variances when the
file has no exact ``sigma2`` column). Every rule is checked before anything is returned or
written, and a file breaking one is refused with one ``InputError`` (a ``ValueError``) naming the
level folder, the row (geocode and query) and the rule. Checks: each level's folder is there
with its columns; a geocode has its level's digits and sits in its ``State`` folder; a query is
one the config has at that level, with the config's ``query_shape`` (the cell order check) and
that many cells; a variance is positive (and agrees with ``sigma2``); no (geocode, query) twice;
every node has all its level's queries; every node's parent is in the file; a total constraint
is one count, is not given twice with two values, and is the sum of its children's where the
level below has totals.

A run that bypasses single-child parents (``[budget] bypass_single_child``) leaves nodes
unmeasured, which the layout cannot hold (every node has its measurements): ``write_nmf``
refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.model.errors import ConfigError, InputError
from censusdp_spark.topdown.config import TopDownConfig
from censusdp_spark.topdown.measure import NOISY_SCHEMA
from censusdp_spark.topdown.nmf_checks import check_tables, query_info, with_level
from censusdp_spark.topdown.nmf_layout import (
    CONSTRAINT,
    CONSTRAINT_COLUMNS,
    DPQ_SUFFIX,
    DPQUERY,
    DPQUERY_COLUMNS,
    EXACT_VARIANCE,
    KINDS,
    LEVEL_SUFFIX,
    STATE_LEVEL,
    STATE_PARTITION,
    TOTAL_CONSTRAINT,
    dpq_name,
    exact_variance,
    level_folder,
    nmf_level_names,
    root_folders,
    state_folder,
    state_folders,
)

RELATIVE_VARIANCE_TOLERANCE = 1e-12
"""How far a file's ``variance`` may be from its ``sigma2`` (both exact would round alike)."""


@dataclass(frozen=True)
class NmfMeasurements:
    """A read NMF as our tables (lazy DataFrames): ``noisy`` in ``measure.NOISY_SCHEMA`` with our
    level and query names and ``budget_levels = [level]``; ``invariants`` as ``level, geocode,
    inv_total``; ``geography`` as ``level, geocode``, every node of every level."""

    noisy: DataFrame
    invariants: DataFrame
    geography: DataFrame


# --- writing --------------------------------------------------------------------------------


def write_nmf(
    spark: SparkSession, noisy: DataFrame, invariants: DataFrame, config: TopDownConfig, out: Path
) -> None:
    """Write ``noisy`` (``measure.NOISY_SCHEMA``) and ``invariants`` (``level, geocode,
    inv_total``) to a new folder ``out`` in the NMF layout (``nmf_layout``), one Parquet file per
    level folder and State folder. The tables are checked first (the reader's rules, the
    ``sigma2`` against the config's budget, in one Spark job); nothing is written if one is
    broken."""
    if config.bypass_single_child:
        raise ConfigError(
            config.source,
            "budget.bypass_single_child",
            "the NMF layout measures every node; a run that bypasses single-child parents"
            " leaves some unmeasured",
        )
    if out.exists() and any(out.iterdir()):
        raise InputError(str(out), "folder", "exists and is not empty (the NMF goes to a new one)")
    root = out.absolute()
    state = F.col("geocode").substr(1, config.hierarchy.levels[STATE_LEVEL].digits)
    query = query_info(config, F.col("query"))
    rows = (
        with_level(noisy, config, root, "dpq_folder").select(
            "level",
            "order",
            "digits",
            "folder",
            "geocode",
            query["query"].alias("query"),
            F.concat(F.col("query"), F.lit(dpq_name(""))).alias("query_name"),
            query["shape"].alias("shape"),
            query["shape"].alias("query_shape"),
            query["cells"].alias("cells"),
            F.col("noisy").cast("array<bigint>").alias("value"),
            _as_double(F.col(EXACT_VARIANCE)).alias("variance"),
            EXACT_VARIANCE,
            query["config_sigma2"].alias("config_sigma2"),
            state.alias("state"),
        )
    ).persist(StorageLevel.MEMORY_AND_DISK)
    totals = with_level(invariants, config, root, "con_folder").select(
        "level",
        "order",
        "digits",
        "folder",
        "geocode",
        F.lit(TOTAL_CONSTRAINT).alias("query_name"),
        F.col("inv_total").cast("bigint").alias("inv_total"),
    )
    try:
        exact = F.col(EXACT_VARIANCE) == F.col("config_sigma2")
        check_tables(
            rows, totals, config, root, (exact, "sigma2 is not the config's for the query")
        )
        with_totals = {r["level"] for r in totals.groupBy("level").count().collect()}
        _write_levels(rows, totals, config, root, with_totals)
    finally:
        rows.unpersist()


def _as_double(fraction: Column) -> Column:
    """A fraction's text ``a/b`` (or ``a``) as a double (null if it is not one)."""
    parts = F.split(fraction, "/")
    den = F.coalesce(F.get(parts, 1).try_cast("double"), F.lit(1.0))
    return F.get(parts, 0).try_cast("double") / den


def _write_levels(
    rows: DataFrame, totals: DataFrame, config: TopDownConfig, root: Path, with_totals: set[str]
) -> None:
    """Each level's DPQuery and (where it has totals) Constraint files, one per folder."""
    names = nmf_level_names(config)
    ones = F.array(*[F.lit(1)] * len(config.schema.attributes))
    for i, level in enumerate(config.hierarchy.names):
        dpq = rows.filter(F.col("level") == level).select(
            "geocode",
            "query_name",
            F.col("query_shape").cast("array<int>"),
            "value",
            "variance",
            EXACT_VARIANCE,
            F.col("state").alias(STATE_PARTITION),
        )
        con = totals.filter(F.col("level") == level).select(
            "geocode",
            "query_name",
            F.lit("=").alias("sign"),
            ones.alias("query_shape"),
            F.array("inv_total").alias("value"),
            F.lit(0.0).alias("variance"),
            F.col("geocode")
            .substr(1, config.hierarchy.levels[STATE_LEVEL].digits)
            .alias(STATE_PARTITION),
        )
        written = [(DPQUERY, dpq)] + ([(CONSTRAINT, con)] if level in with_totals else [])
        for kind, df in written:
            folder = str(level_folder(root, names[level], kind))
            if i == 0:
                df.drop(STATE_PARTITION).coalesce(1).write.parquet(folder)
            else:
                df.repartition(STATE_PARTITION).write.partitionBy(STATE_PARTITION).parquet(folder)
        _match_state_folders(
            level_folder(root, names[level], DPQUERY), level_folder(root, names[level], CONSTRAINT)
        )
    _remove_side_files(root)


def _match_state_folders(dpq: Path, con: Path) -> None:
    """A Constraint folder (empty where the level has no totals) for the root and for each
    State folder of the DPQuery: BlueDown lists a level's Constraint folder before reading it."""
    con.mkdir(parents=True, exist_ok=True)
    for state in dpq.glob(f"{STATE_PARTITION}=*"):
        (con / state.name).mkdir(exist_ok=True)


def _remove_side_files(root: Path) -> None:
    """Drop Spark's ``_SUCCESS`` and checksum files: BlueDown reads the one file of a folder."""
    for path in root.rglob("*"):
        if path.is_file() and path.name.startswith((".", "_")):
            path.unlink()


# --- reading --------------------------------------------------------------------------------


def read_nmf(
    spark: SparkSession,
    path: Path,
    config: TopDownConfig,
    states: tuple[str, ...] = (),
    root_only: bool = False,
) -> NmfMeasurements:
    """The NMF at ``path`` as our tables (``NmfMeasurements``), checked against ``config``.

    With ``states``, only their ``State=<code>`` folders are read (``check_states`` first): the
    levels below the root, each state's nodes; the root's folder and the other states' are not
    opened, and a state node's parent (the root) is not looked for. With ``root_only``, only
    the root level's folders (the nation's measurements and total, which assembling the nation
    from state runs adds to theirs).

    ``sigma2`` is the file's ``sigma2`` column where it has one (ours), else the exact value of
    its float ``variance`` (``nmf_layout.exact_variance``). Raises ``InputError`` naming the level
    folder, the row and the rule, for the first rule the file breaks (module docstring)."""
    root = path.absolute()
    if states:
        check_states(root, config, states)
        folders = state_folders(root, config, states)
    else:
        levels = nmf_level_names(config)
        folders = [level_folder(root, n, kind) for n in levels.values() for kind in KINDS]
        if root_only:
            levels = {config.hierarchy.root.name: levels[config.hierarchy.root.name]}
            folders = root_folders(root, config)
        for level, nmf_level in levels.items():
            folder = level_folder(root, nmf_level, DPQUERY)
            if not _data_files(folder):
                raise InputError(
                    str(folder),
                    "folder",
                    f"missing: level {level} has no measurements (every level of the hierarchy"
                    " has)",
                )
    dpq = _read_kind(spark, root, config, DPQUERY, DPQUERY_COLUMNS, folders)
    sigma2 = F.col(EXACT_VARIANCE) if EXACT_VARIANCE in dpq.columns else F.lit(None)
    rows = dpq.select(
        "level",
        "order",
        "digits",
        "folder",
        "state",
        F.col("geocode").cast("string"),
        F.col("query_name").cast("string"),
        F.col("query_shape").cast("array<int>"),
        F.col("value").cast("array<bigint>"),
        F.col("variance").cast("double"),
        sigma2.cast("string").alias(EXACT_VARIANCE),
    )
    query = query_info(config, _query_key(F.col("query_name")))
    rows = rows.withColumns({c: query[c] for c in ("query", "cells", "shape")})
    totals = _totals(spark, root, config, folders)
    variance = _as_double(F.col(EXACT_VARIANCE))
    exact = F.col(EXACT_VARIANCE).isNull() | (
        F.abs(variance - F.col("variance")) <= F.col("variance") * RELATIVE_VARIANCE_TOLERANCE
    )
    check_tables(
        rows,
        totals,
        config,
        root,
        (exact, "sigma2 does not agree with the variance"),
        top=STATE_LEVEL if states else 0,
    )
    noisy = rows.select(
        "level",
        "geocode",
        "query",
        F.col("value").alias("noisy"),
        F.coalesce(EXACT_VARIANCE, _exact_variances(rows)).alias("sigma2"),
        F.array("level").alias("budget_levels"),
    )
    node = ["level", "geocode"]
    return NmfMeasurements(
        noisy=noisy.select(*_columns(NOISY_SCHEMA)),
        invariants=totals.select(*node, "inv_total").dropDuplicates(),
        geography=rows.select(*node).unionByName(totals.select(*node)).distinct(),
    )


def file_states(root: Path, config: TopDownConfig) -> list[str]:
    """The codes of the file's states: its State level's ``State=<code>`` folders, sorted
    (folder names only; no file is read)."""
    state_level = config.hierarchy.levels[STATE_LEVEL].name
    top = level_folder(root, nmf_level_names(config)[state_level], DPQUERY)
    return sorted(
        p.name.removeprefix(f"{STATE_PARTITION}=")
        for p in (top.glob(f"{STATE_PARTITION}=*") if top.is_dir() else [])
    )


def check_states(root: Path, config: TopDownConfig, states: tuple[str, ...]) -> None:
    """Each of ``states`` is a ``State=<code>`` folder of the file's State level, with its
    measurements at every level below the root (an ``InputError`` in one line otherwise: a
    code of the wrong length, one the file does not have, a level without the state's
    folder). Only folder names are listed; no file is read."""
    names = nmf_level_names(config)
    levels = config.hierarchy.levels
    state_level = levels[STATE_LEVEL]
    top = level_folder(root, names[state_level.name], DPQUERY)
    known = file_states(root, config)
    for state in states:
        if len(state) != state_level.digits:
            raise InputError(
                str(top),
                f"state {state!r}",
                f"not a state code: level {state_level.name}'s geocodes have"
                f" {state_level.digits} characters",
            )
        if state not in known:
            raise InputError(
                str(top),
                f"state {state!r}",
                f"unknown: the file has no {STATE_PARTITION}={state} folder"
                f" ({len(known)} states: {', '.join(known[:10])}{', ...' if len(known) > 10 else ''})",
            )
        for level in levels[STATE_LEVEL:]:
            folder = state_folder(root, names[level.name], DPQUERY, state)
            if not _data_files(folder):
                raise InputError(
                    str(folder),
                    "folder",
                    f"missing: state {state} has no measurements at level {level.name} (a"
                    " state's run reads its folder of every level below the root)",
                )


def _columns(schema: str) -> list[Column]:
    """The columns of a DDL schema (``name type, ...``), each cast to its type."""
    fields = [f.strip().split(" ", 1) for f in schema.split(",")]
    return [F.col(name).cast(kind).alias(name) for name, kind in fields]


def _query_key(name: Column) -> Column:
    """``nmf_layout.query_key`` in Spark."""
    bare = F.regexp_replace(F.trim(name), f"{DPQ_SUFFIX}$", "")
    return F.trim(F.regexp_replace(bare, r"\s*\*\s*", " * "))


def _data_files(folder: Path) -> bool:
    return folder.is_dir() and any(
        p.is_file() and not p.name.startswith((".", "_")) for p in folder.rglob("*")
    )


def _read_kind(
    spark: SparkSession,
    root: Path,
    config: TopDownConfig,
    kind: str,
    columns: Sequence[str],
    folders: Sequence[Path],
) -> DataFrame:
    """Every Parquet file of the ``kind`` folders among ``folders`` that have one, in one read (no partition inference: ``State=01`` stays
    text; the files' schemas merged), with ``level``, its ``order, digits, folder`` and
    ``state`` (the ``State=`` folder) from each file's path. A column no file has is refused."""
    names = nmf_level_names(config)
    present = [str(f) for f in _of_kind(folders, kind) if _data_files(f)]
    try:
        df = (
            spark.read.option("recursiveFileLookup", "true")
            .option("mergeSchema", "true")
            .parquet(*present)
        )
    except Exception as err:  # noqa: BLE001 - Spark's and Py4J's errors alike
        raise InputError(
            str(root), f"{kind} files", f"unreadable: {str(err).splitlines()[0][:300]}"
        ) from None
    for column in columns:
        if column not in df.columns:
            raise InputError(
                str(root), f"column {column}", f"missing (the layout has {', '.join(columns)})"
            )
    file = F.col("_metadata.file_path")
    nmf_level = F.regexp_extract(file, f"^.*/([^/]+){LEVEL_SUFFIX}/{kind}/", 1)
    ours = F.create_map(*[F.lit(x) for n, o in names.items() for x in (o, n)])
    df = df.withColumns(
        {
            "level": ours[nmf_level],
            "state": F.regexp_extract(file, f"/{STATE_PARTITION}=([^/]+)/", 1),
        }
    )
    return with_level(df, config, root, "dpq_folder" if kind == DPQUERY else "con_folder")


def _of_kind(folders: Sequence[Path], kind: str) -> list[Path]:
    """The ``kind`` folders among a read's (level folders and ``State=`` folders alike)."""
    return [f for f in folders if kind in (f.name, f.parent.name)]


def _totals(
    spark: SparkSession, root: Path, config: TopDownConfig, folders: Sequence[Path]
) -> DataFrame:
    """The total constraints (the other constraints are not ours): ``level, order, digits,
    folder, geocode, query_name, inv_total``; a total that is not one non-negative count gets
    another ``query_name``, so that ``nmf_checks`` refuses it."""
    if not any(_data_files(f) for f in _of_kind(folders, CONSTRAINT)):
        empty = (
            "level string, order int, digits int, folder string, geocode string,"
            " query_name string, inv_total bigint"
        )
        return spark.createDataFrame([], empty)
    df = _read_kind(spark, root, config, CONSTRAINT, CONSTRAINT_COLUMNS, folders)
    value = F.col("value").cast("array<bigint>")
    one = (F.size(value) == 1) & (F.get(value, 0) >= 0)
    return df.filter(F.col("query_name") == TOTAL_CONSTRAINT).select(
        "level",
        "order",
        "digits",
        "folder",
        F.col("geocode").cast("string"),
        F.when(one, F.col("query_name")).otherwise(F.lit("not_one_count")).alias("query_name"),
        F.get(value, 0).alias("inv_total"),
    )


def _exact_variances(rows: DataFrame) -> Column:
    """The exact fraction of each row's ``variance`` (for rows without ``sigma2``): the distinct
    variances are few (one per level and query in the Census's file), so they are collected and
    converted on the driver, then looked up in a map."""
    values = rows.filter(F.col(EXACT_VARIANCE).isNull()).select("variance").distinct().collect()
    pairs = [
        x for r in values for x in (F.lit(r["variance"]), F.lit(exact_variance(r["variance"])))
    ]
    if not pairs:
        return F.lit(None).cast("string")
    return F.create_map(*pairs)[F.col("variance")]
