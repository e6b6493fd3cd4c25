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
from functools import reduce
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.io.readers import RowRule
from censusdp_spark.model.errors import ConfigError, InputError
from censusdp_spark.topdown.config import RunConfig
from censusdp_spark.topdown.measure import NOISY_SCHEMA
from censusdp_spark.topdown.nmf_layout import (
    CONSTRAINT,
    CONSTRAINT_COLUMNS,
    DPQ_SUFFIX,
    DPQUERY,
    DPQUERY_COLUMNS,
    EXACT_VARIANCE,
    LEVEL_SUFFIX,
    STATE_LEVEL,
    STATE_PARTITION,
    TOTAL_CONSTRAINT,
    dpq_name,
    exact_variance,
    level_folder,
    nmf_level_names,
    nmf_queries,
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


# --- the config's levels and queries as literal maps (looked up per row: no join) ----------


def _level_info(config: RunConfig, root: Path) -> Column:
    """Each level's ``order, digits, parent, parent_digits, dpq_folder, con_folder`` (the
    folders as the messages name them), looked up by the row's ``level``; null if unknown."""
    names = nmf_level_names(config)
    levels = config.hierarchy.levels
    pairs = []
    for i, lv in enumerate(levels):
        up = levels[i - 1] if i else None
        info = F.struct(
            F.lit(i).alias("order"),
            F.lit(lv.digits).alias("digits"),
            F.lit(up.name if up else None).cast("string").alias("parent"),
            F.lit(up.digits if up else None).cast("int").alias("parent_digits"),
            F.lit(str(level_folder(root, names[lv.name], DPQUERY))).alias("dpq_folder"),
            F.lit(str(level_folder(root, names[lv.name], CONSTRAINT))).alias("con_folder"),
        )
        pairs += [F.lit(lv.name), info]
    return F.create_map(*pairs)[F.col("level")]


def _with_level(df: DataFrame, config: RunConfig, root: Path, folder: str) -> DataFrame:
    """``df`` with its level's ``order, digits`` and ``folder`` (``dpq_folder`` or
    ``con_folder``; the root folder for an unknown level)."""
    info = _level_info(config, root)
    return df.withColumns(
        {
            "order": info["order"],
            "digits": info["digits"],
            "folder": F.coalesce(info[folder], F.lit(str(root))),
        }
    )


def _query_info(config: RunConfig, key: Column) -> Column:
    """The configured query ``query, cells, shape, config_sigma2`` of the row's ``level`` whose
    ``nmf_layout.query_key`` is ``key``; null if there is none."""
    pairs = []
    for q in nmf_queries(config):
        info = F.struct(
            F.lit(q.name).alias("query"),
            F.lit(q.cells).alias("cells"),
            F.array(*[F.lit(n) for n in q.shape]).cast("array<int>").alias("shape"),
            F.lit(str(config.budget.sigma2_for(q.level, q.name))).alias("config_sigma2"),
        )
        pairs += [F.lit(f"{q.level}|{q.key}"), info]
    return F.create_map(*pairs)[F.concat_ws("|", F.col("level"), key)]


def _counts(config: RunConfig) -> Column:
    """The number of queries of the row's ``level``."""
    pairs = [
        x for lv in config.hierarchy.names for x in (F.lit(lv), F.lit(len(config.queries[lv])))
    ]
    return F.create_map(*pairs)[F.col("level")]


# --- the rules: every problem of a file as rows, the first one raised ----------------------

PROBLEM_COLUMNS = ("rank", "order", "folder", "geocode", "query", "rule")
# The structural rules rank after the row rules (``_row_rules``), in this order.
TWICE, INCOMPLETE, ORPHAN, BAD_TOTAL, CONFLICTING_TOTAL, UNEQUAL_TOTAL = range(100, 106)


def _rule_problems(rows: DataFrame, rules: Sequence[tuple[int, RowRule]]) -> DataFrame:
    """One scan: each row breaking a rule, with the first of ``rules`` it breaks (``rank``, its
    text, and with ``shown`` the value shown after it)."""

    def problem(rank: int, r: RowRule) -> Column:
        text = F.lit(r.rule) if r.shown is None else F.concat_ws("; ", F.lit(r.rule), r.shown)
        return F.when(r.broken, F.struct(F.lit(rank).alias("rank"), text.alias("rule")))

    first = F.coalesce(*[problem(rank, r) for rank, r in rules])
    query = F.col("query_name") if "query_name" in rows.columns else F.lit("")
    return (
        rows.select(first.alias("p"), "order", "folder", "geocode", query.alias("query"))
        .filter(F.col("p").isNotNull())
        .select("p.rank", "order", "folder", "geocode", "query", "p.rule")
    )


def _row_rules(state_digits: int, exact: Column, exact_rule: str) -> list[RowRule]:
    """The rules each DPQuery row keeps, in rank order; ``exact`` is true where its ``sigma2``
    is right (``exact_rule`` says against what)."""
    geo, level = F.col("geocode"), F.col("level")
    got, want = (
        F.concat_ws(", ", F.col(c).cast("array<string>")) for c in ("query_shape", "shape")
    )
    return [
        RowRule(F.col("order").isNull(), "level", "unknown level", F.format_string("%s", level)),
        RowRule(
            geo.isNull() | (F.length(geo) != F.col("digits")),
            "geocode",
            "geocode of the wrong length",
            F.format_string(
                "level %s has %d digits, the geocode %d", level, "digits", F.length(geo)
            ),
        ),
        RowRule(
            (F.col("order") > 0) & (F.col("state") != geo.substr(1, state_digits)),
            "geocode",
            f"the row is not in its {STATE_PARTITION} folder",
            F.format_string(f"{STATE_PARTITION}=%s holds it", "state"),
        ),
        RowRule(
            F.col("query").isNull(),
            "query_name",
            "unknown query",
            F.format_string("level %s has no query of that name", level),
        ),
        RowRule(
            ~F.coalesce(F.col("query_shape") == F.col("shape"), F.lit(False)),
            "query_shape",
            "query_shape is not the config's (per schema attribute, in the config's order)",
            F.format_string("the file has [%s], the config [%s]", got, want),
        ),
        RowRule(
            F.coalesce(F.size("value") != F.col("cells"), F.lit(True)),
            "value",
            "wrong number of cells",
            F.format_string("the row has %d, the query %d", F.size("value"), "cells"),
        ),
        RowRule(
            ~F.coalesce(F.col("variance") > 0, F.lit(False)) | F.isnan("variance"),
            "variance",
            "the variance must be positive",
            F.format_string("got %s", F.col("variance").cast("string")),
        ),
        RowRule(
            ~F.coalesce(exact, F.lit(False)),
            EXACT_VARIANCE,
            exact_rule,
            F.format_string(
                "sigma2 %s, variance %s", EXACT_VARIANCE, F.col("variance").cast("string")
            ),
        ),
    ]


def _structure_problems(rows: DataFrame, config: RunConfig) -> DataFrame:
    """A (geocode, query) twice, and a node without all its level's queries."""
    per_query = (
        rows.filter(F.col("query").isNotNull())
        .groupBy("level", "order", "folder", "geocode", "query")
        .agg(F.count("*").alias("n"), F.first("query_name").alias("query_name"))
    )
    twice = per_query.filter(F.col("n") > 1).select(
        F.lit(TWICE).alias("rank"),
        "order",
        "folder",
        "geocode",
        F.col("query_name").alias("query"),
        F.format_string("the row appears %d times (one per geocode and query)", "n").alias("rule"),
    )
    per_node = per_query.groupBy("level", "order", "folder", "geocode").agg(
        F.count("*").alias("n"), F.array_sort(F.collect_list("query")).alias("has")
    )
    missing = per_node.filter(F.col("n") < _counts(config)).select(
        F.lit(INCOMPLETE).alias("rank"),
        "order",
        "folder",
        "geocode",
        F.lit("").alias("query"),
        F.format_string(
            "the node has %d of its level's %d queries (%s); every node has all of them",
            "n",
            _counts(config),
            F.concat_ws(", ", "has"),
        ).alias("rule"),
    )
    return twice.unionByName(missing)


def _up(df: DataFrame, info: Column) -> DataFrame:
    """The rows of ``df`` below the root, with their ``parent`` level and ``parent_code``."""
    return df.withColumns(
        {
            "parent": info["parent"],
            "parent_code": F.col("geocode").substr(F.lit(1), info["parent_digits"]),
        }
    ).filter(F.col("parent").isNotNull())


def _orphans(nodes: DataFrame, info: Column) -> DataFrame:
    """Nodes (``level, order, folder, geocode``) whose parent is not a node of the level above;
    ``info``: ``_level_info``."""
    parents = nodes.select(F.col("level").alias("parent"), F.col("geocode").alias("parent_code"))
    children = _up(nodes, info)
    return children.join(parents, ["parent", "parent_code"], "left_anti").select(
        F.lit(ORPHAN).alias("rank"),
        "order",
        "folder",
        "geocode",
        F.lit("").alias("query"),
        F.format_string("its parent %s '%s' is not in the file", "parent", "parent_code").alias(
            "rule"
        ),
    )


def _total_problems(totals: DataFrame, info: Column) -> DataFrame:
    """Total constraints (``level, order, folder, geocode, query_name, inv_total``) that are not
    one count, given twice with two values, or not the sum of their children's where the level
    below has totals."""
    total = F.lit(TOTAL_CONSTRAINT).alias("query")
    bad = totals.filter(F.col("query_name") != TOTAL_CONSTRAINT).select(
        F.lit(BAD_TOTAL).alias("rank"),
        "order",
        "folder",
        "geocode",
        total,
        F.lit("a total constraint's value is one non-negative count").alias("rule"),
    )
    distinct = (
        totals.filter(F.col("query_name") == TOTAL_CONSTRAINT)
        .groupBy("level", "order", "folder", "geocode")
        .agg(F.count_distinct("inv_total").alias("values"), F.max("inv_total").alias("inv_total"))
    )
    conflicting = distinct.filter(F.col("values") > 1).select(
        F.lit(CONFLICTING_TOTAL).alias("rank"),
        "order",
        "folder",
        "geocode",
        total,
        F.format_string("the total is given %d times with different values", "values").alias(
            "rule"
        ),
    )
    sums = (
        _up(distinct, info)
        .select(
            F.col("level").alias("child_level"),
            F.col("parent").alias("level"),
            F.col("parent_code").alias("geocode"),
            "inv_total",
        )
        .groupBy("level", "geocode", "child_level")
        .agg(F.sum("inv_total").alias("children"))
    )
    unequal = distinct.join(sums, ["level", "geocode"]).filter(
        F.col("children") != F.col("inv_total")
    )
    return reduce(
        DataFrame.unionByName,
        [
            bad,
            conflicting,
            unequal.select(
                F.lit(UNEQUAL_TOTAL).alias("rank"),
                "order",
                "folder",
                "geocode",
                total,
                F.format_string(
                    "the total %d is not the sum %d of its children's totals at level %s",
                    "inv_total",
                    "children",
                    "child_level",
                ).alias("rule"),
            ),
        ],
    )


def _refuse_first(problems: Sequence[DataFrame]) -> None:
    """One Spark job: raise the first problem (by rule, then level, geocode, query), if any."""
    every = reduce(DataFrame.unionByName, [p.select(*PROBLEM_COLUMNS) for p in problems])
    first = every.orderBy(*PROBLEM_COLUMNS[:5]).limit(1).collect()
    if first:
        p = first[0]
        query = f", query {p['query']!r}" if p["query"] else ""
        raise InputError(p["folder"], f"row geocode {p['geocode']!r}{query}", p["rule"])


def _check(
    rows: DataFrame,
    totals: DataFrame,
    config: RunConfig,
    root: Path,
    exact: tuple[Column, str],
) -> None:
    """Every rule over the DPQuery ``rows`` and the total constraints ``totals``, in one job.
    The nodes are the geocodes of both; the first two row rules (the level, the geocode's
    length) hold for every node."""
    rules = list(enumerate(_row_rules(config.hierarchy.levels[STATE_LEVEL].digits, *exact)))
    node = ["level", "order", "digits", "folder", "geocode"]
    nodes = rows.select(*node).unionByName(totals.select(*node))
    _refuse_first(
        [
            _rule_problems(rows, rules),
            _rule_problems(totals, rules[:2]),
            _structure_problems(rows, config),
            _orphans(nodes.select(*node).distinct(), _level_info(config, root)),
            _total_problems(totals, _level_info(config, root)),
        ]
    )


# --- writing --------------------------------------------------------------------------------


def write_nmf(
    spark: SparkSession, noisy: DataFrame, invariants: DataFrame, config: RunConfig, out: Path
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
    query = _query_info(config, F.col("query"))
    rows = (
        _with_level(noisy, config, root, "dpq_folder").select(
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
    totals = _with_level(invariants, config, root, "con_folder").select(
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
        _check(rows, totals, config, root, (exact, "sigma2 is not the config's for the query"))
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
    rows: DataFrame, totals: DataFrame, config: RunConfig, root: Path, with_totals: set[str]
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


def read_nmf(spark: SparkSession, path: Path, config: RunConfig) -> NmfMeasurements:
    """The NMF at ``path`` as our tables (``NmfMeasurements``), checked against ``config``.

    ``sigma2`` is the file's ``sigma2`` column where it has one (ours), else the exact value of
    its float ``variance`` (``nmf_layout.exact_variance``). Raises ``InputError`` naming the level
    folder, the row and the rule, for the first rule the file breaks (module docstring)."""
    root = path.absolute()
    names = nmf_level_names(config)
    for level, nmf_level in names.items():
        folder = level_folder(root, nmf_level, DPQUERY)
        if not _data_files(folder):
            raise InputError(
                str(folder),
                "folder",
                f"missing: level {level} has no measurements (every level of the hierarchy has)",
            )
    dpq = _read_kind(spark, root, config, DPQUERY, DPQUERY_COLUMNS)
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
    query = _query_info(config, _query_key(F.col("query_name")))
    rows = rows.withColumns({c: query[c] for c in ("query", "cells", "shape")})
    totals = _totals(spark, root, config)
    variance = _as_double(F.col(EXACT_VARIANCE))
    exact = F.col(EXACT_VARIANCE).isNull() | (
        F.abs(variance - F.col("variance")) <= F.col("variance") * RELATIVE_VARIANCE_TOLERANCE
    )
    _check(rows, totals, config, root, (exact, "sigma2 does not agree with the variance"))
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
    spark: SparkSession, root: Path, config: RunConfig, kind: str, columns: Sequence[str]
) -> DataFrame:
    """Every Parquet file of every level's ``kind`` folder that has one, in one read (no
    partition inference: ``State=01`` stays text; the files' schemas merged), with ``level``,
    its ``order, digits, folder`` and ``state`` (the ``State=`` folder) from each file's path.
    A column no file has is refused."""
    names = nmf_level_names(config)
    folders = [level_folder(root, n, kind) for n in names.values()]
    present = [str(f) for f in folders if _data_files(f)]
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
    return _with_level(df, config, root, "dpq_folder" if kind == DPQUERY else "con_folder")


def _totals(spark: SparkSession, root: Path, config: RunConfig) -> DataFrame:
    """The total constraints (the other constraints are not ours): ``level, order, digits,
    folder, geocode, query_name, inv_total``; a total that is not one non-negative count gets
    another ``query_name``, so that ``_total_problems`` refuses it."""
    names = nmf_level_names(config)
    if not any(_data_files(level_folder(root, n, CONSTRAINT)) for n in names.values()):
        empty = (
            "level string, order int, digits int, folder string, geocode string,"
            " query_name string, inv_total bigint"
        )
        return spark.createDataFrame([], empty)
    df = _read_kind(spark, root, config, CONSTRAINT, CONSTRAINT_COLUMNS)
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
