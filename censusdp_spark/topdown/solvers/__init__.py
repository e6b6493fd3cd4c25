"""Per-parent solvers of the TopDown estimation: pure numpy/scipy, no Spark.

``solve_children`` is the weighted non-negative least-squares (L2) stage and
``round_children`` the controlled rounding that turns its answer into integers; both take a
``ChildrenProblem``.
"""

from censusdp_spark.topdown.solvers.least_squares import solve_children, weighted_squared_error
from censusdp_spark.topdown.solvers.rounding import round_children
from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem

__all__ = ["ChildrenProblem", "round_children", "solve_children", "weighted_squared_error"]
