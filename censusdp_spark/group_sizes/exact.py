"""The ``exact`` group-size post-processing (M_H^dp; recorded as ``dp``) on Spark: the
cost-table dynamic program, bottom-up then top-down, with its certificate loop.

What it promises (``group_sizes.solvers.cost_tables`` has the argument): cost tables of every
internal node bottom-up, the root by the dummy root of T^dp, then each family split given its
parent. Under ``faithfulness = "level"`` (the paper's; default) the release is the exact
integer optimum and the run fails if its objective differs from the root tables' optimum;
under ``"node"`` the manifest carries the certificate ``lower_bound <= opt <= objective``.
It reads only ``noisy_measurements`` (noisy values and the public ``G`` or ``G^r``): it is
post-processing, and spends no budget.

Data shapes: cost tables ``level, geocode, size, noisy, lo, base, lengths, slopes``
(``TABLE_SCHEMA``) of internal nodes, bottom-up (the leaves' tables are rebuilt from their
noisy rows inside the parent's task) -> released rows ``geocode, level, size, count, noisy``
(``DP_RELEASE_SCHEMA``: each cell's noisy value travels with it until the write). Every
family's children rows meet their parent's row in one shuffle (``rows.level_families``); under
l2 and level faithfulness (the default) a task's whole families go to the vectorised solvers
of ``group_sizes.solvers.batch`` in one call. Nothing per node is collected to the driver
except the root's own row.

The certificate loop (``post_process_exact``), l2 under level faithfulness: windows of
half-width ``cost_tables.first_window`` (a few noise scales) around each internal cell's noisy
value; after a pass, ``bound_cells`` lists the released cells on a window bound other than 0
and G, those cells (only) get windows ``WINDOW_WIDENING`` times wider (``level, geocode, size,
width``, joined to the parents of the next pass) and the pass is redone, rebuilding only the
tables of those cells' ancestors, until no cell is on a bound. The leaves have no windows:
they are split once, after the certificate holds.

Two drivers of one dynamic program. ``group_sizes.solvers.tree.dp_release`` runs the same
tables and splits over a whole tree in one process (the reference the solver tests, the
benchmarks and the e2e cross-check use); this module runs them level by level on Spark,
keeping nothing per node on the driver. They are kept apart on purpose: the in-process driver
centres its windows at a consistent least-squares estimate and re-solves the whole tree in
memory each round, while this one centres them at the noisy values and rebuilds, each round,
only the tables of the ancestors of the widened cells. Both end at the exact optimum (the e2e
test checks they agree cell for cell), but their windows, their rounds and so the certificate
figures in the manifest (``window_<level>``, ``rounds``, ``widened_cells``) differ, so one
cannot replace the other without changing a release's manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.families import FamilySolver
from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.group_sizes.config import GroupSizesConfig
from censusdp_spark.group_sizes.rows import (
    DP_RELEASE_SCHEMA,
    ints,
    level_families,
    parent_rows,
    parent_value,
    release_rows,
    released_histograms,
    root_release,
    root_row,
    settle,
    stacked,
    union,
)
from censusdp_spark.group_sizes.solvers.batch import (
    LeafFamilies,
    TableFamilies,
    Tables,
    family_order,
)
from censusdp_spark.group_sizes.solvers.cost_tables import (
    WINDOW_WIDENING,
    CostTable,
    WindowTooNarrow,
    cell_bounds,
    first_window,
    merge_family,
    node_tables,
    solve_family,
    solve_root,
    split_family,
)
from censusdp_spark.model.errors import GuaranteeViolation
from censusdp_spark.model.geography import Level
from censusdp_spark.release.runner import Clock

TABLE_SCHEMA = "level string, geocode string, size int, noisy bigint, lo bigint, base bigint, lengths array<bigint>, slopes array<bigint>"
"""One row per (internal node, size): the cell's noisy value and its cost table (a
``CostTable``: ``lo``, ``base`` and the slope segments)."""
WIDENED_SCHEMA = "level string, geocode string, size int, width bigint"
"""Cells whose l2 window is wider than their level's: ``bound_cells`` gives them, the next
pass's ``dp_tables`` reads them."""


# --- the plan and the tables: bottom-up -------------------------------------------------------


@dataclass(frozen=True)
class DpPlan:
    """What the dp tasks need (picklable, small)."""

    norm: str
    faithfulness: str
    total: int  # G, public
    widths: Mapping[str, int | None]  # l2 window half-width per level (None: no window)
    sizes: int  # N

    @property
    def batched(self) -> bool:
        """l2 under level faithfulness runs vectorised over a batch's families
        (``group_sizes.solvers.batch``); l1 and node faithfulness family by family."""
        return self.norm == "l2" and self.faithfulness == "level"

    def bounds(
        self, level: str, groups: object, noisy: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        upper = self.total if self.faithfulness == "level" else int(str(groups))
        return cell_bounds(noisy, upper, self.widths.get(level))

    def wider(self) -> DpPlan:
        """Every window ``WINDOW_WIDENING`` times wider (G was out of the root tables' reach)."""
        widths = {lv: None if w is None else WINDOW_WIDENING * w for lv, w in self.widths.items()}
        return DpPlan(self.norm, self.faithfulness, self.total, widths, self.sizes)


def dp_plan(config: GroupSizesConfig, total: int) -> DpPlan:
    """Windows only where they are needed: l2 under level faithfulness, internal levels below
    the root (leaves are never listed; the root's table spans its children's windows)."""
    windowed = config.norm == "l2" and config.faithfulness == "level"
    inner = {lv.name for lv in config.hierarchy.levels[1:-1]}
    widths = {
        lv: first_window(config.budget.scale(lv, 2)) if windowed and lv in inner else None
        for lv in config.hierarchy.names
    }
    return DpPlan(config.norm, config.faithfulness, total, widths, config.groups.max_size)


def _tables_of(pdf: pd.DataFrame) -> tuple[list[str], list[list[CostTable]]]:
    pdf = pdf.sort_values(["geocode", "size"], kind="stable")
    geocodes, tables = [], []
    for geocode, rows in pdf.groupby("geocode", sort=True):
        geocodes.append(str(geocode))
        tables.append(
            [
                CostTable(int(lo), int(base), ints(lengths), ints(slopes))
                for lo, base, lengths, slopes in rows[
                    ["lo", "base", "lengths", "slopes"]
                ].itertuples(index=False)
            ]
        )
    return geocodes, tables


def _leaves_of(pdf: pd.DataFrame, plan: DpPlan) -> tuple[list[str], list[list[CostTable]]]:
    """A family of leaves from their noisy rows (sorted by geocode): each leaf's deviation
    tables on its bounds."""
    noisy = stacked(pdf["noisy"])
    tables = []
    for level, groups, row in zip(pdf["level"], pdf["groups"], noisy, strict=True):
        lo, hi = plan.bounds(level, groups, row)
        tables.append(node_tables(row, lo, hi, None, plan.norm))
    return list(pdf["geocode"]), tables


def _family_of(
    children: pd.DataFrame, plan: DpPlan, leaves: bool
) -> tuple[list[str], list[list[CostTable]]]:
    return _leaves_of(children, plan) if leaves else _tables_of(children)


def _table_rows(
    level: str, geocode: str, noisy: np.ndarray, tables: list[CostTable]
) -> list[tuple]:
    return [
        (level, geocode, j + 1, int(noisy[j]), t.lo, t.base, t.lengths, t.slopes)
        for j, t in enumerate(tables)
    ]


def _table_frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["level", "geocode", "size", "noisy", "lo", "base", "lengths", "slopes"]
    )


def _children_columns(children: DataFrame, leaves: bool) -> DataFrame:
    if leaves:
        return children.select("level", "geocode", "groups", "noisy")
    return children.drop("level")


def _children_order(leaves: bool) -> list[str]:
    """Leaves have one noisy row each; internal children one cost-table row per size."""
    return ["geocode"] if leaves else ["geocode", "size"]


def _with_widened(noisy_level: DataFrame, widened: DataFrame | None) -> DataFrame:
    """A level's noisy rows with ``widen``: the node's cells whose window is wider than its
    level's (``size, width`` pairs), or null."""
    rows = noisy_level.select("geocode", "level", "groups", "noisy")
    if widened is None:
        return rows.withColumn("widen", F.lit(None).cast("array<struct<size:int,width:bigint>>"))
    per_node = widened.groupBy("level", "geocode").agg(
        F.collect_list(F.struct("size", "width")).alias("widen")
    )
    return rows.join(per_node, ["level", "geocode"], "left")


def dp_tables(
    noisy_level: DataFrame,
    children: DataFrame,
    digits: int,
    plan: DpPlan,
    leaves: bool,
    widened: DataFrame | None = None,
) -> DataFrame:
    """Cost tables of one internal level's nodes, from their noisy rows and their children's
    tables (or, for the level above the leaves, the leaves' noisy rows). ``widened``
    (``WIDENED_SCHEMA``) lists cells whose l2 window is wider than their level's."""

    def parent(kids: pd.DataFrame) -> pd.DataFrame:
        noisy = ints(parent_value(kids, "noisy"))
        level, geocode, groups = (
            kids[c].iat[0] for c in ("parent_level", "parent", "parent_groups")
        )
        _, family = _family_of(kids, plan, leaves)
        lo, hi = plan.bounds(level, groups, noisy)
        tables = node_tables(noisy, lo, hi, merge_family(family), plan.norm)
        return _table_frame(_table_rows(level, geocode, noisy, tables))

    return level_families(
        _children_columns(children, leaves),
        _with_widened(noisy_level, widened if plan.batched else None),
        digits,
        _children_order(leaves),
        dp_tables_solver(plan, leaves) if plan.batched else parent,
        TABLE_SCHEMA,
        plan.batched,
    )


def dp_root(root_tables: DataFrame, groups: int) -> tuple[np.ndarray, int]:
    """The root's histogram (the dummy root of T^dp holding G) and its tables' optimum."""
    _, tables = _tables_of(root_tables.toPandas())
    counts = solve_root(tables[0], groups)
    return counts, sum(t.value(int(v)) for t, v in zip(tables[0], counts, strict=True))


# --- the splits: top-down ----------------------------------------------------------------------


def dp_families(
    level: str,
    children: DataFrame,
    parent_release: DataFrame,
    parent_digits: int,
    plan: DpPlan,
    leaves: bool,
) -> DataFrame:
    """One level's released histograms from its cost tables (or leaves' noisy rows) and the
    parents' released rows: the per-size greedy split (level), or the exact transportation
    split for the children's totals (node)."""

    def family(kids: pd.DataFrame) -> pd.DataFrame:
        geocodes, members = _family_of(kids, plan, leaves)
        counts = ints(parent_value(kids, "counts"))
        if plan.faithfulness == "level":
            out = split_family(members, counts)
        else:
            groups = np.array([t[0].hi for t in members], dtype=np.int64)
            out = solve_family(members, counts, groups)
        return release_rows(level, geocodes, out, _children_noisy(kids, plan, leaves))

    return level_families(
        _children_columns(children, leaves),
        parent_release,
        parent_digits,
        _children_order(leaves),
        dp_split_solver(level, plan, leaves) if plan.batched else family,
        DP_RELEASE_SCHEMA,
        plan.batched,
    )


def _children_noisy(kids: pd.DataFrame, plan: DpPlan, leaves: bool) -> np.ndarray:
    """The children's noisy values, ``(children, N)``, in their rows' order: a leaf's row holds
    its histogram, an internal child's table rows (one per size) one value each."""
    if leaves:
        return stacked(kids["noisy"])
    return kids["noisy"].to_numpy(dtype=np.int64).reshape(-1, plan.sizes)


# --- l2 under level faithfulness: whole batches of families at once -----------------------------


def _children_batch(
    batch: pd.DataFrame, starts: np.ndarray, plan: DpPlan, leaves: bool
) -> tuple[LeafFamilies | TableFamilies, np.ndarray]:
    """A batch's children cells in family order (family = parent position x size), and the
    permutation from the batch's cells (rows x sizes for leaves, rows for tables) to it."""
    position = np.repeat(np.arange(starts.size), np.diff(np.append(starts, len(batch))))
    families = starts.size * plan.sizes
    if leaves:
        order, family = family_order(position, plan.sizes)
        noisy = stacked(batch["noisy"]).ravel()[order]
        return LeafFamilies(family, noisy, families), order
    family = position * plan.sizes + batch["size"].to_numpy(dtype=np.int64) - 1
    order = np.argsort(family, kind="stable")
    tables = Tables.of_segments(
        batch["lo"].to_numpy(dtype=np.int64),
        batch["base"].to_numpy(dtype=np.int64),
        [ints(x) for x in batch["lengths"]],
        [ints(x) for x in batch["slopes"]],
    )
    return TableFamilies(family[order], tables.take(order), families), order


def dp_tables_solver(plan: DpPlan, leaves: bool) -> FamilySolver:
    """The parents' cost tables of a batch of whole families (l2, level faithfulness)."""

    def solve(batch: pd.DataFrame) -> pd.DataFrame:
        starts, noisy = parent_rows(batch, "noisy")
        children, _ = _children_batch(batch, starts, plan, leaves)
        level = str(batch["parent_level"].iat[0])
        here = stacked(noisy).ravel()
        width = plan.widths.get(level)
        if width is None:
            lo, hi = cell_bounds(here, plan.total, None)
        else:
            widths = np.full(here.size, width, dtype=np.int64)
            widen = batch["parent_widen"].iloc[starts].to_numpy()
            for f in np.flatnonzero(pd.notna(widen)):  # the few families with widened cells
                for cell in widen[f]:
                    widths[f * plan.sizes + int(cell["size"]) - 1] = int(cell["width"])
            lo, hi = cell_bounds(here, plan.total, widths)
        tables = children.parent_tables(here, lo, hi)
        lengths, slopes = tables.segments()
        return pd.DataFrame(
            {
                "level": level,
                "geocode": np.repeat(batch["parent"].to_numpy()[starts], plan.sizes),
                "size": np.tile(np.arange(1, plan.sizes + 1, dtype=np.int32), starts.size),
                "noisy": here,
                "lo": tables.lo,
                "base": tables.base,
                "lengths": lengths,
                "slopes": slopes,
            }
        )

    return solve


def dp_split_solver(level: str, plan: DpPlan, leaves: bool) -> FamilySolver:
    """The children's released rows of a batch of whole families (l2, level faithfulness)."""

    def solve(batch: pd.DataFrame) -> pd.DataFrame:
        starts, counts = parent_rows(batch, "counts")
        children, order = _children_batch(batch, starts, plan, leaves)
        cells = np.empty(order.size, dtype=np.int64)
        cells[order] = children.split(stacked(counts).ravel())
        if leaves:
            assert isinstance(children, LeafFamilies)
            noisy = np.empty(order.size, dtype=np.int64)
            noisy[order] = children.noisy  # back from family order, not stacked again
            by_leaf = cells.reshape(-1, plan.sizes)
            return release_rows(level, list(batch["geocode"]), by_leaf, noisy)
        return pd.DataFrame(
            {
                "geocode": batch["geocode"].to_numpy(),
                "level": level,
                "size": batch["size"].to_numpy(dtype=np.int32),
                "count": cells,
                "noisy": batch["noisy"].to_numpy(dtype=np.int64),
            }
        )

    return solve


# --- the certificate loop -----------------------------------------------------------------------


def bound_cells(released: DataFrame, plan: DpPlan, widened: DataFrame | None) -> DataFrame:
    """Released cells (``DP_RELEASE_SCHEMA``) on an l2 window bound other than 0 and G (module
    docstring of ``group_sizes.solvers.cost_tables``), each with a window ``WINDOW_WIDENING`` times wider for the next
    round (``WIDENED_SCHEMA``): none certifies that the windowed optimum is the exact one."""
    widths = {lv: w for lv, w in plan.widths.items() if w is not None}
    if not widths:
        return released.sparkSession.createDataFrame([], WIDENED_SCHEMA)
    default = F.create_map(*[F.lit(x) for lv, w in widths.items() for x in (lv, w)])
    cells = released.filter(F.col("level").isin(list(widths)))
    if widened is not None:
        cells = cells.join(widened, ["level", "geocode", "size"], "left")
    else:
        cells = cells.withColumn("width", F.lit(None).cast("bigint"))
    w = F.coalesce(F.col("width"), default[F.col("level")])
    lo = F.greatest(F.lit(0), F.least(F.lit(plan.total), F.col("noisy") - w))
    hi = F.greatest(F.lit(0), F.least(F.lit(plan.total), F.col("noisy") + w))
    hit = ((F.col("count") <= lo) & (lo > 0)) | ((F.col("count") >= hi) & (hi < plan.total))
    return cells.filter(hit).select(
        "level", "geocode", "size", (WINDOW_WIDENING * w).alias("width")
    )


def release_objective(released: DataFrame, norm: str) -> int:
    """``sum f(count - noisy)`` over every released cell (``DP_RELEASE_SCHEMA``)."""
    d = F.col("count") - F.col("noisy")
    term = d * d if norm == "l2" else F.abs(d)
    return int(released.agg(F.sum(term).alias("s")).collect()[0]["s"] or 0)


def post_process_exact(
    spark: SparkSession, config: GroupSizesConfig, noisy: DataFrame, clock: Clock
) -> tuple[list[DataFrame], dict[str, int]]:
    """Bottom-up tables and top-down splits; under level faithfulness with l2, rerun with the
    cells on a window bound widened until none is (then the release is the exact optimum);
    a rerun rebuilds only the tables of those cells' ancestors, and the leaves (no windows)
    are split once, at the end."""
    geocode, groups, root_noisy = root_row(noisy, config.hierarchy)
    plan = dp_plan(config, groups)
    widened: DataFrame | None = None  # cells whose window is wider than their level's
    reuse: _Reuse | None = None
    rounds = 0
    while True:
        rounds += 1
        try:
            released, tables, lower_bound = _dp_pass(
                spark, config, noisy, plan, widened, reuse, (geocode, groups, root_noisy), clock
            )
        except WindowTooNarrow:
            plan, reuse = plan.wider(), None
            continue
        bound = settle(bound_cells(union(released), plan, widened))
        hits = bound.count()
        clock.lap(f"certificate_round_{rounds}")
        if hits == 0:
            break
        reuse = _Reuse(tables, bound)
        if widened is not None:
            cells = bound.unionByName(widened).groupBy("level", "geocode", "size")
            bound = cells.agg(F.max("width").alias("width"))
        widened = settle(bound)
    # The leaves have no windows: they are split once, after the certificate holds.
    levels = config.hierarchy.levels
    released.append(
        _release_level(noisy, tables, plan, released[-1], levels[-2], levels[-1], clock)
    )
    objective = release_objective(union(released), config.norm)
    clock.lap("objective")
    if config.faithfulness == "level" and objective != lower_bound:
        raise GuaranteeViolation(
            f"the dp release's objective {objective} is not its tables' optimum {lower_bound}"
        )
    widths = {f"window_{lv}": w for lv, w in plan.widths.items() if w is not None}
    return released, {
        "objective": objective,
        "lower_bound": int(lower_bound),
        "gap": objective - int(lower_bound),
        "rounds": rounds,
        **widths,
        "widened_cells": 0 if widened is None else widened.count(),
    }


@dataclass(frozen=True)
class _Reuse:
    """The previous pass's cost tables and the cells widened since: a node's table depends only
    on the windows in its subtree, so only the ancestors of those cells need new tables."""

    tables: dict[str, DataFrame]
    changed: DataFrame  # level, geocode, size, width


def _affected(reuse: _Reuse, config: GroupSizesConfig, depth: int) -> DataFrame:
    """Geocodes of level ``depth``'s nodes whose subtree holds a newly widened cell."""
    levels = config.hierarchy.levels
    digits = levels[depth].digits
    prefix = geocode_prefix(digits)
    below = [lv.name for lv in levels[depth:]]
    cells = reuse.changed.filter(F.col("level").isin(below))
    return cells.select(prefix.alias("geocode")).distinct()


def _dp_pass(
    spark: SparkSession,
    config: GroupSizesConfig,
    noisy: DataFrame,
    plan: DpPlan,
    widened: DataFrame | None,
    reuse: _Reuse | None,
    root: tuple[str, int, Any],  # the root's geocode, G and noisy values
    clock: Clock,
) -> tuple[list[DataFrame], dict[str, DataFrame], int]:
    levels = config.hierarchy.levels
    tables: dict[str, DataFrame] = {}
    below = noisy.filter(F.col("level") == levels[-1].name)
    for depth in reversed(range(len(levels) - 1)):
        level, leaves = levels[depth], depth == len(levels) - 2
        parents = noisy.filter(F.col("level") == level.name)
        if reuse is None:
            fresh = dp_tables(parents, below, level.digits, plan, leaves, widened)
            tables[level.name] = below = settle(fresh)
        else:
            affected = settle(_affected(reuse, config, depth))
            key = geocode_prefix(level.digits)
            kids = below.join(affected.withColumnRenamed("geocode", "key"), key == F.col("key"))
            fresh = dp_tables(
                parents.join(affected, "geocode", "left_semi"),
                kids.drop("key"),
                level.digits,
                plan,
                leaves,
                widened,
            )
            kept = reuse.tables[level.name].join(affected, "geocode", "left_anti")
            tables[level.name] = below = settle(kept.unionByName(fresh))
        clock.lap(f"cost_tables_{level.name}")
    geocode, groups, root_noisy = root
    counts, lower_bound = dp_root(tables[levels[0].name], groups)
    released = [root_release(spark, config.hierarchy.root.name, geocode, counts, root_noisy)]
    for parent, level in zip(levels[:-2], levels[1:-1], strict=True):
        released.append(_release_level(noisy, tables, plan, released[-1], parent, level, clock))
    return released, tables, lower_bound


def _release_level(
    noisy: DataFrame,
    tables: dict[str, DataFrame],
    plan: DpPlan,
    above: DataFrame,
    parent: Level,
    level: Level,
    clock: Clock,
) -> DataFrame:
    """One level's release, split from the level above's (its cost tables, or for the leaves
    their noisy rows)."""
    leaves = level.name not in tables
    children = noisy.filter(F.col("level") == level.name) if leaves else tables[level.name]
    parents = released_histograms(above)
    out = settle(dp_families(level.name, children, parents, parent.digits, plan, leaves))
    clock.lap(f"release_{level.name}")
    return out
