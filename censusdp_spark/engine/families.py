"""Many families per Python call: hash-partition by family, sort, stream families through pandas.

``groupBy(...).applyInPandas`` pays a pandas/Arrow round trip per group, about a millisecond,
which at national scale (240,000 block-group families, 84,000 tract families) costs more than
the work itself. ``map_families`` instead shuffles the rows once so that every family lies in
one partition, sorts each partition by (family key, order columns), and hands a task's Arrow
batches to ``solve``, one family at a time, in order (or, ``batched``, every whole family of
a batch at once, for solvers that vectorise across families). A family that
straddles two Arrow batches is carried over whole into the next, so ``solve`` always sees all
of a family's rows, sorted by the order columns, exactly once per task attempt.

The number of partitions is not fixed here: the shuffle uses ``spark.sql.shuffle.partitions``
and adaptive execution coalesces them by size. What a family's rows are, and their order,
depend only on the data, never on the partitioning, so a retried or speculative task redoes
exactly the same work.

The shuffle is on a hash *expression* of the family key, not on the key columns: when the rows
come out of a join on the key (children meeting their parent's row), Spark treats a
``repartition(key)`` as already satisfied by the join and drops it, and adaptive execution may
then turn the join into a broadcast whose probe side is read map-side, which scatters a family
over several tasks. An expression the join does not produce keeps the shuffle.

``map_children`` is the same for families that need their parent's row: the parents' rows are
unioned with their children's (not joined to them) and travel in the same shuffle, first in
their family, so a level costs one shuffle of its children, whatever the parents' size.

``noise_group`` is the family key of the noise passes (TopDown's and PGSR's): a node's ancestor
``NOISE_GROUP_DEPTH`` levels up, so that one keyed stream serves thousands of nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, DataType, NumericType, StringType

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.model.geography import Hierarchy, LevelShape

NOISE_GROUP_DEPTH = 3
"""Nodes sharing their ancestor this many levels up share one keyed noise stream."""

OUTPUT_BATCH_ROWS = 10_000
"""The most rows of one Arrow batch a Python call hands back (Spark's own
``spark.sql.execution.arrow.maxRecordsPerBatch`` default for the batches it hands in)."""

FamilySolver = Callable[[pd.DataFrame], pd.DataFrame | None]
"""Rows (one family, or whole families) -> result rows, or None for none."""


def map_families(
    rows: DataFrame,
    family: Sequence[str],
    order: Sequence[str],
    solve: FamilySolver,
    schema: str,
    on_task_start: Callable[[], None] | None = None,
    batched: bool = False,
) -> DataFrame:
    """``solve`` applied to the rows of every family (rows equal on ``family``), lazily.

    ``solve`` gets one family's rows sorted by ``order`` (a pandas frame with a fresh index),
    or with ``batched`` several whole families at once (sorted by ``family`` then ``order``;
    never part of one), for solvers that vectorise across families; it returns rows of
    ``schema``. ``on_task_start`` runs once at the start of every task.
    """
    keys = list(family)
    each = solve if batched else _one_by_one(keys, solve)
    task = _streamed(keys, each, on_task_start)
    return (
        rows.repartition(F.xxhash64(*keys))
        .sortWithinPartitions(*keys, *order)
        .mapInArrow(_through_pandas(task, _arrow_schema(rows, schema)), schema)
    )


def _arrow_schema(rows: DataFrame, schema: str) -> pa.Schema:
    """The Arrow schema of the Spark DDL ``schema``."""
    return to_arrow_schema(rows.sparkSession.createDataFrame([], schema).schema)


def _through_pandas(
    task: Callable[[Iterable[pd.DataFrame]], Iterable[pd.DataFrame]], schema: pa.Schema
) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """``task`` over Arrow batches: each batch in as pandas, each result out as Arrow, in
    batches of at most ``OUTPUT_BATCH_ROWS`` rows (a noise group's result can be millions of
    cells: converted whole, its Arrow copy would double the call's memory).

    ``mapInPandas`` would do the same conversions, but it turns every array of an array
    column into a Python list before Arrow reads it back, which is about half the time of the
    measurement; pyarrow converts a column of numpy arrays in native code."""

    def arrow_task(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        for frame in task(batch.to_pandas() for batch in batches):
            for start in range(0, len(frame), OUTPUT_BATCH_ROWS):
                rows = frame.iloc[start : start + OUTPUT_BATCH_ROWS]
                yield pa.RecordBatch.from_pandas(rows, schema=schema, preserve_index=False)

    return arrow_task


PARENT = "parent"
"""The family key column of ``map_children``: the parent's geocode."""
_ROLE = "_role"  # 0: the parent's row, 1: a child's


def map_children(
    children: DataFrame,
    parents: DataFrame,
    parent_key: Column,
    order: Sequence[str],
    solve: FamilySolver,
    schema: str,
    batched: bool = False,
) -> DataFrame:
    """``solve`` applied to every family of children (rows equal on ``parent_key``, a
    ``geocode`` of ``parents``), lazily, as ``map_families`` does; each child's row carries
    its parent's key as ``parent`` and its parent's columns as ``parent_<name>`` (null if the
    parent has no row). Parents without children are not solved."""
    names = [c for c in parents.columns if c != "geocode"]
    # Each side fills the other's columns with non-null placeholders: a null would turn an
    # integer column into floats on its way to pandas.
    up = parents.select(
        F.col("geocode").alias(PARENT),
        F.lit(0).alias(_ROLE),
        *[_placeholder(children.schema[c].dataType).alias(c) for c in children.columns],
        *[F.col(c).alias(f"parent_{c}") for c in names],
    )
    down = children.select(
        parent_key.alias(PARENT),
        F.lit(1).alias(_ROLE),
        *children.columns,
        *[_placeholder(parents.schema[c].dataType).alias(f"parent_{c}") for c in names],
    )
    each = solve if batched else _one_by_one([PARENT], solve)
    return map_families(
        down.unionByName(up),
        [PARENT],
        [_ROLE, *order],
        _children_with_parents(children.columns, [f"parent_{c}" for c in names], each),
        schema,
        batched=True,
    )


def _placeholder(kind: DataType) -> Column:
    """A non-null value of ``kind`` for a column a row does not use."""
    if isinstance(kind, NumericType):
        return F.lit(0).cast(kind)
    if isinstance(kind, StringType):
        return F.lit("")
    if isinstance(kind, ArrayType):
        return F.array().cast(kind)
    return F.lit(None).cast(kind)


def _children_with_parents(
    columns: list[str], parent_columns: list[str], solve: FamilySolver
) -> FamilySolver:
    """A batch of whole families (each with its parent's row first, if any) -> its children's
    rows with their parent's columns filled in, to ``solve`` (nothing if no child)."""

    def attach(batch: pd.DataFrame) -> pd.DataFrame | None:
        child = batch[_ROLE].to_numpy() == 1
        if not child.any():
            return None
        starts = family_starts(batch, [PARENT])
        sizes = np.diff(np.append(starts, len(batch)))
        has_parent = ~child[starts]
        source = np.repeat(np.where(has_parent, starts, -1), sizes)[child]
        out = batch.loc[child, [PARENT, *columns]].reset_index(drop=True)
        found = source >= 0
        for c in parent_columns:
            values = pd.Series(batch[c].to_numpy()[np.maximum(source, 0)])
            out[c] = values if found.all() else values.where(found)
        return solve(out)

    return attach


def noise_group(hierarchy: Hierarchy) -> Column:
    """The noise group of a ``level, geocode`` row: its ancestor ``NOISE_GROUP_DEPTH`` levels up
    (the root's empty geocode when there is none)."""
    group = F.lit("")
    for i, level in enumerate(hierarchy.levels):
        ancestor = hierarchy.levels[max(i - NOISE_GROUP_DEPTH, 0)]
        prefix = geocode_prefix(ancestor.digits)
        group = F.when(F.col("level") == level.name, prefix).otherwise(group)
    return group


def level_shapes(nodes: DataFrame, hierarchy: Hierarchy) -> list[LevelShape]:
    """Per level (root first), from the ``level, geocode`` of every node alone (the public
    geography; no count is read): its nodes, the most children of one parent, the most nodes of
    one noise group. One Spark job."""
    depth, parent, group = F.lit(0), F.lit(""), F.lit("")
    for i, level in enumerate(hierarchy.levels):
        here = F.col("level") == level.name
        up = hierarchy.levels[max(i - 1, 0)]
        noise = hierarchy.levels[max(i - NOISE_GROUP_DEPTH, 0)]
        depth = F.when(here, F.lit(i)).otherwise(depth)
        parent = F.when(here, geocode_prefix(up.digits)).otherwise(parent)
        group = F.when(here, geocode_prefix(noise.digits)).otherwise(group)
    per_parent = (
        nodes.select(depth.alias("depth"), group.alias("group"), parent.alias("parent"))
        .groupBy("depth", "group", "parent")
        .count()
    )
    per_group = per_parent.groupBy("depth", "group").agg(
        F.sum("count").alias("nodes"), F.max("count").alias("family")
    )
    rows = per_group.groupBy("depth").agg(
        F.sum("nodes").alias("nodes"),
        F.max("family").alias("family"),
        F.max("nodes").alias("group"),
    )
    found = {int(r["depth"]): r for r in rows.collect()}
    return [
        LevelShape(lv.name, int(found[i]["nodes"]), int(found[i]["family"]), int(found[i]["group"]))
        if i in found
        else LevelShape(lv.name, 0, 0, 0)
        for i, lv in enumerate(hierarchy.levels)
    ]


def _streamed(
    keys: list[str],
    solve: FamilySolver,
    on_task_start: Callable[[], None] | None,
) -> Callable[[Iterable[pd.DataFrame]], Iterable[pd.DataFrame]]:
    def task(batches: Iterable[pd.DataFrame]) -> Iterable[pd.DataFrame]:
        if on_task_start is not None:
            on_task_start()
        carry: pd.DataFrame | None = None
        for batch in batches:
            if carry is not None:
                batch = pd.concat([carry, batch], ignore_index=True)
            # The last family may continue in the next batch: hold it back.
            whole = int(family_starts(batch, keys)[-1])
            if whole:
                yield from _solved(solve, _rows(batch, 0, whole))
            carry = batch.iloc[whole:]
        if carry is not None and len(carry):
            yield from _solved(solve, carry.reset_index(drop=True))

    return task


def _solved(solve: FamilySolver, rows: pd.DataFrame) -> Iterable[pd.DataFrame]:
    out = solve(rows)
    if out is not None:
        yield out


def _one_by_one(keys: list[str], solve: FamilySolver) -> FamilySolver:
    """A solver of whole-family batches that hands ``solve`` one family at a time."""

    def each(batch: pd.DataFrame) -> pd.DataFrame | None:
        bounds = np.append(family_starts(batch, keys), len(batch))
        pairs = zip(bounds[:-1], bounds[1:], strict=True)
        done = [out for a, b in pairs if (out := solve(_rows(batch, a, b))) is not None]
        return pd.concat(done, ignore_index=True) if done else None

    return each


def family_starts(batch: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Row positions where a family begins in a batch sorted by ``keys`` (``[0]`` if empty)."""
    if not len(batch):
        return np.zeros(1, dtype=np.int64)
    changed = np.zeros(len(batch), dtype=bool)
    changed[0] = True
    for key in keys:
        values = batch[key].to_numpy()
        changed[1:] |= values[1:] != values[:-1]
    return np.flatnonzero(changed)


def _rows(batch: pd.DataFrame, start: int, stop: int) -> pd.DataFrame:
    return batch.iloc[start:stop].reset_index(drop=True)
