"""The first pass of the Census's two-pass estimation: each child's total, fitted alone.

``[estimation] passes = ["total", "all"]`` estimates a parent's children as the 2020 production
did (``DataIndQueriesL2NPass`` with ``total`` in pass 1): pass 1 fits only each child's total
under the constraints; pass 2 fits every query with each child's total held at its pass-1
value; the rounder then rounds the totals first and the cells with those totals fixed
(``rounding.round_totals``). This module computes pass 1 and returns the problem of pass 2:
the same problem with ``held_totals`` set, which ``solve_children`` and ``solve_to_targets``
meet exactly like invariant totals.

Why pass 1 is a problem in the totals alone. Pass 1's objective depends on ``x`` only through
the children's totals ``t_c = sum_j x_{c,j}``. Every ``t >= 0`` with ``sum_c t_c = P`` (the
parent's total) is the totals of a feasible ``x`` (``x_{c,j} = t_c p_j / P`` meets the parent
cell by cell, is zero wherever the parent is, and is non-negative), and every feasible ``x``
has such totals; at the root ``t >= 0`` is the only constraint. So pass 1 is

    minimise   sum_c omega_c (t_c - y_c)^2   over   t >= 0,  sum_c t_c = P  (below the root),

a weighted projection onto a simplex (``fit_totals``), solved in closed form. Its objective is
strictly convex in ``t``, so the pass-1 totals are unique even where the pass-1 histograms
are not (a solver's choice among them cannot leak into pass 2).

The tolerance rule. The Census holds each pass-1 answer within ``tau* + opt_tol_slack`` in
pass 2 (``tau*`` the smallest feasible tolerance, 0 up to solver round-off because pass 1's
own solution is feasible; slack 0.01 by default). Here the tolerance is exactly 0: pass 2's
totals equal pass 1's (to round-off), which is well defined because they are unique, keeps
pass 2 an equality-constrained problem that the exact active-set and first-order solvers
already solve, and differs from the Census's pass 2 by at most its slack per child total
before rounding. Every hard constraint (children sum to the parent cell by cell,
non-negativity, invariant totals, structural and parent zeros) holds exactly in both passes.
With invariant child totals pass 1 would return them, so the problem is left as it is (one
pass, identical to ``passes = ["all"]``).

Allowed masks. With forbidden entries (``allowed``) a child can hold at most the parent's
count of the cells it is allowed, so not every ``t`` on the simplex is the totals of a feasible
``x`` and the simplex projection above could hold infeasible totals. Pass 1 therefore refuses
a mask that forbids anything (``ValueError``; the configuration refuses passes with masks); a
mask allowing everything is carried into pass 2's problem unchanged.

What "total first" means for each method.

* ``topdown``: ``y_c`` is child ``c``'s noisy ``total`` answer and ``omega_c`` its weight
  ``1 / sigma^2`` (the same for every child, so pass 1 is the Euclidean projection of the noisy
  totals onto the simplex). A level without a ``total`` query has nothing to fit first and is
  one pass (the Census's US level).
* ``full_information``: each child is fitted to its bottom-up estimate ``b_c`` with
  precision ``P_c``, i.e. as if ``b_c`` were measured with covariance ``C_c = P_c^{-1}``. The
  total's share of that is the bottom-up total ``y_c = 1^T b_c`` with variance
  ``v_c = 1^T C_c 1``, so pass 1 fits the totals to the bottom-up totals weighted by their own
  precision, ``omega_c = 1 / v_c``: a parent's deficit is spread over its children in
  proportion to their totals' variances (``t_c = max(y_c - nu v_c, 0)``). Pass 2 then
  minimises ``sum_c (x_c - b_c)^T P_c (x_c - b_c)`` with those totals held.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem, PrecisionProblem


def fit_totals(values: np.ndarray, weights: np.ndarray, total: int | None) -> np.ndarray:
    """``argmin_t sum_c weights_c (t_c - values_c)^2`` over ``t >= 0`` with ``sum_c t_c =
    total`` (no sum constraint when ``total`` is None: the root).

    The minimiser is ``t_c = max(values_c - nu / weights_c, 0)`` with the one ``nu`` that
    meets the sum (KKT); ``nu`` is found by sorting the breakpoints ``weights_c values_c``.
    Returns a float array whose sum is ``total`` to round-off. Raises ``ValueError`` for
    weights that are not positive and finite, or a negative ``total``.
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if values.ndim != 1 or weights.shape != values.shape or values.size == 0:
        raise ValueError("values, weights: must be non-empty 1-d arrays of the same length")
    if not np.all(np.isfinite(values)):
        raise ValueError("values: must be finite")
    if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ValueError("weights: must be positive and finite")
    if total is None:
        return np.maximum(values, 0.0)
    if total < 0:
        raise ValueError(f"total: {total} is negative")
    if total == 0:
        return np.zeros_like(values)
    breakpoints = weights * values
    order = np.argsort(-breakpoints, kind="stable")
    # With the m largest breakpoints positive: nu_m = (sum of their values - total) / (sum of
    # their 1 / weights). The positive set is the longest prefix whose nu_m lies below its
    # last breakpoint (m = 1 always does, as total > 0).
    nu = (np.cumsum(values[order]) - total) / np.cumsum(1.0 / weights[order])
    m = int(np.flatnonzero(nu < breakpoints[order])[-1])
    fitted = np.maximum(values - nu[m] / weights, 0.0)
    # Round-off of the sums, onto the largest entry (it stays positive: the miss is tiny).
    fitted[np.argmax(fitted)] += total - fitted.sum()
    return fitted


def total_pass(problem: ChildrenProblem, query: int) -> ChildrenProblem:
    """Pass 1 for ``topdown``: the children's totals fitted to query ``query`` (the total,
    one marginal cell) alone, under the constraints; returned as ``problem`` with those totals
    held (``held_totals``), the problem of pass 2. A problem with invariant child totals is
    returned unchanged (pass 1 would return them). Raises ``ValueError`` for an ``allowed``
    mask that forbids an entry (see the module docstring)."""
    if problem.child_totals is not None:
        return problem
    _refuse_masks(problem)
    if problem.marginal_sizes[query] != 1:
        raise ValueError(f"query {query}: has {problem.marginal_sizes[query]} cells, not the total")
    weights = problem.child_weights()[:, query]
    parent_total = None if problem.parent is None else int(problem.parent.sum())
    held = fit_totals(problem.noisy[query][:, 0], weights, parent_total)
    return replace(problem, held_totals=held)


def total_pass_to_targets(problem: PrecisionProblem) -> PrecisionProblem:
    """Pass 1 for ``full_information``: the children's totals fitted to their targets' totals
    ``1^T b_c``, each weighted by its precision ``1 / (1^T P_c^{-1} 1)``, under the
    constraints; returned as ``problem`` with those totals held. Unchanged with invariant
    child totals; ``ValueError`` for a mask that forbids an entry, as ``total_pass``."""
    if problem.child_totals is not None:
        return problem
    _refuse_masks(problem)
    k, n = problem.n_children, problem.n_cells
    spread = np.linalg.solve(problem.precisions, np.ones((k, n, 1)))[:, :, 0]
    variances = spread.sum(axis=1)
    parent_total = None if problem.parent is None else int(problem.parent.sum())
    held = fit_totals(problem.targets.sum(axis=1), 1.0 / variances, parent_total)
    return replace(problem, held_totals=held)


def _refuse_masks(problem: ChildrenProblem | PrecisionProblem) -> None:
    if problem.allowed is not None and not problem.allowed.all():
        raise ValueError("allowed: the total-first pass does not support allowed masks")
