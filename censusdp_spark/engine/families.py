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

``noise_group`` is the family key of the noise passes (TopDown's and PGSR's): a node's ancestor
``NOISE_GROUP_DEPTH`` levels up, so that one keyed stream serves thousands of nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.model.geography import Hierarchy

NOISE_GROUP_DEPTH = 3
"""Nodes sharing their ancestor this many levels up share one keyed noise stream."""

FamilySolver = Callable[[pd.DataFrame], pd.DataFrame]


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
    return (
        rows.repartition(F.xxhash64(*keys))
        .sortWithinPartitions(*keys, *order)
        .mapInPandas(_streamed(keys, each, on_task_start), schema)
    )


def noise_group(hierarchy: Hierarchy) -> Column:
    """The noise group of a ``level, geocode`` row: its ancestor ``NOISE_GROUP_DEPTH`` levels up
    (the root's empty geocode when there is none)."""
    group = F.lit("")
    for i, level in enumerate(hierarchy.levels):
        ancestor = hierarchy.levels[max(i - NOISE_GROUP_DEPTH, 0)]
        prefix = geocode_prefix(ancestor.digits)
        group = F.when(F.col("level") == level.name, prefix).otherwise(group)
    return group


def _streamed(
    keys: list[str], solve: FamilySolver, on_task_start: Callable[[], None] | None
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
                yield solve(_rows(batch, 0, whole))
            carry = batch.iloc[whole:]
        if carry is not None and len(carry):
            yield solve(carry.reset_index(drop=True))

    return task


def _one_by_one(keys: list[str], solve: FamilySolver) -> FamilySolver:
    """A solver of whole-family batches that hands ``solve`` one family at a time."""

    def each(batch: pd.DataFrame) -> pd.DataFrame:
        bounds = np.append(family_starts(batch, keys), len(batch))
        done = [solve(_rows(batch, a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        return pd.concat(done, ignore_index=True)

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
