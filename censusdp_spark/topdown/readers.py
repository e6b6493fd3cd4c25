"""TopDown's input readers: block-count tables, person microdata and P.L. 94-171 legacy files,
aggregated to sparse block histograms; every rule checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial, reduce

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.io.pl94_layout import CELLS
from censusdp_spark.io.readers import (
    MAX_COUNT,
    NonEmpty,
    RowRule,
    UniqueGeocodes,
    count_rules,
    enforce_rules,
    geocode_of,
    geocode_rule,
    nonzero_cells,
    on_spine,
    read_spine,
    read_table,
    read_with_columns_checked,
    row_number_of,
)
from censusdp_spark.model.config import SpineSpec
from censusdp_spark.model.errors import InputError
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.topdown.config import BoundExpression, InputSpec, OccupancyGroup
from censusdp_spark.topdown.pl94 import read_legacy
from censusdp_spark.topdown.schema import Schema


def read_block_counts(spark: SparkSession, spec: InputSpec, leaf_digits: int) -> DataFrame:
    """Block count tables: each configured cell is an expression over integer count columns.
    Every rule, the cells' and the total's included, is checked in one Spark job."""
    source = str(spec.path)
    raw = read_with_columns_checked(spark, spec)
    totals = [spec.total] if spec.total else []
    count_cols = sorted({c for cell in spec.cells for c in (*cell.plus, *cell.minus)} | {*totals})
    df = raw.select(
        geocode_of(spec).alias("geocode"), *[F.col(c).cast("string").alias(c) for c in count_cols]
    )
    checked = {c: checked_count(c) for c in count_cols}
    cell_rules = []
    for cell, value in zip(spec.cells, cell_values(spec, checked), strict=True):
        cell_rules.append(RowRule(value < 0, cell.expr, f"cell value {cell.expr} is negative"))
        cell_rules.append(
            RowRule(
                value > MAX_COUNT,
                cell.expr,
                f"cell value {cell.expr} above MAX_COUNT = {MAX_COUNT:_}",
            )
        )
    mapped = reduce(lambda a, b: a + b, cell_values(spec, checked))  # input.cells is non-empty
    for total in totals:
        rule = "the cells of input.cells do not sum to this column (input.total)"
        cell_rules.append(RowRule(mapped != checked[total], total, rule))
    rules = [geocode_rule(spec, leaf_digits)] + [r for c in count_cols for r in count_rules(c)]
    enforce_rules(
        df, source, [NonEmpty("the input"), *rules, UniqueGeocodes(spec), *cell_rules], mapped
    )
    typed = df.select("geocode", *[F.trim(F.col(c)).cast("long").alias(c) for c in count_cols])
    values = cell_values(spec, {c: F.col(c) for c in count_cols})
    cells = [cell.cell for cell in spec.cells]
    return typed.select("geocode", *nonzero_cells(list(zip(cells, values, strict=True))))


def checked_count(column: str) -> Column:
    """The value of a count column of text where it keeps ``count_rules``, else null: the cell
    expressions over it never fail (nor overflow) on a bad row, so the cells' rules are checked
    in the count rules' own job."""
    broken = reduce(Column.__or__, [r.broken for r in count_rules(column)])
    return F.when(~broken, F.trim(F.col(column)).try_cast("long"))


def cell_values(spec: InputSpec, counts: dict[str, Column]) -> list[Column]:
    """Each cell of ``input.cells``: its expression (``plus`` minus ``minus``) over ``counts``."""
    terms = [
        [counts[c] for c in cell.plus] + [-counts[c] for c in cell.minus] for cell in spec.cells
    ]
    return [reduce(lambda a, b: a + b, cell_terms) for cell_terms in terms]


def read_microdata(
    spark: SparkSession, spec: InputSpec, schema: Schema, leaf_digits: int
) -> DataFrame:
    """One row per person: attribute columns are mapped to levels and aggregated per block."""
    source = str(spec.path)
    raw = read_with_columns_checked(spark, spec)
    df = raw.select(
        geocode_of(spec).alias("geocode"),
        *[F.trim(F.col(a.column).cast("string")).alias(a.column) for a in spec.attributes],
    )
    strides = schema.strides()
    cell = F.lit(0).cast("long")
    rules = [geocode_rule(spec, leaf_digits)]
    for pos, a in enumerate(spec.attributes):
        attr = schema.attribute(a.attribute)
        mapping = F.create_map(
            *[F.lit(x) for raw_v, lv in a.value_map.items() for x in (raw_v, attr.index_of(lv))]
        )
        index = mapping[F.col(a.column)]
        allowed = sorted(a.value_map)
        shown = f"{allowed[:10]}{'...' if len(allowed) > 10 else ''}"
        rules.append(
            RowRule(
                index.isNull(),
                a.column,
                f"value outside the schema of {a.attribute} (allowed: {shown})",
            )
        )
        cell = cell + index.cast("long") * int(strides[pos])
    enforce_rules(df, source, [NonEmpty("the input"), *rules], total=F.lit(1))  # a person a row
    counted = df.groupBy("geocode", cell.cast("int").alias("cell")).agg(F.count("*").alias("count"))
    per_block = counted.groupBy("geocode").agg(
        F.sort_array(F.collect_list(F.struct("cell", "count"))).alias("h")
    )
    return per_block.select(
        "geocode", F.col("h.cell").alias("cells"), F.col("h.count").alias("counts")
    )


HISTOGRAMS = "geocode string, cells array<int>, counts array<bigint>"
OCCUPIED = "allowed"
"""With ``[[estimation.occupancy]]``, the blocks' column of the groups each may hold persons
of: bit ``g`` set where group ``g``'s expression is positive (``occupancy_terms``)."""
AT_LEAST = "at_least"
AT_MOST = "at_most"
"""With occupancy bounds, every block's (and node's) ``at_least`` and ``at_most`` per group,
arrays of bigint; ``at_least`` 0 and ``at_most`` ``NO_CAP`` for a group without that bound."""
NO_CAP = -1
BOUNDS = f"{AT_LEAST} array<bigint>, {AT_MOST} array<bigint>"


def has_bounds(occupancy: tuple[OccupancyGroup, ...]) -> bool:
    """Whether any occupancy group has an ``at_least`` or ``at_most``."""
    return any(g.at_least is not None or g.at_most is not None for g in occupancy)


def read_legacy_blocks(
    spark: SparkSession,
    spec: InputSpec,
    spine: SpineSpec | None,
    occupancy: tuple[OccupancyGroup, ...] = (),
) -> DataFrame:
    """P.L. 94-171 legacy files (``pl94.read_legacy``: every rule checked on the whole file set
    first): each schema cell is its expression over the table cells, a sum of the derived
    cells mapped to it, each checked non-negative by the reader. The blocks are the
    geoheader's, or with a spine the spine's.

    The expressions are one matrix (table cells x schema cells, entries the terms' signs),
    applied per batch of blocks in numpy: as 252 Spark expressions over the 301 cells they were
    most of the read's planning time. With ``occupancy``, each block also has its
    ``OCCUPIED`` bits."""
    assert spec.legacy is not None
    blocks = read_legacy(spark, spec.legacy_files(), spec.legacy.summary_levels, spine)
    terms, index = legacy_terms(spec)
    schema = HISTOGRAMS + (f", {OCCUPIED} long" if occupancy else "")
    schema += f", {BOUNDS}" if has_bounds(occupancy) else ""
    groups = occupancy_terms(occupancy) if occupancy else None
    histograms = partial(_histograms, terms=terms, index=index, groups=groups, occupancy=occupancy)
    return blocks.mapInPandas(histograms, schema)


def occupancy_terms(occupancy: tuple[OccupancyGroup, ...]) -> np.ndarray:
    """The matrix (``io.pl94_layout.CELLS`` x groups) of the signs with which each table cell
    enters each occupancy group's expression."""
    return _sign_matrix([(group.plus, group.minus) for group in occupancy])


def _sign_matrix(expressions: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> np.ndarray:
    """``CELLS`` x expressions: +1 per table cell added, -1 per table cell subtracted."""
    terms = np.zeros((len(CELLS), len(expressions)))
    for j, (plus, minus) in enumerate(expressions):
        for c in plus:
            terms[CELLS.index(c), j] += 1
        for c in minus:
            terms[CELLS.index(c), j] -= 1
    return terms


def legacy_terms(spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(terms, index)``: the matrix (``io.pl94_layout.CELLS`` x mapped schema cells) of the
    signs with which each table cell enters each mapped cell's expression, and the schema cell
    of each column."""
    terms = _sign_matrix([(cell.plus, cell.minus) for cell in spec.cells])
    return terms, np.array([cell.cell for cell in spec.cells], dtype=np.int32)


def _histograms(
    batches: Iterable[pd.DataFrame],
    terms: np.ndarray,
    index: np.ndarray,
    groups: np.ndarray | None,
    occupancy: tuple[OccupancyGroup, ...],
) -> Iterable[pd.DataFrame]:
    """Each block's non-zero schema cells, in increasing order, and their counts (float64 is
    exact here: the reader bounds every count by ``MAX_COUNT``), and with ``groups`` its
    ``OCCUPIED`` bits, with bounds its ``AT_LEAST`` and ``AT_MOST``."""
    for batch in batches:
        values = np.array(batch["values"].tolist(), dtype=np.float64).reshape(
            len(batch), len(CELLS)
        )
        counts = np.rint(values @ terms).astype(np.int64)
        nonzero = [np.flatnonzero(row) for row in counts]
        out = pd.DataFrame(
            {
                "geocode": batch["geocode"],
                "cells": [index[j] for j in nonzero],
                "counts": [row[j] for row, j in zip(counts, nonzero, strict=True)],
            }
        )
        if groups is not None:
            positive = (values @ groups) > 0
            out[OCCUPIED] = (positive << np.arange(groups.shape[1])).sum(axis=1).astype(np.int64)
        if has_bounds(occupancy):
            lower, upper = _legacy_bounds(values, occupancy)
            out[AT_LEAST] = list(lower)
            out[AT_MOST] = list(upper)
        yield out


def _legacy_bounds(
    values: np.ndarray, occupancy: tuple[OccupancyGroup, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Every block's ``at_least`` and ``at_most`` per group over its table cells ``values``."""

    def evaluate(bound: BoundExpression) -> np.ndarray:
        total = np.zeros(values.shape[0])
        for coefficient, column, indicator in bound.terms:
            value = values[:, CELLS.index(column)]
            total += coefficient * ((value > 0) if indicator else value)
        return np.rint(total).astype(np.int64)

    lower = np.zeros((values.shape[0], len(occupancy)), dtype=np.int64)
    upper = np.full(lower.shape, NO_CAP, dtype=np.int64)
    for g, group in enumerate(occupancy):
        if group.at_least is not None:
            lower[:, g] = np.maximum(evaluate(group.at_least), 0)
        if group.at_most is not None:
            upper[:, g] = evaluate(group.at_most)
    return lower, upper


def read_blocks(
    spark: SparkSession,
    spec: InputSpec,
    schema: Schema,
    leaf_digits: int,
    spine: SpineSpec | None,
    occupancy: tuple[OccupancyGroup, ...] = (),
    dwellings: SpineSpec | None = None,
) -> DataFrame:
    """The input's block histograms; with a spine, exactly the spine's blocks (``on_spine``).
    With ``occupancy``, each block's ``OCCUPIED`` bits too: from the legacy files' own tables,
    or else from the block table ``dwellings`` (``with_dwellings``)."""
    if spec.legacy is not None:
        blocks = read_legacy_blocks(spark, spec, spine, occupancy)
        check_bounds(blocks, occupancy, str(spec.path))
        return blocks
    if spec.layout == "block_counts":
        blocks = read_block_counts(spark, spec, leaf_digits)
    else:
        blocks = read_microdata(spark, spec, schema, leaf_digits)
    if spine is not None:
        blocks = on_spine(spark, blocks, spec, spine, leaf_digits)
    if not occupancy:
        return blocks
    assert dwellings is not None  # config._occupancy requires it without legacy input
    blocks = with_dwellings(spark, blocks, dwellings, occupancy, leaf_digits)
    check_bounds(blocks, occupancy, str(dwellings.path))
    return blocks


def check_bounds(blocks: DataFrame, occupancy: tuple[OccupancyGroup, ...], source: str) -> None:
    """Raise ``InputError`` naming ``source`` and the first block whose bounds cannot hold: a
    lower bound where its group's ``where`` is not positive, a cap below the lower bound, or
    the block's own persons of the group outside them (the message names the bound, which the
    config declares an invariant, never the persons). One pass; nothing without bounds."""
    if not has_bounds(occupancy):
        return
    problems = []
    for g, group in enumerate(occupancy):
        key = f"estimation.occupancy[{g}]"
        persons = _group_persons(group)
        low, high = F.col(AT_LEAST)[g], F.col(AT_MOST)[g]
        may_hold = F.col(OCCUPIED).bitwiseAND(F.lit(1 << g)) != 0
        if group.at_least is not None:
            least = f"{key}.at_least = {group.at_least.text!r}"
            problems += [
                F.when(
                    (low > 0) & ~may_hold,
                    F.format_string(
                        f"{least} is %d where where = {group.where!r} is not positive", low
                    ),
                ),
                F.when(
                    persons < low,
                    F.format_string(f"it holds persons of {key}, below {least} (%d)", low),
                ),
            ]
        if group.at_most is not None:
            most = f"{key}.at_most = {group.at_most.text!r}"
            problems += [
                F.when(
                    high < low, F.format_string(f"{most} is %d, below at_least (%d)", high, low)
                ),
                F.when(
                    persons > high,
                    F.format_string(f"it holds persons of {key}, above {most} (%d)", high),
                ),
            ]
    first = (
        blocks.select("geocode", F.coalesce(*problems).alias("problem"))
        .filter(F.col("problem").isNotNull())
        .agg(F.min("geocode").alias("geocode"), F.min_by("problem", "geocode").alias("problem"))
        .first()
    )
    if first is not None and first["geocode"] is not None:
        raise InputError(source, f"block {first['geocode']}", first["problem"])


def _group_persons(group: OccupancyGroup) -> Column:
    """A block's persons in the group's cells (from its ``cells`` and ``counts``)."""
    cells = F.array(*[F.lit(c) for c in group.cells])
    return F.aggregate(
        F.arrays_zip("cells", "counts"),
        F.lit(0).cast("long"),
        lambda acc, e: acc + F.when(F.array_contains(cells, e["cells"]), e["counts"]).otherwise(0),
    )


def with_dwellings(
    spark: SparkSession,
    blocks: DataFrame,
    dwellings: SpineSpec,
    occupancy: tuple[OccupancyGroup, ...],
    leaf_digits: int,
) -> DataFrame:
    """``blocks`` (``geocode, cells, counts``) with their ``OCCUPIED`` bits: bit ``g`` set where
    group ``g``'s expression over the block's row of ``dwellings`` is positive.

    Every rule is checked before anything is written, each refusal naming the dwellings table
    and, where one is to blame, its row: a column an expression names is missing; a count is
    not a non-negative integer at most ``MAX_COUNT``; a geocode is malformed, repeated or not
    one of the blocks; a block has no row; a block holds persons of a group its counts do not
    allow (the input and its dwellings disagree)."""
    source = str(dwellings.path)
    raw = read_table(spark, dwellings.path, dwellings.format)
    for i, group in enumerate(occupancy):
        for key, named in _named_columns(group):
            for column in named:
                if column not in raw.columns:
                    rule = f"missing (named in estimation.occupancy[{i}].{key})"
                    raise InputError(source, f"column {column}", rule)
    columns = sorted(
        {c for group in occupancy for _, named in _named_columns(group) for c in named}
    )
    df = raw.select(
        geocode_of(dwellings).alias("geocode"), *[F.col(c).cast("string").alias(c) for c in columns]
    )
    rules = [geocode_rule(dwellings, leaf_digits)] + [r for c in columns for r in count_rules(c)]
    enforce_rules(df, source, [NonEmpty("the dwellings table"), *rules, UniqueGeocodes(dwellings)])
    counts = {c: F.trim(F.col(c)).cast("long") for c in columns}
    bits = reduce(
        lambda a, b: a.bitwiseOR(b),
        [
            F.when(_expression_value(group, counts) > 0, F.lit(1 << g)).otherwise(F.lit(0))
            for g, group in enumerate(occupancy)
        ],
    )
    table = df.select(
        "geocode", bits.cast("long").alias(OCCUPIED), *_bound_columns(occupancy, counts)
    )
    held = blocks.select(
        "geocode", _groups_held("cells", occupancy).alias("held"), F.lit(True).alias("block")
    )
    outside = F.col("held").bitwiseAND(F.bitwise_not(OCCUPIED))
    first = (  # one pass over both: the first stray row, block without a row, and clash
        table.withColumn("row", F.lit(True))
        .join(held, "geocode", "full")
        .agg(
            F.min(F.when(F.col("block").isNull(), F.col("geocode"))).alias("stray"),
            F.min(F.when(F.col("row").isNull(), F.col("geocode"))).alias("missing"),
            F.min(F.when(outside != 0, F.col("geocode"))).alias("clash"),
            F.min_by(outside, F.when(outside != 0, F.col("geocode"))).alias("outside"),
        )
        .first()
    )
    assert first is not None
    if (code := first["stray"]) is not None:
        row = row_number_of(df, F.col("geocode") == code)
        column = "+".join(dwellings.geocode_columns)
        raise InputError(
            source, f"row {row}, column {column}", f"{code} is not a block of the input"
        )
    if (code := first["missing"]) is not None:
        rule = f"block {code} has no row (every block needs its dwelling counts)"
        raise InputError(source, "rows", rule)
    if (code := first["clash"]) is not None:
        bad = first["outside"]
        g = (bad & -bad).bit_length() - 1
        row = row_number_of(df, F.col("geocode") == code)
        raise InputError(
            source,
            f"row {row}",
            f"block {code} holds persons of estimation.occupancy[{g}], whose where ="
            f" {occupancy[g].where!r} is not positive there",
        )
    return blocks.join(table, "geocode")


def _named_columns(group: OccupancyGroup) -> list[tuple[str, tuple[str, ...]]]:
    """The dwellings columns a group's ``where``, ``at_least`` and ``at_most`` name."""
    named = [("where", (*group.plus, *group.minus))]
    for key, bound in (("at_least", group.at_least), ("at_most", group.at_most)):
        if bound is not None:
            named.append((key, bound.columns))
    return named


def _bound_columns(
    occupancy: tuple[OccupancyGroup, ...], counts: dict[str, Column]
) -> list[Column]:
    """``AT_LEAST`` and ``AT_MOST`` per group over the typed count columns (none without
    bounds)."""
    if not has_bounds(occupancy):
        return []

    def value(bound: BoundExpression) -> Column:
        terms = [
            F.lit(coefficient) * (F.when(counts[c] > 0, 1).otherwise(0) if indicator else counts[c])
            for coefficient, c, indicator in bound.terms
        ]
        return reduce(lambda a, b: a + b, terms).cast("long")

    lower = [
        F.greatest(value(g.at_least), F.lit(0)) if g.at_least is not None else F.lit(0).cast("long")
        for g in occupancy
    ]
    upper = [
        value(g.at_most) if g.at_most is not None else F.lit(NO_CAP).cast("long") for g in occupancy
    ]
    return [F.array(*lower).alias(AT_LEAST), F.array(*upper).alias(AT_MOST)]


def _expression_value(group: OccupancyGroup, counts: dict[str, Column]) -> Column:
    """``plus - minus`` of one group over the typed count columns."""
    terms = [counts[c] for c in group.plus] + [-counts[c] for c in group.minus]
    return reduce(lambda a, b: a + b, terms)


def _groups_held(cells: str, occupancy: tuple[OccupancyGroup, ...]) -> Column:
    """The bits of the occupancy groups a block's non-zero ``cells`` fall in."""
    n_cells = 1 + max(max(group.cells) for group in occupancy)
    bit_of = [0] * n_cells
    for g, group in enumerate(occupancy):
        for cell in group.cells:
            bit_of[cell] = 1 << g
    table = F.array(*[F.lit(b).cast("long") for b in bit_of])
    bits = F.transform(
        cells, lambda c: F.when(c < n_cells, F.element_at(table, c + 1)).otherwise(F.lit(0))
    )
    return F.aggregate(bits, F.lit(0).cast("long"), lambda acc, b: acc.bitwiseOR(b))


def spine_node_counts(
    spark: SparkSession, spine: SpineSpec, hierarchy: Hierarchy
) -> dict[str, int]:
    """The number of nodes of every level of the public ``spine`` (distinct geocode prefixes
    of its leaves), after the spine's own checks (``io.readers.read_spine``); no count of
    people is read."""
    leaves = read_spine(spark, spine, hierarchy.leaf.digits)
    row = leaves.agg(
        *[
            F.countDistinct(F.substring("geocode", 1, level.digits)).alias(level.name)
            for level in hierarchy.levels
        ]
    ).first()
    assert row is not None
    return {level.name: int(row[level.name]) for level in hierarchy.levels}
