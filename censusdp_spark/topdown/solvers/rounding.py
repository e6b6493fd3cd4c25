"""Controlled rounding of the L2 estimate of one parent's children (the TopDown rounder).

Given the L2 estimate ``x_hat`` (shape ``(k, n)``), the rounded histograms are
``x = floor(x_hat) + b`` with ``b`` in ``{0, 1}`` chosen to

    minimise   sum_q sum_c || Q_q x_c - Q_q x_hat_c ||_1
    subject to sum_c x_c = parent                (cell by cell, when a parent is given),
               sum_j x_{c,j} = child_totals[c]   (when child totals are given),
               sum_j x_j = T                     (at the root: T = child_totals[0] if given,
                                                  else round(sum x_hat)),
               x_{c,j} = 0                       (where ``allowed[c, j]`` is False).

The objective is unweighted: every query's marginal cells count alike. Only entries with a
fractional part can move, and only the marginal cells that contain such an entry can deviate.
A forbidden entry's L2 estimate is exactly 0, so it never moves and stays 0 (checked: a
rounding that is not 0 there raises ``ValueError``). The same holds in the multi-pass rounder:
pass 1's rounding moves allowed entries only, so pass 2 has a solution with its totals.

Multi-pass rounding (``held_totals``: a two-pass L2 estimate, ``passes = ["total", "all"]``).
As the Census's ``MultipassRounder`` does, the children's totals are rounded first and then
held: pass 1 (``round_totals``) chooses the integer totals ``T`` minimising
``sum_c |T_c - sum_j x_hat_{c,j}|`` over the roundings that meet the parent cell by cell (the
other queries do not count); pass 2 is the rounding above with ``T`` as the child totals.
Pass 1's rounding meets the parent and has totals ``T``, so pass 2 always has a solution.

The constraint set is a transportation polytope whose vertices are integral, and the L2 estimate's
fractional parts are a point of it, so a rounding always exists when ``x_hat`` meets the
constraints up to round-off.

Which method solves it:

* Nested queries (the flow path). When, for every child, the queries' marginal cells restricted
  to its fractional entries are laminar (any two are disjoint or one contains the other; true
  for instance of {total, detailed}, of any chain of coarser and finer marginals, and of
  crossing marginals on children whose fractional entries happen not to cross), the problem is
  a minimum-cost flow with convex costs on one tree per child. Its constraint matrix is totally
  unimodular, so the best integral flow is optimal among all roundings, and
  ``laminar_rounding`` finds it by cancelling negative cycles until none is left, which
  certifies optimality (see that module). It ignores the MILP's limits, and is used while its
  ``k (n + 1)^2`` table of move costs has at most ``FLOW_SIZE_LIMIT`` entries (memory).
* Otherwise (crossing marginals, e.g. votingage and hisprace together) a small mixed-integer
  program: one binary per fractional entry and one continuous variable per affected marginal
  cell bounding the absolute deviation, solved to proven optimality (zero relative gap) by
  HiGHS through ``scipy.optimize.milp``. Its LP relaxation is solved first: an integral
  optimum of the relaxation is optimal for the program (its value bounds every rounding's),
  which on the production schema's block families is the common case (10 of 12 DC block
  groups) at a fraction of the branch and bound's time.
  ``MilpLimits`` may stop it early: a node limit and an absolute gap depend on the problem
  alone, so every run rounds alike; a time limit depends on the clock, so a busy machine may
  round otherwise.
* Large crossing families (more than ``MILP_SIZE_LIMIT`` fractional entries, or when HiGHS finds
  no rounding within its limit) use the cell-level rounding instead: minimise the L1
  deviation of the detailed cells only, sum_{c,j} |b_{c,j} - f_{c,j}| = sum f + sum (1 - 2 f) b,
  under the same sum constraints and with every child's total held (where the problem does not
  fix it, at ``round_totals``' L1-closest rounding of the child's estimated total, so the
  ``total`` query loses nothing to the fallback). Its constraint matrix is the incidence matrix
  of a bipartite graph (cells x children), which is totally unimodular, so a simplex vertex of
  the linear program is integral and optimal for that objective. It meets every constraint
  exactly; it does not weigh the other queries' deviations.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import scipy.sparse as sparse
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, linprog, milp

from censusdp_spark.topdown.solvers.laminar_rounding import is_laminar, round_laminar
from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem

INTEGRAL_TOLERANCE = 1e-9
"""An estimate within this distance of an integer is taken to be that integer."""

MILP_SIZE_LIMIT = 4000
"""Fractional entries above which the query-level MILP is skipped for the cell-level rounding."""

_STOPPED_WITH_A_SOLUTION = (0, 1, 4)
"""``milp`` statuses that can carry a rounding: optimal, time limit, and HiGHS's node limit
(reported as 4, "other"); the rounding is then checked against the sum rows."""

FLOW_SIZE_LIMIT = 4_000_000
"""Largest ``k (n + 1)^2`` (entries of the move-cost table, 8 bytes each) for the flow path."""


def round_children(
    problem: ChildrenProblem,
    x_hat: np.ndarray,
    limits: MilpLimits | None = None,
) -> np.ndarray:
    """Integer histograms closest to ``x_hat`` in every query's answers, meeting the invariants.

    Returns an int64 array of shape ``(k, n)`` with entries ``floor(x_hat)`` or one more, that
    meets the constraints in the module docstring and minimises the total L1 deviation of all
    query answers from those of ``x_hat``. Integral input is returned unchanged. With
    ``held_totals`` the totals are rounded first (``round_totals``) and held, so the
    result's totals are ``round_totals(problem, x_hat)``.

    Nested queries (see the module docstring) are rounded optimally by a minimum-cost flow
    unless the family is very large. Otherwise, without ``limits`` the rounding is proven
    optimal, which for thousands of fractional entries under crossing marginals can take
    minutes. With ``limits`` the best rounding HiGHS has found when one is reached is
    returned: it meets every constraint but may not be optimal.

    Raises ``ValueError`` if ``x_hat`` has the wrong shape, is negative beyond round-off,
    does not meet the constraints closely enough for a rounding to exist, or is not 0 on an
    entry that ``allowed`` forbids.
    """
    return _allowed_only(problem, _round_children(problem, x_hat, limits or MilpLimits()))


def _allowed_only(problem: ChildrenProblem, rounded: np.ndarray) -> np.ndarray:
    """``rounded``, after checking that it is 0 wherever ``problem.allowed`` forbids."""
    if problem.allowed is not None and np.any(rounded[~problem.allowed] != 0):
        raise ValueError("allowed: the rounding is not 0 on a forbidden entry")
    return rounded


class MilpLimits(NamedTuple):
    """When the query-level MILP may stop short of a proven optimum (none by default)."""

    node_limit: int | None = None
    """Branch-and-bound nodes; 1 is the root's cuts and heuristics alone."""
    abs_gap: float = 0.0
    """Stop once the rounding is proven within this much of the least summed deviation."""
    time_limit: float | None = None
    """Seconds of wall clock: the one limit under which two runs may round differently."""

    def options(self) -> dict[str, float]:
        """A fresh HiGHS options dict (``scipy.optimize.milp`` pops keys from the one it gets)."""
        options: dict[str, float] = {"mip_rel_gap": 0.0}
        if self.abs_gap:
            options["mip_abs_gap"] = self.abs_gap
        if self.node_limit is not None:
            options["node_limit"] = self.node_limit
        if self.time_limit is not None:
            options["time_limit"] = self.time_limit
        return options


def _round_children(problem: ChildrenProblem, x_hat: np.ndarray, limits: MilpLimits) -> np.ndarray:
    floor, fraction = _split(problem, x_hat)
    moving = fraction > 0
    column_need, row_need = _needs(problem, x_hat, floor, fraction)
    if not moving.any():
        return floor
    children, cells = np.nonzero(moving)
    bounds = _binding_bounds(problem, (children, cells), floor)
    flow_size = problem.n_children * (problem.n_cells + 1) ** 2
    if bounds is None and flow_size <= FLOW_SIZE_LIMIT and is_laminar(problem.marginals, moving):
        return floor + round_laminar(problem.marginals, fraction, moving, column_need, row_need)
    fractional = fraction[children, cells]
    ups = None
    if children.shape[0] <= MILP_SIZE_LIMIT:
        rows, row_bounds = _sum_constraints(children, cells, column_need, row_need)
        ups = _round_queries(
            problem, (children, cells), fractional, (rows, row_bounds), bounds, limits
        )
    if ups is None:  # too large for the MILP, or no rounding found within its limits
        ups = _round_cells(
            _cell_level_rows(problem, (x_hat, floor, fraction), column_need, row_need, bounds),
            fractional,
        )
    rounded = floor.copy()
    rounded[children, cells] += ups
    return rounded


_RangeRows = tuple[sparse.csr_matrix, np.ndarray, np.ndarray]
"""Rows ``lower <= A b <= upper`` over the moving entries' round-ups ``b``."""


def _binding_bounds(
    problem: ChildrenProblem, moving: tuple[np.ndarray, np.ndarray], floor: np.ndarray
) -> _RangeRows | None:
    """The rows of ``problem.group_bounds`` that some rounding could break, over the moving
    ``(children, cells)`` entries: ``lower - sum floor <= sum b <= upper - sum floor`` per
    child and group whose range does not already contain every count of its moving entries;
    None when there are none (a rounding of the other constraints meets every bound)."""
    bounds = problem.group_bounds
    if bounds is None:
        return None
    children, cells = moving
    k, n_groups = bounds.lower.shape
    held = bounds.sums(floor.astype(float))
    grouped, key = bounds.entry_keys(children, cells)
    count = np.bincount(key, minlength=k * n_groups)
    low = bounds.lower.ravel() - held.ravel()
    high = bounds.upper.ravel() - held.ravel()
    binding = np.flatnonzero((low > 0) | (high < count))
    if binding.size == 0:
        return None
    row_of = np.full(k * n_groups, -1)
    row_of[binding] = np.arange(binding.size)
    entry = grouped[row_of[key] >= 0]
    rows = row_of[key][row_of[key] >= 0]
    matrix = sparse.csr_matrix(
        (np.ones(rows.size), (rows, entry)), shape=(binding.size, children.size)
    )
    return matrix, low[binding], np.minimum(high[binding], count[binding])


def _cell_level_rows(
    problem: ChildrenProblem,
    rounding: tuple[np.ndarray, np.ndarray, np.ndarray],
    column_need: np.ndarray | None,
    row_need: np.ndarray | None,
    bounds: _RangeRows | None,
) -> _RangeRows:
    """The cell-level rounding's rows: every cell and child sum, and the binding bounds.

    Free totals could each move by up to the child's number of fractional entries, so they are
    held at ``round_totals``' L1-closest ones, which some rounding meets: the cell and child
    rows stay a bipartite incidence matrix and the LP's vertex is integral. With bounds such a
    total might leave them no room, so each free total is instead kept between the floor and
    the ceiling of its fractional sum: the child rows and the bound rows within a child are
    laminar, as are the cell rows, so the matrix is still totally unimodular."""
    x_hat, floor, fraction = rounding
    children, cells = np.nonzero(fraction > 0)
    if row_need is None and bounds is None:
        totals = _row_target(problem, x_hat, floor, fraction, column_need, first_pass=True)
        assert totals is not None  # first_pass always fixes them
        row_need = totals - floor.sum(axis=1)
    rows, need = _sum_constraints(children, cells, column_need, row_need)
    lower, upper = need, need
    if row_need is None:
        child_rows, _ = _sum_constraints(children, cells, None, np.zeros(floor.shape[0]))
        spread = fraction.sum(axis=1)[np.unique(children)]
        rows = sparse.vstack([rows, child_rows], format="csr")
        lower = np.concatenate([lower, np.floor(spread + INTEGRAL_TOLERANCE)])
        upper = np.concatenate([upper, np.ceil(spread - INTEGRAL_TOLERANCE)])
    if bounds is not None:
        rows = sparse.vstack([rows, bounds[0]], format="csr")
        lower, upper = np.concatenate([lower, bounds[1]]), np.concatenate([upper, bounds[2]])
    return rows, lower, upper


def _round_queries(
    problem: ChildrenProblem,
    moving: tuple[np.ndarray, np.ndarray],
    fractional: np.ndarray,
    sums: tuple[sparse.csr_matrix, np.ndarray],
    bounds: _RangeRows | None,
    limits: MilpLimits,
) -> np.ndarray | None:
    """The query-level MILP's 0/1 round-ups on the ``moving`` ``(children, cells)`` entries
    (fractional parts ``fractional``) under the sum rows ``sums`` and the binding group
    ``bounds``; None if HiGHS finds no rounding within ``limits``."""
    children, cells = moving
    rows, row_lower = sums
    row_upper = row_lower
    if bounds is not None:
        rows = sparse.vstack([rows, bounds[0]], format="csr")
        row_lower = np.concatenate([row_lower, bounds[1]])
        row_upper = np.concatenate([row_upper, bounds[2]])
    n_binary = children.shape[0]
    binary_cost, deviation, lower, upper = _deviation_terms(problem, children, cells, fractional)
    n_deviation = lower.size // 3
    matrix = _stacked(rows, deviation, (lower.size, n_binary + n_deviation))
    program = {
        "c": np.concatenate([binary_cost, np.ones(n_deviation)]),
        "constraints": LinearConstraint(
            matrix, np.concatenate([row_lower, lower]), np.concatenate([row_upper, upper])
        ),
        "bounds": Bounds(
            np.zeros(n_binary + n_deviation),
            np.concatenate([np.ones(n_binary), np.full(n_deviation, np.inf)]),
        ),
    }
    integrality = np.concatenate([np.ones(n_binary), np.zeros(n_deviation)])
    # The LP relaxation first: when its optimum is integral it is the MILP's (most families of
    # the production schema's blocks), at a fraction of the branch and bound's time.
    relaxed = _highs(program, np.zeros_like(integrality), limits)
    if relaxed.x is not None and relaxed.status == 0:
        ups = relaxed.x[:n_binary]
        if np.max(np.abs(ups - np.round(ups)), initial=0.0) <= INTEGRAL_TOLERANCE:
            return np.round(ups).astype(np.int64)
    result = _highs(program, integrality, limits)
    if result.x is None or result.status not in _STOPPED_WITH_A_SOLUTION:
        return None
    ups = np.round(result.x[:n_binary]).astype(np.int64)
    sums = rows @ ups
    meets = np.all(row_lower - INTEGRAL_TOLERANCE <= sums) and np.all(
        sums <= row_upper + INTEGRAL_TOLERANCE
    )
    return ups if meets else None


def _highs(program: dict, integrality: np.ndarray, limits: MilpLimits) -> OptimizeResult:
    """``milp`` under ``limits``; HiGHS takes ``mip_abs_gap`` though scipy warns it does not
    know the name."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unrecognized options detected", RuntimeWarning)
        return milp(**program, integrality=integrality, options=limits.options())


def _round_cells(rows: _RangeRows, fraction: np.ndarray) -> np.ndarray:
    """0/1 round-ups minimising the detailed cells' L1 deviation under the sum constraints.

    The rows are totally unimodular (``_cell_level_rows``), so the dual simplex returns an
    integral vertex; anything else is an error, never a silent rounding.
    """
    matrix, lower, upper = rows
    equal = lower == upper
    result = linprog(
        1.0 - 2.0 * fraction,
        A_ub=sparse.vstack([matrix[~equal], -matrix[~equal]], format="csr"),
        b_ub=np.concatenate([upper[~equal], -lower[~equal]]),
        A_eq=matrix[equal],
        b_eq=lower[equal],
        bounds=(0.0, 1.0),
        method="highs-ds",
    )
    if result.status != 0 or result.x is None:
        raise RuntimeError(f"cell-level rounding failed: {result.message}")
    up = np.round(result.x)
    if np.max(np.abs(result.x - up)) > 1e-6:
        raise RuntimeError("cell-level rounding: the simplex vertex is not integral")
    return up.astype(np.int64)


def _split(problem: ChildrenProblem, x_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(floor, fraction)`` of ``x_hat``, snapping values within tolerance to integers."""
    shape = (problem.n_children, problem.n_cells)
    if np.shape(x_hat) != shape:
        raise ValueError(f"x_hat: shape {np.shape(x_hat)}, expected {shape}")
    if not np.all(np.isfinite(x_hat)) or np.any(x_hat < -INTEGRAL_TOLERANCE):
        raise ValueError("x_hat: values must be finite and non-negative")
    if problem.allowed is not None and np.any(x_hat[~problem.allowed] > INTEGRAL_TOLERANCE):
        raise ValueError("x_hat: not 0 on an entry that allowed forbids")
    nearest = np.round(x_hat)
    integral = np.abs(x_hat - nearest) <= INTEGRAL_TOLERANCE
    floor = np.where(integral, nearest, np.floor(x_hat))
    fraction = np.where(integral, 0.0, x_hat - floor)
    return floor.astype(np.int64), fraction


def round_totals(problem: ChildrenProblem, x_hat: np.ndarray) -> np.ndarray:
    """The children's rounded totals (int64, length ``k``): pass 1 of the multi-pass rounder.

    Below the root: the totals ``T`` of a rounding ``floor(x_hat) + b`` (``b`` in ``{0, 1}``,
    only on fractional entries) that meets the parent cell by cell and minimises
    ``sum_c |T_c - sum_j x_hat_{c,j}|``. At the root (one child, no parent): the child total
    if given, else the rounded grand total, as in one pass. Invariant child totals are
    returned as they are. Raises ``ValueError`` as ``round_children`` does. With ``allowed``
    the rounding moves allowed entries only (forbidden ones are 0 in ``x_hat``), so a rounding
    on the mask with these totals exists: pass 2 always has a solution.

    Method: it is the rounding problem above with the total as the only query, so while the
    flow path's table fits (``FLOW_SIZE_LIMIT``) ``laminar_rounding`` solves it, certified
    optimal. Above, a network linear program, exact too: each round-up is a unit of flow from
    its cell (which must send ``parent_j - sum_c floor_{c,j}`` units) to its child; child
    ``c``'s deviation ``|s - F_c|`` (``s`` its round-ups, ``F_c`` the sum of its fractional
    parts) is convex in integer ``s`` with slopes ``-1``, then ``1 - 2 (F_c - floor F_c)`` for
    one unit, then ``+1``: three parallel arcs from the child with those costs and capacities
    ``floor F_c``, 1 and the rest, filled in that order by any optimum. The constraint matrix
    (a bipartite incidence matrix plus unit columns) is totally unimodular, so the dual
    simplex's vertex is integral and its cost, the L1 deviation up to a constant, is optimal
    among all roundings.

    Each ``T_c`` is ``sum_j x_hat_{c,j}`` rounded down or up: were one a whole unit or more
    above it, the difference between the rounding and ``x_hat`` would carry a unit of
    round-up from that child to one below its total (each step through a cell the first holds
    rounded up and the other down), and moving it would lower the deviation.
    """
    floor, fraction = _split(problem, x_hat)
    column_need = _column_need(problem, floor, fraction > 0)
    totals = _row_target(problem, x_hat, floor, fraction, column_need, first_pass=True)
    assert totals is not None  # first_pass always fixes them
    return totals


def _round_ups_per_child(
    fraction: np.ndarray, moving: np.ndarray, column_need: np.ndarray
) -> np.ndarray:
    """Per child, the round-ups of the L1-closest totals (``round_totals``' method)."""
    k, n = fraction.shape
    children, cells = np.nonzero(moving)
    n_binary = children.shape[0]
    if n_binary == 0:
        return np.zeros(k, dtype=np.int64)
    if k * (n + 1) ** 2 <= FLOW_SIZE_LIMIT:
        total = (np.zeros(n, dtype=np.int64),)
        return round_laminar(total, fraction, moving, column_need, None).sum(axis=1)
    share = np.bincount(children, weights=fraction[children, cells], minlength=k)
    available = moving.sum(axis=1)
    below = np.floor(share)
    step_cost = 1.0 - 2.0 * (share - below)
    used_cells, cell_row = np.unique(cells, return_inverse=True)
    n_cells = used_cells.size
    # Columns: the round-ups, then per child the arcs "below", "step" and "above".
    arc_child = np.tile(np.arange(k), 3)
    n_columns = n_binary + 3 * k
    rows = np.concatenate([cell_row, n_cells + children, n_cells + arc_child])
    columns = np.concatenate(
        [np.arange(n_binary), np.arange(n_binary), n_binary + np.arange(3 * k)]
    )
    values = np.concatenate([np.ones(2 * n_binary), -np.ones(3 * k)])
    matrix = sparse.csr_matrix((values, (rows, columns)), shape=(n_cells + k, n_columns))
    targets = np.concatenate([column_need[used_cells].astype(float), np.zeros(k)])
    step = np.minimum(1.0, available - below)
    upper = np.concatenate([np.ones(n_binary), below, step, available - below - step])
    cost = np.concatenate([np.zeros(n_binary), -np.ones(k), step_cost, np.ones(k)])
    result = linprog(
        cost,
        A_eq=matrix,
        b_eq=targets,
        bounds=np.stack([np.zeros(n_columns), upper], axis=1),
        method="highs-ds",
    )
    if result.status != 0 or result.x is None:
        raise RuntimeError(f"rounding the totals failed: {result.message}")
    up = np.round(result.x[:n_binary])
    if np.max(np.abs(result.x[:n_binary] - up)) > 1e-6:
        raise RuntimeError("rounding the totals: the simplex vertex is not integral")
    return np.bincount(children, weights=up, minlength=k).astype(np.int64)


def _needs(
    problem: ChildrenProblem, x_hat: np.ndarray, floor: np.ndarray, fraction: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """How many entries to round up per cell (column) and per child (row), where constrained."""
    column_need = _column_need(problem, floor, fraction > 0)
    first_pass = problem.held_totals is not None
    row_target = _row_target(problem, x_hat, floor, fraction, column_need, first_pass)
    row_need = None
    if row_target is not None:
        row_need = row_target - floor.sum(axis=1)
        _check_need("child_totals", row_need, (fraction > 0).sum(axis=1))
    return column_need, row_need


def _column_need(
    problem: ChildrenProblem, floor: np.ndarray, moving: np.ndarray
) -> np.ndarray | None:
    if problem.parent is None:
        return None
    column_need = problem.parent - floor.sum(axis=0)
    _check_need("parent", column_need, moving.sum(axis=0))
    return column_need


def _row_target(
    problem: ChildrenProblem,
    x_hat: np.ndarray,
    floor: np.ndarray,
    fraction: np.ndarray,
    column_need: np.ndarray | None,
    first_pass: bool,
) -> np.ndarray | None:
    """Every child's rounded total where it is fixed: the invariant total if given; at the
    root the rounded grand total; with ``first_pass`` the totals ``round_totals`` chooses."""
    if problem.child_totals is not None:
        return problem.child_totals
    if column_need is None:
        return np.array([int(np.round(x_hat.sum()))], dtype=np.int64)
    if first_pass:
        return floor.sum(axis=1) + _round_ups_per_child(fraction, fraction > 0, column_need)
    return None


def _check_need(name: str, need: np.ndarray, available: np.ndarray) -> None:
    if np.any(need < 0) or np.any(need > available):
        raise ValueError(f"x_hat: its sums do not match {name}, so no rounding meets them")


def _sum_constraints(
    children: np.ndarray,
    cells: np.ndarray,
    column_need: np.ndarray | None,
    row_need: np.ndarray | None,
) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Equality rows ``sum b = need`` per constrained cell and child, over the moving entries."""
    n_binary = children.shape[0]
    row_of: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    n_rows = 0
    for index, need in ((cells, column_need), (children, row_need)):
        if need is None:
            continue
        used, position = np.unique(index, return_inverse=True)
        row_of.append(position + n_rows)
        targets.append(need[used].astype(float))
        n_rows += used.size
    if not row_of:
        return sparse.csr_matrix((0, n_binary)), np.zeros(0)
    row = np.concatenate(row_of)
    column = np.tile(np.arange(n_binary), len(row_of))
    matrix = sparse.csr_matrix((np.ones(row.size), (row, column)), shape=(n_rows, n_binary))
    return matrix, np.concatenate(targets)


_Triplets = tuple[np.ndarray, np.ndarray, np.ndarray]
"""``(row, column, value)`` of the non-zero entries of a sparse matrix."""


def _stacked(
    top: sparse.csr_matrix, bottom: _Triplets, shape: tuple[int, int]
) -> sparse.csr_matrix:
    """``top`` (padded with zero columns) above ``bottom`` (of ``shape``), as one CSR matrix."""
    top_rows = np.repeat(np.arange(top.shape[0]), np.diff(top.indptr))
    row, column, value = bottom
    return sparse.csr_matrix(
        (
            np.concatenate([top.data, value]),
            (np.concatenate([top_rows, row + top.shape[0]]), np.concatenate([top.indices, column])),
        ),
        shape=(top.shape[0] + shape[0], shape[1]),
    )


def _deviation_terms(
    problem: ChildrenProblem, children: np.ndarray, cells: np.ndarray, fraction: np.ndarray
) -> tuple[np.ndarray, _Triplets, np.ndarray, np.ndarray]:
    """The L1 deviation of every affected marginal cell, as costs and constraints.

    For an affected (query, child, marginal cell) with moving entries ``B`` and total fractional
    part ``F``, the deviation is ``|s - F|`` with the integer ``s = sum_{B} b``.

    * With one moving entry it is linear in that entry, ``f + (1 - 2 f) b``: no new variable.
    * Otherwise a variable ``e`` bounds it with ``e >= s - F``, ``e >= F - s`` and the cut
      ``e >= phi + (1 - 2 phi) (s - floor(F))`` (``phi = F - floor(F)``), which with the other
      two describes the convex hull of ``{(s, |s - F|): s integer}``; without it the LP
      relaxation would always have the useless bound 0.

    Returns ``(binary_cost, rows, lower, upper)``: the cost added to each binary and the rows over
    ``[b, e]`` (three per ``e``, one ``e`` per column beyond the binaries) as triplets.
    """
    n_binary = children.shape[0]
    binary_cost = np.zeros(n_binary)
    members: list[np.ndarray] = []
    groups: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    n_deviation = 0
    for cell_to_marginal, size in zip(problem.marginals, problem.marginal_sizes, strict=True):
        key = children * size + cell_to_marginal[cells]
        _, group, counts = np.unique(key, return_inverse=True, return_counts=True)
        single = counts[group] == 1
        binary_cost[single] += 1.0 - 2.0 * fraction[single]
        shared = np.flatnonzero(~single)
        _, shared_group = np.unique(group[shared], return_inverse=True)
        members.append(shared)
        groups.append(shared_group + n_deviation)
        n_shared = int(shared_group.max(initial=-1)) + 1
        targets.append(np.bincount(shared_group, weights=fraction[shared], minlength=n_shared))
        n_deviation += n_shared
    member = np.concatenate(members)
    group = np.concatenate(groups)
    target = np.concatenate(targets)
    below = np.floor(target)
    phi = target - below
    slope = 1.0 - 2.0 * phi
    # Rows: e >= s - F, then e >= F - s, then the cut; a zero slope leaves the cut without b.
    deviation = np.arange(n_deviation)
    sloped = slope[group] != 0.0
    row = np.concatenate(
        [
            group,
            deviation,
            group + n_deviation,
            deviation + n_deviation,
            group[sloped] + 2 * n_deviation,
            deviation + 2 * n_deviation,
        ]
    )
    column = np.concatenate(
        [member, deviation + n_binary] * 2 + [member[sloped], deviation + n_binary]
    )
    ones = np.ones(n_deviation)
    value = np.concatenate(
        [np.ones(member.size), -ones, np.ones(member.size), ones, slope[group][sloped], -ones]
    )
    unbounded = np.full(n_deviation, np.inf)
    lower = np.concatenate([-unbounded, target, -unbounded])
    upper = np.concatenate([target, unbounded, slope * below - phi])
    return binary_cost, (row, column, value), lower, upper
