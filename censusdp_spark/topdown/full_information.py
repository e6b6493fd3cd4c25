"""Full-information estimation on Spark, the top-down pass (``estimate_level_from_bottom_up``),
after the bottom-up pass (``bottom_up``) has written every level's ``bottom_up`` rows: the same
level-by-level pass as ``topdown.estimate``, but each child is fitted to its bottom-up mean
weighted by its precision (``solve_to_targets``), then the exact controlled rounding; a lone
child takes its parent. At the leaves that fit is ``topdown``'s own
(``bottom_up.leaves_fit_their_answers``), so the job runs ``topdown``'s leaf level there and the
leaves' rows of ``bottom_up`` serve only the level above. With ``passes = ["total", "all"]`` the
children's totals are fitted first to their bottom-up totals, each weighted by that total's own
precision, then held (``solvers.passes``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from censusdp_spark.engine.families import map_families
from censusdp_spark.topdown.bottom_up import ChildEstimates, children_columns, level_design
from censusdp_spark.topdown.estimate import (
    ESTIMATE_SCHEMA,
    RELEASE_ROUNDING,
    LevelPlan,
    child_bits,
    estimate_rows,
    parent_histogram,
    with_parent_estimates,
)
from censusdp_spark.topdown.observer import QUIET, RunObserver
from censusdp_spark.topdown.occupancy import allowed_entries, group_bounds
from censusdp_spark.topdown.solvers.gaussian_estimates import fitting_targets
from censusdp_spark.topdown.solvers.least_squares import solve_to_targets
from censusdp_spark.topdown.solvers.passes import total_pass_to_targets
from censusdp_spark.topdown.solvers.rounding import round_children
from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem, GroupBounds, PrecisionProblem
from censusdp_spark.topdown.solvers.symmetric_covariance import SymmetricLayout


def solve_family_from_bottom_up(
    plan: LevelPlan, parent: np.ndarray | None, children: pd.DataFrame, below: ChildEstimates
) -> pd.DataFrame:
    """Integer estimates for one parent's children from their bottom-up estimates.

    ``children``: one row per child sorted by geocode, with its ``bottom_up`` columns and
    ``inv_total`` (null where the level has none). Cells where the parent is zero are fixed
    at zero: each child's quadratic ``(x - b)^T P (x - b)`` restricted to the other cells ``I``
    is ``x_I^T P_II x_I - 2 x_I^T (P b)_I`` plus a constant, i.e. target ``P_II^{-1} (P b)_I``
    under precision ``P_II``.
    """
    geocodes = children["geocode"].to_numpy()
    totals_column = children["inv_total"]
    totals = None if totals_column.isna().any() else totals_column.to_numpy(dtype=np.int64)
    nonzero = np.flatnonzero(~plan.structural_zero)
    free = np.ones(nonzero.size, dtype=bool) if parent is None else parent[nonzero] > 0
    active = nonzero[free]
    k = len(geocodes)
    x = np.zeros((k, active.size), dtype=np.int64)
    if active.size and parent is not None and k == 1:
        x[0] = parent[active]
    elif active.size:
        estimates = below.estimates(children)
        targets, precisions = fitting_targets(
            estimates, below.precisions(children, estimates), free
        )
        parent_active = None if parent is None else parent[active].astype(np.int64)
        allowed = allowed_entries(plan.occupancy, child_bits(children), active)
        bounds = group_bounds(plan.occupancy, children, active)
        problem = PrecisionProblem(
            targets=targets,
            precisions=precisions,
            parent=parent_active,
            child_totals=totals,
            allowed=allowed,
            group_bounds=bounds,
        )
        if plan.total_first:
            problem = total_pass_to_targets(problem)
        x_hat = solve_to_targets(problem)
        x = round_children(
            _rounding_problem(
                plan, active, x_hat, parent_active, totals, problem.held_totals, allowed, bounds
            ),
            x_hat,
            RELEASE_ROUNDING,
        )
    return estimate_rows(plan.level, geocodes, active, x)


def _rounding_problem(
    plan: LevelPlan,
    active: np.ndarray,
    x_hat: np.ndarray,
    parent: np.ndarray | None,
    totals: np.ndarray | None,
    held: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
    bounds: GroupBounds | None = None,
) -> ChildrenProblem:
    """The rounding's view of a family: the level's queries on the active cells, and as
    "answers" those of the fractional solution (``round_children`` reads only the queries and
    the sums; it minimises the L1 deviation of every query's answers from ``x_hat``'s).
    ``held``: the totals a first pass held (then the totals are rounded first); ``allowed``:
    the entries the children may hold (``occupancy.allowed_entries``); ``bounds``: their group
    bounds (``occupancy.group_bounds``)."""
    marginals = tuple(c2m[active] for c2m in plan.cell_to_marginal)
    fitted = tuple(
        np.stack([np.bincount(m, row, minlength=size) for row in x_hat])
        for m, size in zip(marginals, plan.marginal_sizes, strict=True)
    )
    return ChildrenProblem(
        marginals=marginals,
        marginal_sizes=plan.marginal_sizes,
        weights=plan.weights,
        noisy=fitted,
        parent=parent,
        child_totals=totals,
        held_totals=held,
        allowed=allowed,
        group_bounds=bounds,
    )


def estimate_level_from_bottom_up(
    plan: LevelPlan,
    child_is_leaf: bool,
    bottom_up: DataFrame,
    invariant_totals: DataFrame,
    parent_estimates: DataFrame | None,
    parent_digits: int,
    observer: RunObserver = QUIET,
    layout: SymmetricLayout | None = None,
) -> DataFrame:
    """Estimates of one level's nodes (lazy), as ``estimate.estimate_level`` but fitted
    to this level's ``bottom_up`` rows. ``child_is_leaf``: this level is the leaf level (whose
    covariance is not stored); ``layout``: the run's covariance layout (``config_layout``)."""
    children = with_parent_estimates(
        children_columns(bottom_up).join(invariant_totals, "geocode", "left"),
        parent_estimates,
        parent_digits,
    )
    below = ChildEstimates(level_design(plan, layout), child_is_leaf, plan)

    def task(family: pd.DataFrame) -> pd.DataFrame:
        parent = None if plan.is_root else parent_histogram(family, plan.n_cells)
        return solve_family_from_bottom_up(plan, parent, family, below)

    return map_families(
        children,
        family=["parent"],
        order=["geocode"],
        solve=task,
        schema=ESTIMATE_SCHEMA,
        on_task_start=observer.task_started,
    )
