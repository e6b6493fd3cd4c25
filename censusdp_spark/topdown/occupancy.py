"""Where persons may live (``[[estimation.occupancy]]``): the 2020 production's housing and
group-quarters consistency, held exactly by the estimation.

Each occupancy group is a set of schema cells whose persons live in dwellings of one kind
(housing units, or group quarters of one type), with an expression over a block's input counts
of those dwellings (``config.OccupancyGroup``). A block may hold the group's persons only where
the expression is positive: a block with no housing units and no occupied facility gets no
persons; a group-quarters type with no facility there gets no persons of that type. A node
above the blocks may hold a group where one of its blocks may (a bitwise or), so every family
stays feasible: a parent's persons of a group lie in children that may hold them.

A group may also bound its persons (``at_least``, ``at_most``: one person per occupied
facility, 99,999 a facility, 99 a housing unit). A node's bounds are the sums of its blocks', so
a parent's released persons of a group, within its own bounds, can always be split among its
children within theirs; the solvers hold them (``solvers.subproblem.GroupBounds``).

These are invariants, as in the Census's 2020 production (block housing-unit counts and
occupied facilities by type are published exactly): facts of the data that the release holds
without noise, declared in the config.
"""

from __future__ import annotations

from functools import reduce

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.topdown.config import OccupancyGroup
from censusdp_spark.topdown.readers import AT_LEAST, AT_MOST, NO_CAP, OCCUPIED, has_bounds
from censusdp_spark.topdown.solvers.subproblem import GroupBounds

EVERY_GROUP = -1
"""The bits of a node that may hold every group (all bits set)."""


def node_occupancy(
    blocks: DataFrame, hierarchy: Hierarchy, occupancy: tuple[OccupancyGroup, ...]
) -> DataFrame:
    """``level, geocode, allowed``: every node's ``OCCUPIED`` bits, the or of its blocks'; with
    bounds also its ``AT_LEAST`` and ``AT_MOST``, the sums of its blocks' (``NO_CAP`` stays)."""
    columns = [OCCUPIED, AT_LEAST, AT_MOST] if has_bounds(occupancy) else [OCCUPIED]
    leaf = blocks.select(F.lit(hierarchy.leaf.name).alias("level"), "geocode", *columns)
    aggregates = [F.bit_or(OCCUPIED).alias(OCCUPIED)]
    if has_bounds(occupancy):
        aggregates += [
            F.array(*[F.sum(F.col(AT_LEAST)[g]) for g in range(len(occupancy))]).alias(AT_LEAST),
            F.array(
                *[
                    F.sum(F.col(AT_MOST)[g]) if group.at_most is not None else F.lit(NO_CAP)
                    for g, group in enumerate(occupancy)
                ]
            ).alias(AT_MOST),
        ]
    above = [
        blocks.groupBy(geocode_prefix(level.digits).alias("geocode"))
        .agg(*aggregates)
        .select(F.lit(level.name).alias("level"), "geocode", *columns)
        for level in hierarchy.levels[:-1]
    ]
    return reduce(DataFrame.unionByName, [leaf, *above])


def node_constraints(invariants: DataFrame, occupancy: DataFrame | None, level: str) -> DataFrame:
    """``geocode, inv_total`` of ``level``'s invariant nodes, and with occupancy groups every
    node's ``OCCUPIED`` bits beside them (``inv_total`` null where the level has none)."""
    totals = invariants.filter(F.col("level") == level).select("geocode", "inv_total")
    if occupancy is None:
        return totals
    bounds = [AT_LEAST, AT_MOST] if AT_LEAST in occupancy.columns else []
    rows = occupancy.filter(F.col("level") == level).select("geocode", OCCUPIED, *bounds)
    return rows.join(totals, "geocode", "left")


def with_bits(rows: DataFrame, occupancy: DataFrame | None, level: str) -> DataFrame:
    """``rows`` (of ``level``'s nodes, by ``geocode``) with their ``OCCUPIED`` bits beside
    them (null for a node without); ``rows`` unchanged without occupancy groups."""
    if occupancy is None:
        return rows
    return rows.join(_level_bits(occupancy, level), "geocode", "left")


def _level_bits(occupancy: DataFrame, level: str) -> DataFrame:
    return occupancy.filter(F.col("level") == level).select("geocode", OCCUPIED)


def group_cells(occupancy: tuple[OccupancyGroup, ...], n_cells: int) -> tuple[np.ndarray, ...]:
    """Per group, a bool per schema cell: the cells of the group."""
    out = []
    for group in occupancy:
        cells = np.zeros(n_cells, dtype=bool)
        cells[list(group.cells)] = True
        out.append(cells)
    return tuple(out)


def allowed_entries(
    groups: tuple[np.ndarray, ...], bits: pd.Series | None, active: np.ndarray
) -> np.ndarray | None:
    """``(k, active.size)`` bools: where each child (its ``OCCUPIED`` bits in ``bits``, one
    per child; null: every group) may hold persons among the cells ``active``; None when
    there are no groups (every entry may)."""
    if not groups or bits is None:
        return None
    values = bits.fillna(EVERY_GROUP).to_numpy(dtype=np.int64)
    allowed = np.ones((values.size, active.size), dtype=bool)
    for g, cells in enumerate(groups):
        holds = ((values >> g) & 1).astype(bool)
        allowed[:, cells[active]] &= holds[:, None]
    return allowed


def group_bounds(
    groups: tuple[np.ndarray, ...], children: pd.DataFrame, active: np.ndarray
) -> GroupBounds | None:
    """The children's bounds on their persons of each group over the cells ``active``
    (``children``: one row per child, or per child and query, sorted by geocode, with
    ``AT_LEAST`` and ``AT_MOST``); None without bounds."""
    if AT_LEAST not in children.columns:
        return None
    rows = children[~children["geocode"].duplicated()]
    lower = np.array(rows[AT_LEAST].tolist(), dtype=np.float64).reshape(len(rows), len(groups))
    upper = np.array(rows[AT_MOST].tolist(), dtype=np.float64).reshape(lower.shape)
    upper[upper == NO_CAP] = np.inf
    members = np.stack([cells[active] for cells in groups])
    return GroupBounds(members, lower, upper)


def bounds_broken(
    estimates: DataFrame, occupancy: DataFrame, groups: tuple[np.ndarray, ...]
) -> int:
    """The released ``(node, group)`` sums outside their ``AT_LEAST`` and ``AT_MOST``
    (``estimates`` long: ``level, geocode, cell, count``; a node without released counts sums
    to 0); 0 without bounds."""
    if AT_LEAST not in occupancy.columns:
        return 0
    group = _per_cell(_group_of(groups))
    sums = (
        estimates.withColumn("group", group)
        .filter(F.col("group") >= 0)
        .groupBy("level", "geocode", "group")
        .agg(F.sum("count").alias("persons"))
    )
    bounds = occupancy.select(
        "level",
        "geocode",
        F.posexplode(F.arrays_zip(AT_LEAST, AT_MOST)).alias("group", "bound"),
    )
    persons = F.coalesce(F.col("persons"), F.lit(0))
    low, high = F.col("bound")[AT_LEAST], F.col("bound")[AT_MOST]
    return (
        bounds.join(sums, ["level", "geocode", "group"], "left")
        .filter((persons < low) | ((high != NO_CAP) & (persons > high)))
        .count()
    )


def cells_outside_occupancy(
    estimates: DataFrame, occupancy: DataFrame, groups: tuple[np.ndarray, ...]
) -> int:
    """The released ``(level, geocode, cell)`` counts above 0 that their node's occupancy does
    not allow (``estimates`` long: ``level, geocode, cell, count``)."""
    group_of = _group_of(groups)
    bit = _per_cell(np.where(group_of >= 0, 1 << np.maximum(group_of, 0), 0))  # 0: no group
    bits = F.coalesce(F.col(OCCUPIED), F.lit(EVERY_GROUP))
    return (
        estimates.filter(F.col("count") > 0)
        .join(occupancy, ["level", "geocode"], "left")
        .filter((bit != 0) & (bits.bitwiseAND(bit) == 0))
        .count()
    )


def _group_of(groups: tuple[np.ndarray, ...]) -> np.ndarray:
    """Per schema cell, the index of its occupancy group, or -1 for a cell in none."""
    members = np.stack(groups)
    return np.where(members.any(axis=0), members.argmax(axis=0), -1).astype(np.int64)


def _per_cell(values: np.ndarray) -> Column:
    """``values[cell]`` as a column of rows with a ``cell`` column."""
    return F.element_at(F.array(*[F.lit(int(v)) for v in values]), F.col("cell") + 1)
