"""The rules an NMF's tables keep (``topdown.nmf``), checked in one Spark job.

Every problem of a file is a row ``rank, order, folder, geocode, query, rule`` (``rank``: the
rule's place; the row rules first, in ``row_rules``'s order, then the structural ones), and the
first is raised as one ``InputError`` naming the level folder, the row (geocode and query) and
the rule: the only thing collected to the driver. The config's levels and queries are literal
maps looked up per row (``level_info``, ``query_info``), so the check needs no join with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from censusdp_spark.io.readers import RowRule
from censusdp_spark.model.errors import InputError
from censusdp_spark.topdown.config import TopDownConfig
from censusdp_spark.topdown.nmf_layout import (
    CONSTRAINT,
    DPQUERY,
    EXACT_VARIANCE,
    STATE_LEVEL,
    STATE_PARTITION,
    TOTAL_CONSTRAINT,
    level_folder,
    nmf_level_names,
    nmf_queries,
)

# --- the config's levels and queries as literal maps (looked up per row: no join) ----------


def level_info(config: TopDownConfig, root: Path) -> Column:
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


def with_level(df: DataFrame, config: TopDownConfig, root: Path, folder: str) -> DataFrame:
    """``df`` with its level's ``order, digits`` and ``folder`` (``dpq_folder`` or
    ``con_folder``; the root folder for an unknown level)."""
    info = level_info(config, root)
    return df.withColumns(
        {
            "order": info["order"],
            "digits": info["digits"],
            "folder": F.coalesce(info[folder], F.lit(str(root))),
        }
    )


def query_info(config: TopDownConfig, key: Column) -> Column:
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


def _counts(config: TopDownConfig) -> Column:
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


def _problems(rows: DataFrame, rank: int, query: Column, rule: Column) -> DataFrame:
    """Each of ``rows`` as a problem (``PROBLEM_COLUMNS``): ``rank``, where it is, the ``query``
    and the ``rule`` it breaks."""
    return rows.select(
        F.lit(rank).alias("rank"),
        "order",
        "folder",
        "geocode",
        query.alias("query"),
        rule.alias("rule"),
    )


def _structure_problems(rows: DataFrame, config: TopDownConfig) -> DataFrame:
    """A (geocode, query) twice, and a node without all its level's queries."""
    per_query = (
        rows.filter(F.col("query").isNotNull())
        .groupBy("level", "order", "folder", "geocode", "query")
        .agg(F.count("*").alias("n"), F.first("query_name").alias("query_name"))
    )
    twice = _problems(
        per_query.filter(F.col("n") > 1),
        TWICE,
        F.col("query_name"),
        F.format_string("the row appears %d times (one per geocode and query)", "n"),
    )
    per_node = per_query.groupBy("level", "order", "folder", "geocode").agg(
        F.count("*").alias("n"), F.array_sort(F.collect_list("query")).alias("has")
    )
    missing = _problems(
        per_node.filter(F.col("n") < _counts(config)),
        INCOMPLETE,
        F.lit(""),
        F.format_string(
            "the node has %d of its level's %d queries (%s); every node has all of them",
            "n",
            _counts(config),
            F.concat_ws(", ", "has"),
        ),
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


def _orphans(nodes: DataFrame, info: Column, top: int) -> DataFrame:
    """Nodes (``level, order, folder, geocode``) below level ``top`` whose parent is not a node
    of the level above; ``info``: ``level_info``."""
    parents = nodes.select(F.col("level").alias("parent"), F.col("geocode").alias("parent_code"))
    children = _up(nodes, info).filter(F.col("order") > top)
    return _problems(
        children.join(parents, ["parent", "parent_code"], "left_anti"),
        ORPHAN,
        F.lit(""),
        F.format_string("its parent %s '%s' is not in the file", "parent", "parent_code"),
    )


def _total_problems(totals: DataFrame, info: Column) -> DataFrame:
    """Total constraints (``level, order, folder, geocode, query_name, inv_total``) that are not
    one count, given twice with two values, or not the sum of their children's where the level
    below has totals."""
    total = F.lit(TOTAL_CONSTRAINT)
    bad = _problems(
        totals.filter(F.col("query_name") != TOTAL_CONSTRAINT),
        BAD_TOTAL,
        total,
        F.lit("a total constraint's value is one non-negative count"),
    )
    distinct = (
        totals.filter(F.col("query_name") == TOTAL_CONSTRAINT)
        .groupBy("level", "order", "folder", "geocode")
        .agg(F.count_distinct("inv_total").alias("values"), F.max("inv_total").alias("inv_total"))
    )
    conflicting = _problems(
        distinct.filter(F.col("values") > 1),
        CONFLICTING_TOTAL,
        total,
        F.format_string("the total is given %d times with different values", "values"),
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
            _problems(
                unequal,
                UNEQUAL_TOTAL,
                total,
                F.format_string(
                    "the total %d is not the sum %d of its children's totals at level %s",
                    "inv_total",
                    "children",
                    "child_level",
                ),
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


def check_tables(
    rows: DataFrame,
    totals: DataFrame,
    config: TopDownConfig,
    root: Path,
    exact: tuple[Column, str],
    top: int = 0,
) -> None:
    """Every rule over the DPQuery ``rows`` and the total constraints ``totals``, in one job.
    The nodes are the geocodes of both; the first two row rules (the level, the geocode's
    length) hold for every node. ``top``: the level whose nodes are the roots of the trees
    read (a state's run reads no root), whose parents are not looked for."""
    rules = list(enumerate(_row_rules(config.hierarchy.levels[STATE_LEVEL].digits, *exact)))
    node = ["level", "order", "digits", "folder", "geocode"]
    nodes = rows.select(*node).unionByName(totals.select(*node))
    _refuse_first(
        [
            _rule_problems(rows, rules),
            _rule_problems(totals, rules[:2]),
            _structure_problems(rows, config),
            _orphans(nodes.select(*node).distinct(), level_info(config, root), top),
            _total_problems(totals, level_info(config, root)),
        ]
    )
