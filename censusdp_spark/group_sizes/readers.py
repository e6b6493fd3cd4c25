"""Read the group-size release's input into per-leaf size histograms, every rule checked first.

Output: one row per leaf ``geocode: string, cells: array<int>, counts: array<bigint>`` (cell =
size - 1, non-zero cells only, increasing). Layouts (``config.GroupInputSpec``):
``size_counts`` (a row per leaf, a count column per size), or ``households`` (a row per
household with its size, or a row per member with a quantity summed per household). Every
violation raises ``InputError`` naming the file, the row (1-based data row, in file order) or
column, and the rule, with the row rules of ``io.readers`` (the same machinery as TopDown's);
nothing is written before the input has passed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.group_sizes.config import GroupInputSpec, GroupSizes
from censusdp_spark.io.readers import (
    RowRule,
    check_unique_geocodes,
    count_rules,
    enforce_rules,
    geocode_of,
    geocode_rule,
    nonzero_cells,
    on_spine,
    read_checked,
    row_number_of,
)
from censusdp_spark.model.config import SpineSpec
from censusdp_spark.model.errors import InputError


def _as_long(column: str) -> Column:
    return F.trim(F.col(column).cast("string")).cast("long")


def _size_rules(groups: GroupSizes, column: str) -> list[RowRule]:
    """Sizes must be >= 1, and <= N unless the last size is top-coded ("N or more")."""
    rules = [RowRule(F.col("size") < 1, column, "a group must have size >= 1")]
    if not groups.topcode:
        rules.append(
            RowRule(
                F.col("size") > groups.max_size,
                column,
                f"size above max_size = {groups.max_size} (topcode = false)",
            )
        )
    return rules


def _sparse(per_leaf: DataFrame) -> DataFrame:
    """``geocode, cell, count`` rows -> ``geocode, cells, counts`` (sorted, non-zero only)."""
    nested = per_leaf.groupBy("geocode").agg(
        F.sort_array(
            F.collect_list(F.struct(F.col("cell").cast("int").alias("cell"), "count"))
        ).alias("h")
    )
    nonzero = F.filter("h", lambda s: s["count"] > 0)
    return nested.select(
        "geocode",
        F.transform(nonzero, lambda s: s["cell"]).alias("cells"),
        F.transform(nonzero, lambda s: s["count"]).cast("array<bigint>").alias("counts"),
    )


def _size_counts(df: DataFrame, spec: GroupInputSpec, digits: int) -> DataFrame:
    source = str(spec.path)
    rules = [geocode_rule(spec, digits)]
    rules += [r for c in spec.size_columns for r in count_rules(c)]
    # The total is summed in the rules' own job, before they have refused a bad count: as
    # decimals, so that neither a count past int64 nor a sum of large ones can fail the job.
    counts = [F.trim(F.col(c).cast("string")).try_cast("decimal(38,0)") for c in spec.size_columns]
    enforce_rules(df, source, rules, reduce(lambda a, b: a + b, counts))
    check_unique_geocodes(df, spec)
    typed = df.select("geocode", *[_as_long(c).alias(c) for c in spec.size_columns])
    columns = [(i, F.col(c)) for i, c in enumerate(spec.size_columns)]
    return typed.select("geocode", *nonzero_cells(columns))


def _households(df: DataFrame, spec: GroupInputSpec, groups: GroupSizes, digits: int) -> DataFrame:
    """One row per household ``geocode, size``, from household rows or member rows."""
    source = str(spec.path)
    household = str(spec.household_column)
    df = df.withColumn("household", F.trim(F.col(household).cast("string")))
    empty_id = RowRule(
        F.col("household").isNull() | (F.col("household") == ""),
        household,
        "household id is empty",
    )
    quantity = spec.size_column or spec.member_column  # None: a row per member counts one
    what = "size" if spec.size_column else "member quantity"
    rules = [geocode_rule(spec, digits), empty_id]
    if quantity is not None:
        rules += count_rules(quantity, what)
    enforce_rules(df, source, rules, total=F.lit(1))  # one group or member a row
    per_household = df.groupBy("household").agg(
        F.countDistinct("geocode").alias("leaves"),
        F.count("*").alias("rows"),
        F.first("geocode").alias("geocode"),
        (F.sum(_as_long(quantity)) if quantity else F.count("*")).alias("size"),
    )
    if spec.size_column is not None:
        _refuse_first(
            per_household.filter("rows > 1"),
            df,
            source,
            household,
            lambda h: (
                f"household {h['household']} "
                f"{'in two leaves' if h['leaves'] > 1 else 'listed twice'} (one row per household)"
            ),
        )
    _refuse_first(
        per_household.filter("leaves > 1"),
        df,
        source,
        household,
        lambda h: f"household {h['household']}'s members lie in different leaves",
    )
    per_household = per_household.select("geocode", "household", "size")
    if spec.member_column is not None:
        member = spec.member_column
        _refuse_first(
            per_household.filter(F.col("size") < 1),
            df,
            source,
            member,
            lambda h: f"household {h['household']}'s {member} sum to 0 (sizes start at 1)",
        )
    for rule in _size_rules(groups, quantity or household):
        _refuse_first(per_household.filter(rule.broken), df, source, rule.column, rule.rule)
    return per_household


def read_leaf_histograms(
    spark: SparkSession,
    spec: GroupInputSpec,
    groups: GroupSizes,
    digits: int,
    spine: SpineSpec | None,
) -> DataFrame:
    """Per-leaf size histograms ``geocode, cells, counts``; every input rule is checked first.
    With a spine, exactly the spine's leaves (``io.readers.on_spine``: a leaf without groups
    has zero counts in every size; a record off the spine is refused)."""
    raw = read_checked(spark, spec)
    df = raw.withColumn("geocode", geocode_of(spec))
    if spec.layout == "size_counts":
        leaves = _size_counts(df, spec, digits)
    else:
        households = _households(df, spec, groups, digits)
        cell = F.least(F.col("size"), F.lit(groups.max_size)) - 1
        leaves = _sparse(
            households.groupBy("geocode", cell.alias("cell")).agg(F.count("*").alias("count"))
        )
    return leaves if spine is None else on_spine(spark, leaves, spec, spine, digits)


def _refuse_first(
    offending: DataFrame,
    rows: DataFrame,
    source: str,
    column: str,
    message: str | Callable[[Row], str],
) -> None:
    """Raise ``InputError`` at the first input row of the first household in ``offending``."""
    hit = offending.limit(1).collect()
    if hit:
        row = row_number_of(rows, F.col("household") == hit[0]["household"])
        rule = message if isinstance(message, str) else message(hit[0])
        raise InputError(source, f"row {row}, column {column}", rule)
