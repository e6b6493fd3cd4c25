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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.families import map_families
from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.topdown.config import RunConfig
from censusdp_spark.topdown.queries import TOTAL
from censusdp_spark.topdown.solvers.least_squares import solve_children
from censusdp_spark.topdown.solvers.passes import total_pass
from censusdp_spark.topdown.solvers.rounding import round_children
from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem

ESTIMATE_SCHEMA = "level string, geocode string, cells array<int>, counts array<bigint>"
# Rounding is an exact MILP; a family that HiGHS cannot prove optimal within this many seconds
# keeps the best feasible rounding found (every constraint still holds exactly).
ROUNDING_TIME_LIMIT_S = 20.0


@dataclass(frozen=True)
class LevelPlan:
    """Everything a task needs to solve one level's families (picklable, small)."""

    level: str
    is_root: bool
    n_cells: int
    query_names: tuple[str, ...]
    cell_to_marginal: tuple[np.ndarray, ...]
    marginal_sizes: tuple[int, ...]
    weights: np.ndarray  # 1 / sigma^2 per query
    structural_zero: np.ndarray  # bool per cell
    total_first: bool = False  # two passes: each child's total first (solvers.passes)


def level_plan(config: RunConfig, level: str) -> LevelPlan:
    """The plan of ``level``; with ``passes = ["total", "all"]`` there (``passes_at``) it fits
    each child's total first: with ``full_information`` the bottom-up totals, with
    ``topdown`` the level's ``total`` query (which the config then has)."""
    queries = config.queries[level]
    total_first = "total" in config.passes_at(level)
    zero = np.zeros(config.schema.n_cells, dtype=bool)
    zero[list(config.structural_zero_cells)] = True
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
    )


def solve_family(
    plan: LevelPlan, parent: np.ndarray | None, children: pd.DataFrame
) -> pd.DataFrame:
    """Integer estimates for one parent's children.

    ``parent`` is the dense integer estimate of the parent (None at the root); ``children`` has
    one row per (child ``geocode``, ``query``), sorted by geocode then query name (as
    ``map_families`` delivers them), with the ``noisy`` answer and the child's invariant total
    ``inv_total`` (null where the level has none).
    """
    geocodes, noisy, totals = family_arrays(plan, children)
    k = len(geocodes)
    if parent is None:
        active = np.flatnonzero(~plan.structural_zero)
    else:
        active = np.flatnonzero((parent > 0) & ~plan.structural_zero)
    x = np.zeros((k, active.size), dtype=np.int64)
    if active.size and parent is not None and k == 1:
        x[0] = parent[active]
    elif active.size:
        problem = ChildrenProblem(
            marginals=tuple(c2m[active] for c2m in plan.cell_to_marginal),
            marginal_sizes=plan.marginal_sizes,
            weights=plan.weights,
            noisy=noisy,
            parent=None if parent is None else parent[active].astype(np.int64),
            child_totals=totals,
        )
        if plan.total_first:
            problem = total_pass(problem, plan.query_names.index(TOTAL))
        x = round_children(problem, solve_children(problem), time_limit=ROUNDING_TIME_LIMIT_S)
    return estimate_rows(plan.level, geocodes, active, x)


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
) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray | None]:
    """Child geocodes, the noisy answers per query (plan order, ``(k, size)`` floats) and the
    invariant child totals (None when the level has none) of rows sorted by (geocode, query)."""
    by_name = sorted(plan.query_names)
    q = len(by_name)
    geocode = children["geocode"].to_numpy()
    names = children["query"].to_numpy()
    k = len(geocode) // q
    if (
        len(geocode) != k * q
        or not (names.reshape(k, q) == np.array(by_name, dtype=object)).all()
        or not (geocode.reshape(k, q) == geocode[::q, None]).all()
    ):
        raise RuntimeError(
            f"level {plan.level}: a family's rows are not one per (child, query) for"
            f" queries {by_name}"
        )
    rows = children["noisy"].to_numpy()
    noisy = tuple(
        np.stack(rows[by_name.index(name) :: q]).astype(np.float64) for name in plan.query_names
    )
    totals = children["inv_total"].iloc[::q]
    return geocode[::q], noisy, None if totals.isna().any() else totals.to_numpy(dtype=np.int64)


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


def worker_fault(fault: str) -> None:
    """Test hook: ``python_worker_once:<marker path>`` kills this Python worker the first time."""
    if fault.startswith("python_worker_once:"):
        marker = Path(fault.split(":", 1)[1])
        if not marker.exists():
            marker.touch()
            os._exit(23)


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
    fault: str = "",
) -> DataFrame:
    """Estimates of one level's nodes (lazy).

    ``noisy``: this level's rows of the noisy measurement table; ``invariant_totals``:
    ``geocode, inv_total`` for this level (possibly empty); ``parent_estimates``: the level
    above as ``geocode, cells, counts`` (None at the root). The children's rows meet their
    parent's estimate by a join on the parent geocode, then every family is solved by
    ``map_families`` (many families per Python call). ``fault`` is a test hook (see
    ``worker_fault``), empty in normal runs.
    """
    children = with_parent_estimates(
        noisy.select("geocode", "query", "noisy").join(invariant_totals, "geocode", "left"),
        parent_estimates,
        parent_digits,
    )
    return map_families(
        children,
        family=["parent"],
        order=["geocode", "query"],
        solve=_family_task(plan),
        schema=ESTIMATE_SCHEMA,
        on_task_start=lambda: worker_fault(fault),
    )
