"""The paper's relaxed baseline M_H: the whole-tree QP (Clarabel), then rounding to the nearest
integer; and the same QP for one family below a fixed parent (``relaxed_families``).

Post-processing only (no privacy cost): it reads the noisy measurements and public totals.

Large counts: Clarabel's tolerances are relative to the data, so at 1e8 groups they swamp
noise of ~10 (it then reports "Solved" far from the optimum, or "infeasible"). The QP is solved
as a step from a reference point (the clipped noisy counts, then the first solution), whose data
are noise-sized, divided by a power of ten of their magnitude (``power_of_ten``). Every solution is then checked in numpy,
independently of Clarabel's own report: the equality residual of ``x`` and a weak-duality lower
bound computed from Clarabel's equality multipliers alone (for any multipliers ``lam``,
``min_{y >= 0} ||y - c||^2 - lam'(A y - b)`` is a lower bound on the QP's optimum, and it is
separable, so it is evaluated exactly). A solution whose relative gap or residual exceeds
``RELIABLE_GAP`` / ``RELIABLE_RESIDUAL`` is reported ``reliable = False``, never as an optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from censusdp_spark.group_sizes.solvers.reference_milp import MilpRows
from censusdp_spark.group_sizes.solvers.tree import GroupTree, check_faithfulness

# The whole-tree QP runs in one process: Clarabel took 19.9 GiB for 17.8 M cells on this
# project's machine (benchmarks/results/pgsr_speed.md), ~1.2 KiB per (node, size) cell. Beyond
# this many cells the driver would need more than ~5 GiB: refused, not attempted.
RELAXED_MAX_CELLS = 4_000_000
RELIABLE_GAP = 1e-6  # (objective - lower bound) / max(objective, 1)
RELIABLE_RESIDUAL = 1e-2  # largest |A x - b|, in counts (well below rounding's 0.5)


@dataclass(frozen=True, kw_only=True)
class RelaxedSolution:
    """The relaxation's solution (floats, n x N, >= 0) and its independent check."""

    x: np.ndarray
    status: str  # Clarabel's
    scale: float  # the power of ten the last step's data were divided by
    objective: float  # sum (x - noisy)^2 over the variable nodes
    lower_bound: float  # weak-duality bound on the optimum, evaluated in numpy
    residual: float  # largest |A x - b| over the equalities, in counts

    @property
    def gap(self) -> float:
        return max(0.0, self.objective - self.lower_bound) / max(self.objective, 1.0)

    @property
    def reliable(self) -> bool:
        solved = self.status in ("Solved", "AlmostSolved")
        return solved and self.gap <= RELIABLE_GAP and self.residual <= RELIABLE_RESIDUAL

    def report(self) -> dict[str, object]:
        """For a manifest: status, the check and the verdict."""
        return {
            "solver_status": self.status,
            "scale": self.scale,
            "objective": self.objective,
            "lower_bound": self.lower_bound,
            "relative_gap": self.gap,
            "equality_residual": self.residual,
            "reliable": self.reliable,
        }


class RelaxedTooLarge(ValueError):
    """The whole-tree QP would exceed ``RELAXED_MAX_CELLS``."""


def check_relaxed_size(cells: int) -> None:
    if cells > RELAXED_MAX_CELLS:
        raise RelaxedTooLarge(
            f"the whole-tree relaxed QP has {cells:,} (node, size) cells, more than "
            f"RELAXED_MAX_CELLS = {RELAXED_MAX_CELLS:,} (~1.2 KiB each in one process); "
            "use relaxed_families or dp"
        )


def power_of_ten(big: float) -> float:
    """The power of ten just below ``big`` / 10 (1 for small data): the step's data are
    divided by it, so Clarabel sees magnitudes of about 10."""
    return float(10.0 ** max(0, int(np.floor(np.log10(max(big, 1.0)))) - 1))


def _equalities(
    tree: GroupTree, faithfulness: str, fixed_root: np.ndarray | None
) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Consistency (and faithfulness) as ``A x = b`` over the variable nodes' cells."""
    n, m = tree.noisy.shape
    first = 0 if fixed_root is None else 1  # the first node that is a variable
    size = (n - first) * m
    cell = np.full((n, m), -1)
    cell[first:] = np.arange(size).reshape(n - first, m)
    rows = MilpRows()
    internal, row_of = rows.add_consistency(tree, cell, fixed_root)
    if faithfulness == "node":
        leaves = np.setdiff1d(np.arange(first, n), internal)
        rows.add(
            leaves.size,
            np.repeat(np.arange(leaves.size), m),
            cell[leaves].ravel(),
            np.ones(leaves.size * m),
            tree.groups[leaves].astype(np.float64),
            tree.groups[leaves].astype(np.float64),
        )
    elif fixed_root is None:
        rows.add(
            1,
            np.zeros(m, dtype=np.int64),
            cell[0],
            np.ones(m),
            float(tree.groups[0]),
            float(tree.groups[0]),
        )
    constraint = rows.constraint(size)
    a_eq = sparse.csr_matrix(constraint.A)
    keep = np.ones(a_eq.shape[0], dtype=bool)
    if faithfulness == "node" and fixed_root is not None:
        keep[row_of[0] * m + m - 1] = False  # follows from the others (round-off inconsistent)
    return a_eq[keep], np.asarray(constraint.lb, dtype=np.float64)[keep]


def dual_bound(a_eq: sparse.csr_matrix, b: np.ndarray, c: np.ndarray, lam: np.ndarray) -> float:
    """``min_{y >= 0} ||y - c||^2 - lam'(A y - b)``: a lower bound on the QP's optimum for any
    ``lam`` (weak duality), exact because it separates by cell: ``y = max(0, c + (A'lam)/2)``."""
    a = a_eq.T @ lam
    y = np.maximum(0.0, c + a / 2.0)
    return float(np.square(y - c).sum() - a @ y + lam @ b)


def solve_relaxed(
    tree: GroupTree, faithfulness: str = "level", fixed_root: np.ndarray | None = None
) -> RelaxedSolution:
    """The convex relaxation of the problem, solved by Clarabel on the scaled data and checked.

    With ``fixed_root`` the root's histogram is given (a family below an already solved parent)
    and only its descendants are variables. Level faithfulness is the root's sum (nothing more
    with a fixed root); node faithfulness is imposed at the leaves (with consistency it implies
    every node's), and with a fixed root the root's last size is left out, since it follows from
    the others. Never raises on a solver failure: the result says ``reliable = False``.
    """
    check_faithfulness(faithfulness)
    n, m = tree.noisy.shape
    first = 0 if fixed_root is None else 1
    a_eq, b_eq = _equalities(tree, faithfulness, fixed_root)
    c = tree.noisy[first:].astype(np.float64).ravel()
    # Solve for the step from a reference point (first the clipped noisy counts, then the
    # previous solution): the step's data are noise-sized, so Clarabel's relative tolerances
    # apply to the noise, not to the counts (at 1e8 groups they would swamp it).
    y = np.maximum(c, 0.0)
    status, lam, scale = "NotRun", np.zeros(a_eq.shape[0]), 1.0
    for _ in range(REFINEMENTS):
        r, e = b_eq - a_eq @ y, c - y
        scale = power_of_ten(max(np.abs(r).max(initial=0.0), np.abs(e).max(initial=0.0)))
        step, lam, status = _clarabel_step(a_eq, r, e, y, scale)
        y = np.maximum(y + step, 0.0)
    objective = float(np.square(y - c).sum())
    lower = dual_bound(a_eq, b_eq, c, lam)
    residual = float(np.abs(a_eq @ y - b_eq).max(initial=0.0))
    out = np.zeros((n, m))
    if fixed_root is not None:
        out[0] = fixed_root
    out[first:] = y.reshape(n - first, m)
    return RelaxedSolution(
        x=out, status=status, scale=scale, objective=objective, lower_bound=lower, residual=residual
    )


REFINEMENTS = 2  # Clarabel solves per QP: one from the clipped noisy counts, one refinement


def _clarabel_step(
    a_eq: sparse.csr_matrix, r: np.ndarray, e: np.ndarray, y0: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray, str]:
    """``min ||d - e||^2 s.t. A d = r, d >= -y0`` on data divided by ``scale``: the step, the
    equalities' multipliers (original units) and Clarabel's status (zeros if it failed)."""
    import clarabel  # a generic QP solver, needed by this baseline only

    size = y0.size
    a = sparse.vstack([a_eq, -sparse.identity(size)], format="csc")
    p = sparse.identity(size, format="csc") * 2.0
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    cones = [clarabel.ZeroConeT(a_eq.shape[0]), clarabel.NonnegativeConeT(size)]
    rhs = np.concatenate([r, y0]) / scale
    solution = clarabel.DefaultSolver(p, -2.0 * e / scale, a, rhs, cones, settings).solve()
    status = str(solution.status)
    d = np.nan_to_num(np.asarray(solution.x, dtype=np.float64))
    z = np.nan_to_num(np.asarray(solution.z, dtype=np.float64))
    if status not in ("Solved", "AlmostSolved") or d.size != size or z.size != a.shape[0]:
        return np.zeros(size), np.zeros(a_eq.shape[0]), status
    # Clarabel: P d + q + A'z = 0 with A = [A_eq; -I]: the equalities' multipliers are -z_eq.
    return d * scale, -z[: a_eq.shape[0]] * scale, status


class RelaxedUnreliable(RuntimeError):
    """The relaxation's solution failed its independent check."""


def relaxed_qp(
    tree: GroupTree, faithfulness: str = "level", fixed_root: np.ndarray | None = None
) -> np.ndarray:
    """``solve_relaxed``'s floats (n x N); raises ``RelaxedUnreliable`` (one line) if the
    solution failed its check."""
    solved = solve_relaxed(tree, faithfulness, fixed_root)
    if not solved.reliable:
        raise RelaxedUnreliable(
            f"relaxed QP unreliable: Clarabel {solved.status}, relative gap {solved.gap:.2e}, "
            f"equality residual {solved.residual:.2e}"
        )
    return solved.x


def round_naive(x: np.ndarray) -> np.ndarray:
    """Nearest integer (ties to even), cell by cell: the paper's rounding of the relaxation."""
    return np.rint(x).astype(np.int64)
