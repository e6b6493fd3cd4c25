"""Per-parent solvers of the TopDown estimation: pure numpy/scipy, no Spark.

``solve_children`` is the weighted non-negative least-squares (L2) stage and
``round_children`` the controlled rounding that turns its answer into integers; both take a
``ChildrenProblem``. ``solve_to_targets`` is the full-information top-down fit (per-child
targets and precisions, a ``PrecisionProblem``); ``gaussian_estimates`` computes those targets, with
covariances dense or compact (``symmetric_covariance``: attributes only ever kept whole or summed
out held symmetric, ``2^k`` dense blocks over the other attributes' cells). ``passes`` is the
first pass of the Census's two-pass estimate (each child's total alone, then held), and
``round_totals`` the first pass of its multi-pass rounder.
"""

from censusdp_spark.topdown.solvers.least_squares import (
    solve_children,
    solve_to_targets,
    weighted_squared_error,
)
from censusdp_spark.topdown.solvers.passes import fit_totals, total_pass, total_pass_to_targets
from censusdp_spark.topdown.solvers.rounding import round_children, round_totals
from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem, PrecisionProblem

__all__ = [
    "ChildrenProblem",
    "PrecisionProblem",
    "fit_totals",
    "round_children",
    "round_totals",
    "solve_children",
    "solve_to_targets",
    "total_pass",
    "total_pass_to_targets",
    "weighted_squared_error",
]
