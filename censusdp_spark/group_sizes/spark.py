"""Group-size release on Spark: leaf histograms, the noise pass, post-processing level by level.

Privacy claim
-------------
Neighbouring datasets differ by one individual joining or leaving an existing group (the
geography is public and the groups stay, as in Kuo et al.), which moves one group of every
ancestor node from size j to j +/- 1 (or leaves it in the top-coded bucket). Per node that
changes the size histogram by at most 2 in L1 and the cumulative histogram ``H_1..H_N`` by
at most 1 (only ``H_j`` moves; ``H_N = G^r`` does not). Under level faithfulness (the
paper's) only the root's G is published: ``H_N`` is measured like the others and no ``G^r``
is written or read; under node faithfulness every ``G^r`` is published, and ``H_N`` is not
measured. Level ``l`` adds
two-sided geometric noise of scale ``Delta / epsilon_l`` to every cell of every node (every
size, zeros included), so each level is ``epsilon_l``-DP; nodes of a level are disjoint
(parallel composition) and levels compose to ``sum_l epsilon_l = epsilon`` (checked exactly by
``split_epsilon``). With the paper's even split: scale ``2L/epsilon`` (histograms) and
``L/epsilon`` (cumulative). The noise is drawn by *noise group*, as TopDown's
(``topdown.measure``): the nodes of level ``l`` sharing their ancestor ``a``
``NOISE_GROUP_DEPTH`` levels up (``engine.families.noise_group``), sorted by geocode, take their
cells node after node from one keyed stream ``keyed_rng(secret, "pgsr", measurement, l, a)``, in
one ``discrete_laplace`` call per group. A group's members and their order depend only on the
public geography, so a retried or speculative task redraws identical noise; distinct keys get
independent streams and every draw is a fresh exact discrete Laplace, so the noise of every
(node, cell) is independent of every other and of the data. ``dp`` and ``relaxed`` share the
histogram measurement, so with one secret they post-process the *same* noisy table. Everything
after ``measure`` reads only the ``noisy_measurements`` table (noisy values and the public
``G^r``), so it is post-processing.

Data shapes
-----------
leaves ``geocode, cells, counts`` (cells = size - 1, non-zero only; confidential) ->
node histograms ``level, geocode, cells, counts`` (confidential, memory only) ->
``noisy_measurements`` ``level, geocode, measurement, groups, noisy`` (dense; written once;
``groups`` null below the root under level faithfulness) ->
per mechanism, level by level: cost tables ``level, geocode, size, noisy, lo, base, lengths,
slopes`` of internal nodes (dp, bottom-up; the leaves' tables are rebuilt from their noisy
rows inside the parent's task), real-valued solutions ``level, geocode, solution`` (relaxed) ->
released rows ``geocode, level, size, count`` (size 1..N, every size of every node; the dp
release's rows also carry the cell's ``noisy`` value until the write, ``DP_RELEASE_SCHEMA``).
Every family's children rows meet their parent's row in one shuffle (the parent's row
travels with them, ``engine.families.map_children``) and are handed to the solvers many
families per Python call; under l2 and level faithfulness (the default) a task's whole families go
to the vectorised solvers of ``group_sizes.solvers.batch`` in one call. Nothing per node is
collected to the driver except the root's own row.

The dp release under l2 and level faithfulness is certified exact in rounds: windows of
half-width ``cost_tables.first_window`` (a few noise scales) around each internal cell's noisy
value; after a pass, ``bound_cells`` lists the released cells on a window bound other than 0 and
G, those cells (only) get windows ``WINDOW_WIDENING`` times wider (``level, geocode, size, width``, joined to
the parents of the next pass) and the pass is redone, until no cell is on a bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from censusdp_spark.engine.families import (
    FamilySolver,
    family_starts,
    map_children,
    map_families,
    noise_group,
)
from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.group_sizes.config import PgsrConfig
from censusdp_spark.group_sizes.memory import ARROW_BATCH_ROWS
from censusdp_spark.group_sizes.solvers.batch import (
    LeafFamilies,
    TableFamilies,
    Tables,
    family_order,
)
from censusdp_spark.group_sizes.solvers.cost_tables import (
    WINDOW_WIDENING,
    CostTable,
    cell_bounds,
    first_window,
    merge_family,
    node_tables,
    solve_family,
    solve_root,
    split_family,
)
from censusdp_spark.group_sizes.solvers.cumulative import cumulative_family, to_cumulative
from censusdp_spark.group_sizes.solvers.relaxed import RelaxedSolution, relaxed_qp, solve_relaxed
from censusdp_spark.group_sizes.solvers.tree import GroupTree
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy import discrete_laplace, keyed_rng

MECHANISM = "pgsr"
NOISY_SCHEMA = (
    "level string, geocode string, measurement string, groups bigint, noisy array<bigint>"
)
TABLE_SCHEMA = "level string, geocode string, size int, noisy bigint, lo bigint, base bigint, lengths array<bigint>, slopes array<bigint>"
SOLUTION_SCHEMA = "level string, geocode string, solution array<double>"
RELEASE_SCHEMA = "geocode string, level string, size int, count bigint"
DP_RELEASE_SCHEMA = RELEASE_SCHEMA + ", noisy bigint"
"""The dp release's rows carry each cell's noisy value, so that the objective and the window
certificate are sums and filters over the released rows, not joins with the measurements."""


# --- measurement -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NoisePlan:
    """What the noise pass needs (picklable, small)."""

    measurement: str  # "histogram" (dp, relaxed) or "cumulative"
    sizes: int
    scales: Mapping[str, Fraction]  # geometric scale per level
    faithfulness: str = "level"
    root: str = ""  # the root level: the only node whose number of groups (G) is written


def noise_plan(config: PgsrConfig, mechanism: str) -> NoisePlan:
    measurement = "cumulative" if mechanism == "cumulative" else "histogram"
    sensitivity = 1 if measurement == "cumulative" else 2
    scales = {lv: config.budget.scale(lv, sensitivity) for lv in config.hierarchy.names}
    return NoisePlan(
        measurement,
        config.groups.max_size,
        scales,
        config.faithfulness,
        config.hierarchy.root.name,
    )


def exact_measurements(plan: NoisePlan, histograms: np.ndarray) -> np.ndarray:
    """What is measured of ``(k, N)`` dense histograms (confidential): the histograms, or the
    cumulative counts ``H_1..H_N`` under level faithfulness (``H_N = G^r`` is not public),
    ``H_1..H_{N-1}`` under node."""
    if plan.measurement == "histogram":
        return histograms
    if plan.faithfulness == "level":
        return np.cumsum(histograms, axis=-1)
    return to_cumulative(histograms)


def noisy_group(
    secret: bytes, plan: NoisePlan, level: str, group: str, histograms: np.ndarray
) -> np.ndarray:
    """Noisy measurements of one noise group's nodes (``(k, N)`` histograms sorted by geocode):
    every cell of every node from the group's keyed stream, node after node, one sampler call."""
    exact = exact_measurements(plan, histograms)
    if exact.size == 0:
        return exact
    rng = keyed_rng(secret, MECHANISM, plan.measurement, level, group)
    return exact + discrete_laplace(plan.scales[level], exact.size, rng).reshape(exact.shape)


def _dense(cells: Sequence[Any], counts: Sequence[Any], n: int) -> np.ndarray:
    """``(k, n)`` dense histograms of ``k`` sparse ones (cells and counts per node)."""
    lengths = np.fromiter((len(c) for c in cells), dtype=np.int64, count=len(cells))
    out = np.zeros((len(cells), n), dtype=np.int64)
    if lengths.sum():
        rows = np.repeat(np.arange(len(cells)), lengths)
        out[rows, np.concatenate(cells).astype(np.int64)] = np.concatenate(counts)
    return out


def noise_solver(secret: bytes, plan: NoisePlan) -> FamilySolver:
    """What one Python call of the noise pass runs on one noise group's rows."""

    def noise(nodes: pd.DataFrame) -> pd.DataFrame:
        level, group = nodes["level"].iat[0], nodes["group"].iat[0]
        histograms = _dense(list(nodes["cells"]), list(nodes["counts"]), plan.sizes)
        public = plan.faithfulness == "node" or level == plan.root
        groups = histograms.sum(axis=1) if public else [None] * len(nodes)
        return pd.DataFrame(
            {
                "level": level,
                "geocode": nodes["geocode"].to_numpy(),
                "measurement": plan.measurement,
                "groups": pd.array(groups, dtype="Int64"),
                "noisy": list(noisy_group(secret, plan, level, group, histograms)),
            }
        )

    return noise


def measure(nodes: DataFrame, plan: NoisePlan, secret: bytes, hierarchy: Hierarchy) -> DataFrame:
    """Noisy measurements of every node (lazy; the caller writes them once), one noise group at a
    time. ``groups`` holds the public number of groups: every node's under node faithfulness,
    only the root's (G) under level faithfulness (null elsewhere), so no later stage can read a
    ``G^r``."""
    return map_families(
        nodes.withColumn("group", noise_group(hierarchy)),
        family=["level", "group"],
        order=["geocode"],
        solve=noise_solver(secret, plan),
        schema=NOISY_SCHEMA,
    )


# --- the geography's shape (public), for the memory check at the door ------------------------


def leaf_nodes(leaves: DataFrame, hierarchy: Hierarchy) -> DataFrame:
    """``level, geocode`` of every node above and at the leaves' ``geocode``s (one scan)."""
    node = [
        F.struct(F.lit(lv.name).alias("level"), geocode_prefix(lv.digits).alias("geocode"))
        for lv in hierarchy.levels
    ]
    pairs = leaves.select(F.explode(F.array(*node)).alias("node"))
    return pairs.select("node.level", "node.geocode").distinct()


def arrow_batch_rows(spark: SparkSession) -> int:
    """Rows per Python call of the session (``spark.sql.execution.arrow.maxRecordsPerBatch``;
    0 or less: no limit)."""
    value = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", None)
    return ARROW_BATCH_ROWS if value is None else int(value)


# --- post-processing: shared plumbing ----------------------------------------------------------


def _ints(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _release_rows(
    level: str, geocodes: list[str], counts: np.ndarray, noisy: np.ndarray | None = None
) -> pd.DataFrame:
    """Long rows (``RELEASE_SCHEMA``, or ``DP_RELEASE_SCHEMA`` with the nodes' ``noisy``) of
    ``(k, N)`` released histograms."""
    k, n = counts.shape
    rows = pd.DataFrame(
        {
            "geocode": np.repeat(np.asarray(geocodes, dtype=object), n),
            "level": level,
            "size": np.tile(np.arange(1, n + 1, dtype=np.int32), k),
            "count": counts.ravel().astype(np.int64),
        }
    )
    if noisy is not None:
        rows["noisy"] = noisy.ravel().astype(np.int64)
    return rows


def released_histograms(released: DataFrame) -> DataFrame:
    """Long ``geocode, size, count`` -> ``geocode, counts`` (dense, by size)."""
    nested = released.groupBy("geocode").agg(
        F.sort_array(F.collect_list(F.struct("size", "count"))).alias("h")
    )
    return nested.select("geocode", F.col("h.count").alias("counts"))


def _families(
    children: DataFrame,
    parents: DataFrame,
    parent_digits: int,
    order: Sequence[str],
    solve: FamilySolver,
    schema: str,
    batched: bool = False,
) -> DataFrame:
    """``solve`` applied to every family of a level (lazily): one parent's children rows sorted
    by ``order``, each carrying its parent's geocode in ``parent`` and its columns as
    ``parent_<name>`` (``map_children``: one shuffle, many families per Python call; with
    ``batched``, all of a batch's whole families in one call)."""
    key = geocode_prefix(parent_digits)
    return map_children(children, parents, key, order, solve, schema, batched)


def _parent_value(family: pd.DataFrame, column: str) -> Any:
    """The parent's ``column`` of a single family (the same on every row)."""
    return _parent_rows(family, column)[1].iat[0]


def root_row(noisy: DataFrame, hierarchy: Hierarchy) -> tuple[str, int, np.ndarray]:
    """The root's ``geocode, groups, noisy`` (one row: noisy values and the public G)."""
    row = (
        noisy.filter(F.col("level") == hierarchy.root.name)
        .select("geocode", "groups", "noisy")
        .collect()
    )
    if len(row) != 1:
        raise RuntimeError(f"expected one root node, found {len(row)}")
    return row[0]["geocode"], int(row[0]["groups"]), _ints(row[0]["noisy"])


# --- dp: cost tables bottom-up, then families top-down ----------------------------------------


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


def dp_plan(config: PgsrConfig, total: int) -> DpPlan:
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
                CostTable(int(lo), int(base), _ints(lengths), _ints(slopes))
                for lo, base, lengths, slopes in rows[
                    ["lo", "base", "lengths", "slopes"]
                ].itertuples(index=False)
            ]
        )
    return geocodes, tables


def _leaves_of(pdf: pd.DataFrame, plan: DpPlan) -> tuple[list[str], list[list[CostTable]]]:
    """A family of leaves from their noisy rows (sorted by geocode): each leaf's deviation
    tables on its bounds."""
    noisy = _stacked(pdf["noisy"])
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


WIDENED_SCHEMA = "level string, geocode string, size int, width bigint"


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
        noisy = _ints(_parent_value(kids, "noisy"))
        level, geocode, groups = (
            kids[c].iat[0] for c in ("parent_level", "parent", "parent_groups")
        )
        _, family = _family_of(kids, plan, leaves)
        lo, hi = plan.bounds(level, groups, noisy)
        tables = node_tables(noisy, lo, hi, merge_family(family), plan.norm)
        return _table_frame(_table_rows(level, geocode, noisy, tables))

    return _families(
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
        counts = _ints(_parent_value(kids, "counts"))
        if plan.faithfulness == "level":
            out = split_family(members, counts)
        else:
            groups = np.array([t[0].hi for t in members], dtype=np.int64)
            out = solve_family(members, counts, groups)
        return _release_rows(level, geocodes, out, _children_noisy(kids, plan, leaves))

    return _families(
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
        return _stacked(kids["noisy"])
    return kids["noisy"].to_numpy(dtype=np.int64).reshape(-1, plan.sizes)


# --- dp, l2 under level faithfulness: whole batches of families at once -------------------------


def _parent_rows(batch: pd.DataFrame, column: str) -> tuple[np.ndarray, pd.Series]:
    """Each family's first row in a batch and its parent's ``column`` (a family whose parent
    has no row is an error, not a silent zero)."""
    starts = family_starts(batch, ["parent"])
    values = batch[f"parent_{column}"].iloc[starts]
    if values.isna().any():
        missing = batch["parent"].iat[int(starts[np.flatnonzero(values.isna().to_numpy())[0]])]
        raise RuntimeError(f"no parent row for the family of {missing}")
    return starts, values


def _stacked(arrays: pd.Series) -> np.ndarray:
    """An array column of equal-length arrays as one (rows x length) int64 matrix."""
    return np.stack(arrays.to_numpy()).astype(np.int64, copy=False)


def _children_batch(
    batch: pd.DataFrame, starts: np.ndarray, plan: DpPlan, leaves: bool
) -> tuple[LeafFamilies | TableFamilies, np.ndarray]:
    """A batch's children cells in family order (family = parent position x size), and the
    permutation from the batch's cells (rows x sizes for leaves, rows for tables) to it."""
    position = np.repeat(np.arange(starts.size), np.diff(np.append(starts, len(batch))))
    families = starts.size * plan.sizes
    if leaves:
        order, family = family_order(position, plan.sizes)
        noisy = _stacked(batch["noisy"]).ravel()[order]
        return LeafFamilies(family, noisy, families), order
    family = position * plan.sizes + batch["size"].to_numpy(dtype=np.int64) - 1
    order = np.argsort(family, kind="stable")
    tables = Tables.of_segments(
        batch["lo"].to_numpy(dtype=np.int64),
        batch["base"].to_numpy(dtype=np.int64),
        [_ints(x) for x in batch["lengths"]],
        [_ints(x) for x in batch["slopes"]],
    )
    return TableFamilies(family[order], tables.take(order), families), order


def dp_tables_solver(plan: DpPlan, leaves: bool) -> FamilySolver:
    """The parents' cost tables of a batch of whole families (l2, level faithfulness)."""

    def solve(batch: pd.DataFrame) -> pd.DataFrame:
        starts, noisy = _parent_rows(batch, "noisy")
        children, _ = _children_batch(batch, starts, plan, leaves)
        level = str(batch["parent_level"].iat[0])
        here = _stacked(noisy).ravel()
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
        starts, counts = _parent_rows(batch, "counts")
        children, order = _children_batch(batch, starts, plan, leaves)
        cells = np.empty(order.size, dtype=np.int64)
        cells[order] = children.split(_stacked(counts).ravel())
        if leaves:
            assert isinstance(children, LeafFamilies)
            noisy = np.empty(order.size, dtype=np.int64)
            noisy[order] = children.noisy  # back from family order, not stacked again
            by_leaf = cells.reshape(-1, plan.sizes)
            return _release_rows(level, list(batch["geocode"]), by_leaf, noisy)
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


# --- relaxed: the whole-tree QP on the driver, rounded ----------------------------------------


def collected_tree(
    noisy: DataFrame, hierarchy: Hierarchy, faithfulness: str
) -> tuple[pd.DataFrame, GroupTree]:
    """Every node's noisy measurements on the driver, as a ``GroupTree`` (nodes by level, then
    geocode) with their ``level, geocode`` rows. Under level faithfulness only the root's G is
    public; the other nodes' ``groups`` are filled along one path so the tree is well formed
    (the whole-tree QP reads only the root's)."""
    pdf = pd.DataFrame(noisy.select("level", "geocode", "groups", "noisy").toPandas())
    depth = pdf["level"].map({name: i for i, name in enumerate(hierarchy.names)})
    pdf = pdf.assign(depth=depth).sort_values(["depth", "geocode"]).reset_index(drop=True)
    index = {(d, g): i for i, (d, g) in enumerate(zip(pdf["depth"], pdf["geocode"], strict=True))}
    digits = [lv.digits for lv in hierarchy.levels]
    parent = np.array(
        [
            -1 if d == 0 else index[(d - 1, g[: digits[d - 1]])]
            for d, g in zip(pdf["depth"], pdf["geocode"], strict=True)
        ],
        dtype=np.int64,
    )
    values = np.vstack([_ints(v) for v in pdf["noisy"]])
    if faithfulness == "node":
        groups = pdf["groups"].to_numpy(dtype=np.int64)
    else:
        groups = np.zeros(len(pdf), dtype=np.int64)
        node = len(pdf) - 1  # the last node is a leaf: G along its path to the root
        while node >= 0:
            groups[node] = int(pdf["groups"].iat[0])
            node = int(parent[node])
    return pdf[["level", "geocode"]], GroupTree(parent, values, groups)


def relaxed_tree(
    spark: SparkSession, noisy: DataFrame, hierarchy: Hierarchy, faithfulness: str
) -> tuple[DataFrame, RelaxedSolution]:
    """The paper's M_H relaxation over the whole tree in one QP on the driver (the caller has
    checked ``RELAXED_MAX_CELLS``), with its independent check; rows as ``SOLUTION_SCHEMA``."""
    rows, tree = collected_tree(noisy, hierarchy, faithfulness)
    solved = solve_relaxed(tree, faithfulness)
    frame = rows.assign(solution=list(solved.x))
    return spark.createDataFrame(frame, SOLUTION_SCHEMA), solved


# --- relaxed_families: per-family QPs top-down, rounded at the end -----------------------------


def relaxed_family_solver(faithfulness: str) -> FamilySolver:
    """One family's relaxed (real-valued) solution below its parent's fixed one."""

    def family(children: pd.DataFrame) -> pd.DataFrame:
        fixed = np.asarray(_parent_value(children, "solution"), dtype=np.float64)
        k = len(children)
        noisy = np.vstack([np.zeros(fixed.size, dtype=np.int64), *map(_ints, children["noisy"])])
        groups = (
            children["groups"].to_numpy(dtype=np.int64)
            if faithfulness == "node"
            else np.zeros(k, dtype=np.int64)  # not read: level faithfulness is the root's
        )
        tree = GroupTree(np.array([-1] + [0] * k), noisy, np.concatenate([[groups.sum()], groups]))
        solution = relaxed_qp(tree, faithfulness, fixed_root=fixed)[1:]
        return pd.DataFrame(
            {
                "level": children["level"].to_numpy(),
                "geocode": children["geocode"].to_numpy(),
                "solution": list(solution),
            }
        )

    return family


def relaxed_families(
    noisy_level: DataFrame, parent_solution: DataFrame, parent_digits: int, faithfulness: str
) -> DataFrame:
    """One level's relaxed (real-valued) solution, family by family below the fixed parents."""
    return _families(
        noisy_level.select("level", "geocode", "groups", "noisy"),
        parent_solution.select("geocode", "solution"),
        parent_digits,
        ["geocode"],
        relaxed_family_solver(faithfulness),
        SOLUTION_SCHEMA,
    )


def relaxed_root(noisy: np.ndarray, groups: int, faithfulness: str) -> np.ndarray:
    tree = GroupTree(np.array([-1]), noisy[None, :], np.array([groups]))
    return relaxed_qp(tree, faithfulness)[0]


def rounded_release(solution: DataFrame) -> DataFrame:
    """The relaxed solution rounded cell by cell to the nearest integer, ties to even (as numpy)."""
    return solution.select(
        "geocode", "level", F.posexplode("solution").alias("pos", "value")
    ).select(
        "geocode",
        "level",
        (F.col("pos") + 1).cast("int").alias("size"),
        F.bround("value").cast("long").alias("count"),
    )


# --- cumulative: per-family integer programs top-down ------------------------------------------


def cumulative_solver(level: str, faithfulness: str, total: int) -> FamilySolver:
    """One family's released rows below its parent's released histogram (``parent_counts``)."""

    def family(children: pd.DataFrame) -> pd.DataFrame:
        noisy = _stacked(children["noisy"])
        caps = (
            children["groups"].to_numpy(dtype=np.int64)
            if faithfulness == "node"
            else np.full(len(children), total, dtype=np.int64)
        )
        parent = _ints(_parent_value(children, "counts"))
        counts = cumulative_family(noisy, parent, faithfulness, caps)
        return _release_rows(level, list(children["geocode"]), counts)

    return family


def cumulative_families(
    level: str,
    noisy_level: DataFrame,
    parent_release: DataFrame,
    parent_digits: int,
    faithfulness: str,
    total: int,
) -> DataFrame:
    """One level's released histograms: monotone, consistent, valid cumulative counts."""
    return _families(
        noisy_level.select("geocode", "groups", "noisy"),
        parent_release,
        parent_digits,
        ["geocode"],
        cumulative_solver(level, faithfulness, total),
        RELEASE_SCHEMA,
    )


# --- guarantees, objective, evaluation --------------------------------------------------------


def release_violations(
    released: DataFrame, noisy: DataFrame, hierarchy: Hierarchy, faithfulness: str, total: int
) -> dict[str, int]:
    """Counts of broken guarantees, in one Spark job: negative cells, (parent, size) pairs whose
    children do not sum to the parent, and faithfulness breaches: levels whose counts do not sum
    to G (level faithfulness) or nodes whose sizes do not sum to their public number of groups
    or that are missing (node). Only the three counts reach the driver."""
    sums = None
    for parent, child in zip(hierarchy.levels, hierarchy.levels[1:], strict=False):
        prefix = geocode_prefix(parent.digits)
        part = released.filter(F.col("level") == child.name).select(
            F.lit(parent.name).alias("level"), prefix.alias("geocode"), "size", "count"
        )
        sums = part if sums is None else sums.unionByName(part)
    assert sums is not None
    children = sums.groupBy("level", "geocode", "size").agg(F.sum("count").alias("children"))
    parents = released.filter(F.col("level") != hierarchy.leaf.name)
    inconsistent = parents.join(children, ["level", "geocode", "size"], "full_outer").filter(
        F.coalesce(F.col("count"), F.lit(0)) != F.coalesce(F.col("children"), F.lit(0))
    )
    if faithfulness == "level":
        levels = released.sparkSession.createDataFrame(
            [(lv,) for lv in hierarchy.names], "level string"
        )
        per_level = released.groupBy("level").agg(F.sum("count").alias("total"))
        unfaithful = levels.join(per_level, "level", "left").filter(
            F.coalesce(F.col("total"), F.lit(-1)) != F.lit(total)
        )
    else:
        totals = released.groupBy("level", "geocode").agg(F.sum("count").alias("total"))
        unfaithful = (
            noisy.select("level", "geocode", "groups")
            .join(totals, ["level", "geocode"], "full_outer")
            .filter(F.coalesce(F.col("total"), F.lit(-1)) != F.coalesce(F.col("groups"), F.lit(-1)))
        )
    kinds = {
        "negative_counts": released.filter(F.col("count") < 0),
        "children_not_summing_to_parent": inconsistent,
        "unfaithful": unfaithful,
    }
    flags = None
    for kind, rows in kinds.items():
        part = rows.select(F.lit(kind).alias("kind"))
        flags = part if flags is None else flags.unionByName(part)
    assert flags is not None
    found = {r["kind"]: int(r["count"]) for r in flags.groupBy("kind").count().collect()}
    return {kind: found.get(kind, 0) for kind in kinds}


def release_objective(released: DataFrame, norm: str) -> int:
    """``sum f(count - noisy)`` over every released cell (``DP_RELEASE_SCHEMA``)."""
    d = F.col("count") - F.col("noisy")
    term = d * d if norm == "l2" else F.abs(d)
    return int(released.agg(F.sum(term).alias("s")).collect()[0]["s"] or 0)


def evaluation(nodes: DataFrame, released: DataFrame) -> DataFrame:
    """Per level, over its nodes: ``l1_mean``, the mean L1 distance between released and true
    histograms (``sum_j |x_j - n_j|``, as ``bench_pgsr.py`` and ``docs/how-it-works.md`` report it), and
    the earthmover distance (L1 between cumulative histograms), mean and max. Uses the truth:
    internal only."""
    truth = nodes.select(
        "level", "geocode", F.explode(F.arrays_zip("cells", "counts")).alias("e")
    ).select(
        "level", "geocode", (F.col("e.cells") + 1).alias("size"), F.col("e.counts").alias("true")
    )
    diff = released.join(truth, ["level", "geocode", "size"], "full_outer").select(
        "level",
        "geocode",
        "size",
        (F.coalesce("count", F.lit(0)) - F.coalesce("true", F.lit(0))).alias("d"),
    )
    running = F.sum("d").over(Window.partitionBy("level", "geocode").orderBy("size"))
    per_node = (
        diff.withColumn("cumulative", running)
        .groupBy("level", "geocode")
        .agg(
            F.sum(F.abs("d")).alias("l1"),
            F.sum(F.abs("cumulative")).alias("emd"),
        )
    )
    return per_node.groupBy("level").agg(
        F.count("*").alias("nodes"),
        F.avg("l1").alias("l1_mean"),
        F.avg("emd").alias("emd_mean"),
        F.max("emd").cast("double").alias("emd_max"),
    )
