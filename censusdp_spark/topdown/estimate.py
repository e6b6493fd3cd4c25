"""Estimation, level by level: each parent's children solved as one subproblem on an executor.

The root is solved alone; then for every level the noisy measurements of the children meet
their parent's estimate (a join on the parent geocode), are grouped by parent
(``engine.families.map_families``: many families per Python call) and each family is handed to
the pure-numpy solvers: weighted non-negative least squares with the children summing
to the parent's integer estimate cell by cell and the invariant totals held, then controlled
rounding to integers that keeps both. Cells where the parent is zero or that are structural
zeros are not variables at all. Nothing per node is collected to the driver.

With ``[estimation] passes = ["total", "all"]`` each family is estimated in the Census's two
passes (``solvers.passes``): the children's totals fitted to their noisy totals alone, then
every query with those totals held; the rounder rounds the totals first, then the cells.

Every child is weighted by the exact variances of its own rows of ``noisy_measurements``
(``sigma2``). With bypassing (``topdown.bypass``) a bypassed parent is not measured: at its own
level it is estimated, among its siblings, from the measurements of the lowest node of its
single-child chain, which hold the same people and spend the budget of every level of the chain
(``level_measurements`` relabels them to the parent's geocode). Its family then mixes children
measured with different weights, and possibly with a deeper level's queries (weight 0 for a
query a child was not asked): ``ChildrenProblem`` takes weights child by child. Every node of
the chain below it is a lone child and takes its parent's value, so the whole chain is released
as one node solved against its grandparent's estimate, with the chain's whole budget. The root
of a one-state run is estimated from the state's measurements in the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.families import map_families
from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.topdown.config import TopDownConfig
from censusdp_spark.topdown.observer import QUIET, RunObserver
from censusdp_spark.topdown.occupancy import allowed_entries, group_bounds, group_cells
from censusdp_spark.topdown.queries import TOTAL
from censusdp_spark.topdown.readers import OCCUPIED
from censusdp_spark.topdown.solvers.least_squares import solve_children
from censusdp_spark.topdown.solvers.passes import total_pass
from censusdp_spark.topdown.solvers.rounding import MilpLimits, round_children
from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem

ESTIMATE_SCHEMA = "level string, geocode string, cells array<int>, counts array<bigint>"
RELEASE_ROUNDING = MilpLimits(node_limit=1, abs_gap=2.0)
"""The rounding MILP stops at its root node, or once proven within 2 of the least summed query
deviation (persons over the whole family), keeping the best rounding found (every constraint
still holds exactly). No clock: a rerun or a resumed run of one secret rounds alike."""


@dataclass(frozen=True, kw_only=True)
class LevelPlan:
    """Everything a task needs to solve one level's families (picklable, small)."""

    level: str
    is_root: bool
    n_cells: int
    query_names: tuple[str, ...]
    cell_to_marginal: tuple[np.ndarray, ...]
    marginal_sizes: tuple[int, ...]
    weights: np.ndarray  # 1 / sigma^2 per query of the level's own budget
    structural_zero: np.ndarray  # bool per cell
    total_first: bool = False  # two passes: each child's total first (solvers.passes)
    stand_in_queries: tuple[tuple[str, np.ndarray, int], ...] = ()
    """With bypassing: ``(name, cell_to_marginal, size)`` of the deeper levels' queries that
    this level does not ask, which a bypassed node's stand-in may have been measured with."""
    query_sets: tuple[tuple[str, ...], ...] = ()
    """The sorted query names a family's child may have been measured with (one per level from
    this one down; only this level's without bypassing)."""
    occupancy: tuple[np.ndarray, ...] = ()
    """Per ``[[estimation.occupancy]]`` group, a bool per cell (``occupancy.group_cells``)."""

    @property
    def family_query_names(self) -> tuple[str, ...]:
        """The queries of a family's measurements: the level's own, then the stand-ins'."""
        return self.query_names + tuple(name for name, _, _ in self.stand_in_queries)

    @property
    def family_marginals(self) -> tuple[tuple[np.ndarray, ...], tuple[int, ...]]:
        """``cell_to_marginal`` and sizes of ``family_query_names``."""
        return (
            self.cell_to_marginal + tuple(c2m for _, c2m, _ in self.stand_in_queries),
            self.marginal_sizes + tuple(size for _, _, size in self.stand_in_queries),
        )


def level_plan(config: TopDownConfig, level: str) -> LevelPlan:
    """The plan of ``level``; with ``passes = ["total", "all"]`` there (``passes_at``) it fits
    each child's total first: with ``full_information`` the bottom-up totals, with
    ``topdown`` the level's ``total`` query (which the config then has)."""
    queries = config.queries[level]
    total_first = "total" in config.passes_at(level)
    zero = np.zeros(config.schema.n_cells, dtype=bool)
    zero[list(config.structural_zero_cells)] = True
    names = config.hierarchy.names
    below = names[names.index(level) :] if config.bypass_single_child else (level,)
    own = {q.name for q in queries}
    stand_ins: dict[str, tuple[str, np.ndarray, int]] = {}
    for deeper in below[1:]:
        for q in config.queries[deeper]:
            if q.name not in own and q.name not in stand_ins:
                stand_ins[q.name] = (q.name, q.cell_to_marginal, q.size)
    return LevelPlan(
        level=level,
        is_root=config.hierarchy.index(level) == 0,
        n_cells=config.schema.n_cells,
        query_names=tuple(q.name for q in queries),
        cell_to_marginal=tuple(q.cell_to_marginal for q in queries),
        marginal_sizes=tuple(q.size for q in queries),
        weights=np.array([1.0 / float(config.budget.sigma2_for(level, q.name)) for q in queries]),
        structural_zero=zero,
        total_first=total_first,
        stand_in_queries=tuple(stand_ins.values()),
        query_sets=tuple(
            dict.fromkeys(tuple(sorted(q.name for q in config.queries[lv])) for lv in below)
        ),
        occupancy=group_cells(config.occupancy, config.schema.n_cells),
    )


def level_measurements(
    noisy: DataFrame, hierarchy: Hierarchy, level: str, bypass: bool
) -> DataFrame:
    """The rows of ``noisy_measurements`` a level's estimation reads: its nodes' own, and with
    ``bypass`` for each of its bypassed nodes those of the measured node of its single-child
    chain (the one node at or below it whose ``budget_levels`` contain the level), under the
    bypassed node's geocode. Without bypassing: the level's rows, as they are."""
    if not bypass:
        return noisy.filter(F.col("level") == level)
    digits = hierarchy.level(level).digits
    below = list(hierarchy.names[hierarchy.index(level) :])
    return noisy.filter(
        F.col("level").isin(below) & F.array_contains("budget_levels", level)
    ).withColumn("geocode", geocode_prefix(digits))


def solve_family(
    plan: LevelPlan, parent: np.ndarray | None, children: pd.DataFrame
) -> pd.DataFrame:
    """Integer estimates for one parent's children.

    ``parent`` is the dense integer estimate of the parent (None at the root); ``children`` has
    one row per (child ``geocode``, ``query``), sorted by geocode then query name (as
    ``map_families`` delivers them), with the ``noisy`` answer, the child's invariant total
    ``inv_total`` (null where the level has none) and, with occupancy groups, its
    ``OCCUPIED`` bits.
    """
    geocodes, noisy, weights, totals = family_arrays(plan, children)
    k = len(geocodes)
    if parent is None:
        active = np.flatnonzero(~plan.structural_zero)
    else:
        active = np.flatnonzero((parent > 0) & ~plan.structural_zero)
    x = np.zeros((k, active.size), dtype=np.int64)
    if active.size and parent is not None and k == 1:
        x[0] = parent[active]
    elif active.size:
        stand_ins = len(noisy) > len(plan.query_names)
        marginals, sizes = plan.family_marginals if stand_ins else (
            plan.cell_to_marginal, plan.marginal_sizes
        )  # fmt: skip
        names = plan.family_query_names if stand_ins else plan.query_names
        # A query no child of the family was measured with is left out (it would only change
        # the rounding's objective): a bypassed root is then solved as its chain node would be.
        asked = np.flatnonzero(np.atleast_2d(weights).max(axis=0) > 0)
        if asked.size < len(noisy):
            noisy = tuple(noisy[q] for q in asked)
            weights = weights[..., asked]
            marginals = tuple(marginals[q] for q in asked)
            sizes = tuple(sizes[q] for q in asked)
            names = tuple(names[q] for q in asked)
        problem = ChildrenProblem(
            marginals=tuple(c2m[active] for c2m in marginals),
            marginal_sizes=sizes,
            weights=weights,
            noisy=noisy,
            parent=None if parent is None else parent[active].astype(np.int64),
            child_totals=totals,
            allowed=allowed_entries(plan.occupancy, child_bits(children), active),
            group_bounds=group_bounds(plan.occupancy, children, active),
        )
        if plan.total_first:
            problem = total_pass(problem, names.index(TOTAL))
        x = round_children(problem, solve_children(problem), RELEASE_ROUNDING)
    return estimate_rows(plan.level, geocodes, active, x)


def child_bits(children: pd.DataFrame) -> pd.Series | None:
    """Each child's ``OCCUPIED`` bits (rows sorted by geocode), or None without the column."""
    if OCCUPIED not in children.columns:
        return None
    return children[OCCUPIED][~children["geocode"].duplicated()].reset_index(drop=True)


def estimate_rows(
    level: str, geocodes: np.ndarray, active: np.ndarray, x: np.ndarray
) -> pd.DataFrame:
    """Rows of ``ESTIMATE_SCHEMA`` for integer histograms ``x`` (``(k, active.size)``) over the
    cells ``active``: the non-zero cells of each child, sparse."""
    cells, counts = [], []
    for row in x:
        keep = row > 0
        cells.append(active[keep].astype(np.int32))
        counts.append(row[keep].astype(np.int64))
    return pd.DataFrame({"level": level, "geocode": geocodes, "cells": cells, "counts": counts})


def family_arrays(
    plan: LevelPlan, children: pd.DataFrame
) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, np.ndarray | None]:
    """Child geocodes, the noisy answers per query (``(k, size)`` floats), the weights
    ``1 / sigma2`` of the children's rows (``(Q,)`` when every child has the same, else
    ``(k, Q)``, 0 for a query a child was not measured with) and the invariant child totals
    (None when the level has none) of rows sorted by (geocode, query).

    The queries are the level's own (``plan.query_names``) when every child was measured with
    them, else ``plan.family_query_names`` (a bypassed child's stand-in measured at a deeper
    level). ``RuntimeError`` unless every child's rows are one per query of one of
    ``plan.query_sets``."""
    by_name = sorted(plan.query_names)
    q = len(by_name)
    geocode = children["geocode"].to_numpy()
    names = children["query"].to_numpy()
    sigma2 = children["sigma2"].to_numpy()
    k = len(geocode) // q
    if (
        len(geocode) == k * q
        and (names.reshape(k, q) == np.array(by_name, dtype=object)).all()
        and (geocode.reshape(k, q) == geocode[::q, None]).all()
    ):
        rows = children["noisy"].to_numpy()
        order = [by_name.index(name) for name in plan.query_names]
        geocodes = geocode[::q]
        noisy = tuple(np.stack(rows[i::q]).astype(np.float64) for i in order)
        weights = _weights(sigma2).reshape(k, q)[:, order]
        totals = children["inv_total"].iloc[::q]
    else:
        geocodes, noisy, weights, totals = _mixed_family(plan, children, sigma2)
    shared = (weights == weights[:1]).all()
    child_totals = None if totals.isna().any() else totals.to_numpy(dtype=np.int64)
    return geocodes, noisy, weights[0] if shared else weights, child_totals


def _mixed_family(
    plan: LevelPlan, children: pd.DataFrame, sigma2: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, pd.Series]:
    """``family_arrays`` for children measured with different query sets."""
    names = plan.family_query_names
    marginals, sizes = plan.family_marginals
    geocode = children["geocode"].to_numpy()
    starts = np.flatnonzero(np.r_[True, geocode[1:] != geocode[:-1]])
    ends = np.r_[starts[1:], len(geocode)]
    k = len(starts)
    noisy = [np.zeros((k, size)) for size in sizes]
    weights = np.zeros((k, len(names)))
    answers = children["noisy"].to_numpy()
    queries = children["query"].to_numpy()
    inverse = _weights(sigma2)
    for c, (a, b) in enumerate(zip(starts, ends, strict=True)):
        mine = tuple(queries[a:b])
        if mine not in plan.query_sets:
            raise RuntimeError(
                f"level {plan.level}: child {geocode[a]!r} has rows for queries {list(mine)},"
                f" not one per query of any of {[list(s) for s in plan.query_sets]}"
            )
        for row in range(a, b):
            i = names.index(queries[row])
            noisy[i][c] = np.asarray(answers[row], dtype=np.float64)
            weights[c, i] = inverse[row]
    return geocode[starts], tuple(noisy), weights, children["inv_total"].iloc[starts]


def _weights(sigma2: np.ndarray) -> np.ndarray:
    """``1 / sigma2`` of exact fractions given as text (each distinct one parsed once)."""
    values = {s: 1.0 / float(Fraction(s)) for s in set(sigma2)}
    return np.array([values[s] for s in sigma2], dtype=np.float64)


def parent_histogram(family: pd.DataFrame, n_cells: int) -> np.ndarray:
    """The dense integer estimate of a family's parent from its ``parent_cells`` and
    ``parent_counts`` columns (zeros for a zero-population parent, which has no row)."""
    out = np.zeros(n_cells, dtype=np.int64)
    cells = family["parent_cells"].iat[0]
    if cells is not None:
        out[np.asarray(cells, dtype=np.int64)] = np.asarray(
            family["parent_counts"].iat[0], dtype=np.int64
        )
    return out


def _family_task(plan: LevelPlan) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def task(family: pd.DataFrame) -> pd.DataFrame:
        if plan.is_root:
            return solve_family(plan, None, family)
        return solve_family(plan, parent_histogram(family, plan.n_cells), family)

    return task


def with_parent_estimates(
    children: DataFrame, parent_estimates: DataFrame | None, parent_digits: int
) -> DataFrame:
    """``children`` rows with their ``parent`` geocode and, below the root, the parent's
    estimate as ``parent_cells, parent_counts`` (a left join on the parent geocode)."""
    children = children.withColumn("parent", geocode_prefix(parent_digits))
    if parent_estimates is None:
        return children
    return children.join(
        parent_estimates.select(
            F.col("geocode").alias("parent"),
            F.col("cells").alias("parent_cells"),
            F.col("counts").alias("parent_counts"),
        ),
        "parent",
        "left",
    )


def estimate_level(
    plan: LevelPlan,
    noisy: DataFrame,
    invariant_totals: DataFrame,
    parent_estimates: DataFrame | None,
    parent_digits: int,
    observer: RunObserver = QUIET,
) -> DataFrame:
    """Estimates of one level's nodes (lazy).

    ``noisy``: this level's rows of the noisy measurement table (``level_measurements``);
    ``invariant_totals``:
    ``geocode, inv_total`` for this level (possibly empty), with occupancy groups also each
    node's ``OCCUPIED`` bits (``occupancy.node_constraints``); ``parent_estimates``: the level
    above as ``geocode, cells, counts`` (None at the root). The children's rows meet their
    parent's estimate by a join on the parent geocode, then every family is solved by
    ``map_families`` (many families per Python call), each task announced to ``observer``.
    """
    children = with_parent_estimates(
        noisy.select("geocode", "query", "noisy", "sigma2").join(
            invariant_totals, "geocode", "left"
        ),
        parent_estimates,
        parent_digits,
    )
    return map_families(
        children,
        family=["parent"],
        order=["geocode", "query"],
        solve=_family_task(plan),
        schema=ESTIMATE_SCHEMA,
        on_task_start=observer.task_started,
    )
