"""One parent's estimation subproblem, shared by the L2 and rounding stages.

A parent with ``k`` children is estimated jointly: every child has a histogram over the same
``n`` active cells (cells where the parent is positive and that are not structural zeros). Each
marginal query ``q`` maps every cell to exactly one of its ``m_q`` marginal cells, so its 0/1
matrix ``Q_q`` (``m_q x n``) is stored compactly as ``cell_to_marginal``. Every child has one
noisy answer vector per query, measured with variance ``1 / w_q``, or ``1 / w_{c,q}`` when the
children were measured differently (with bypassing, a child standing for a single-child chain
spends the chain's budget, and may have been measured with a deeper level's queries: its weight
is 0 for a query it was not asked).

Some entries may be forbidden child by child (``allowed``): ``x_{c,j} = 0`` wherever
``allowed[c, j]`` is False, e.g. a block with no housing unit and no group-quarters facility
holds no persons, and a group-quarters type with no facility in a child holds no one there.
Every solver keeps forbidden entries exactly 0.

Each child's sums over groups of cells may be bounded (``group_bounds``): the 2020
production's group-quarters bounds (persons of a group-quarters type at least its occupied
facilities, at most 99,999 a facility; household persons at most 99 a housing unit). Every
solver meets them: the least-squares stages by a bounded fallback (``bounded``) when their fast
solution misses one, the rounder with one row per bound that can bind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sparse
from scipy.optimize import linprog


@dataclass(frozen=True)
class GroupBounds:
    """Bounds on every child's sum over groups of cells:
    ``lower[c, g] <= sum_{j in members[g]} x_{c,j} <= upper[c, g]``.

    Attributes:
        members: bool array ``(G, n)``, each row a group's cells; the groups are disjoint.
        lower: float array ``(k, G)``, integral and ``>= 0`` (0: no lower bound).
        upper: float array ``(k, G)``, integral or ``inf`` (no cap), ``>= lower``.

    Construction validates shapes and values and raises ``ValueError`` naming the field.
    """

    members: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def __post_init__(self) -> None:
        if self.members.ndim != 2 or self.members.dtype != np.bool_:
            raise ValueError("group_bounds.members: expected a 2-d bool array (G, n)")
        if np.any(self.members.sum(axis=0) > 1):
            raise ValueError("group_bounds.members: the groups must be disjoint")
        n_groups = self.members.shape[0]
        for name, values in (("lower", self.lower), ("upper", self.upper)):
            if values.ndim != 2 or values.shape[1] != n_groups:
                raise ValueError(f"group_bounds.{name}: expected shape (k, {n_groups})")
            finite = values[np.isfinite(values)]
            if np.any(finite != np.round(finite)) or np.any(np.isnan(values)):
                raise ValueError(f"group_bounds.{name}: bounds must be integers (upper: or inf)")
        if self.lower.shape != self.upper.shape:
            raise ValueError("group_bounds.upper: shape differs from lower's")
        if not np.all(np.isfinite(self.lower)) or np.any(self.lower < 0):
            raise ValueError("group_bounds.lower: bounds must be finite and non-negative")
        if np.any(self.upper < self.lower):
            c, g = np.argwhere(self.upper < self.lower)[0]
            raise ValueError(f"group_bounds: child {c}'s group {g} has upper < lower")

    def entry_keys(self, children: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the entries ``(children[i], cells[i])``: the positions ``i`` of those in a group,
        and each one's flat ``(child, group)`` index ``child * G + g``."""
        group_of = np.where(self.members.any(axis=0), self.members.argmax(axis=0), -1)
        grouped = np.flatnonzero(group_of[cells] >= 0)
        return grouped, children[grouped] * self.members.shape[0] + group_of[cells[grouped]]

    def sums(self, x: np.ndarray) -> np.ndarray:
        """``(k, G)``: every child's sum over every group of ``x`` (``(k, n)``)."""
        return x @ self.members.T.astype(float)

    def violation(self, x: np.ndarray) -> float:
        """The largest amount by which ``x`` misses a bound (0 when it meets them all)."""
        sums = self.sums(x)
        return float(max(0.0, np.max(self.lower - sums), np.max(sums - self.upper)))

    def check(
        self,
        shape: tuple[int, int],
        parent: np.ndarray | None,
        row_sums: np.ndarray | None,
        allowed: np.ndarray | None,
    ) -> None:
        """Raise ``ValueError`` unless the bounds fit ``shape`` (``k`` children, ``n`` cells)
        and may be met: no child's lower bounds above its total, none on a group it may not
        hold, and with a parent its group sums between the children's bound sums."""
        k, n = shape
        if self.members.shape[1] != n or self.lower.shape[0] != k:
            raise ValueError(f"group_bounds: shapes do not fit {k} children of {n} cells")
        if row_sums is not None and np.any(self.lower.sum(axis=1) > row_sums + 1e-9):
            c = int(np.flatnonzero(self.lower.sum(axis=1) > row_sums + 1e-9)[0])
            raise ValueError(f"group_bounds: child {c}'s lower bounds exceed its total")
        if allowed is not None:
            holds = (allowed.astype(float) @ self.members.T.astype(float)) > 0
            if np.any((self.lower > 0) & ~holds):
                c, g = np.argwhere((self.lower > 0) & ~holds)[0]
                raise ValueError(
                    f"group_bounds: child {c} has a lower bound on group {g}, which it may not hold"
                )
        if parent is not None:
            held = self.members.astype(np.int64) @ parent
            low, high = self.lower.sum(axis=0), self.upper.sum(axis=0)
            if np.any((held < low) | (held > high)):
                g = int(np.flatnonzero((held < low) | (held > high))[0])
                raise ValueError(
                    f"group_bounds: the parent's group {g} holds {int(held[g])}, outside its"
                    f" children's bounds [{low[g]:g}, {high[g]:g}]"
                )


@dataclass(frozen=True, kw_only=True)
class FamilyConstraints:
    """What constrains a family's children in every problem (``ChildrenProblem``,
    ``PrecisionProblem``): the parent, the children's totals, the entries they may hold and
    their group bounds, each as ``ChildrenProblem`` documents it."""

    parent: np.ndarray | None
    child_totals: np.ndarray | None
    held_totals: np.ndarray | None = None
    allowed: np.ndarray | None = None
    group_bounds: GroupBounds | None = None

    def _check_constraints(self, n_children: int, n_cells: int) -> None:
        """Raise ``ValueError`` naming the field unless the constraints fit ``n_children``
        children of ``n_cells`` cells and may all hold together."""
        if self.parent is None:
            if n_children != 1:
                raise ValueError(f"parent: None (root) requires one child, got k={n_children}")
        else:
            _check_counts("parent", self.parent, n_cells)
        if self.child_totals is not None:
            _check_counts("child_totals", self.child_totals, n_children)
            if self.parent is not None and int(self.child_totals.sum()) != int(self.parent.sum()):
                raise ValueError(
                    f"child_totals: sum {int(self.child_totals.sum())} differs from the parent's "
                    f"total {int(self.parent.sum())}"
                )
        _check_held(self.held_totals, self.child_totals, self.parent, n_children)
        shape = (n_children, n_cells)
        _check_allowed(self.allowed, self.parent, self.row_sums, shape)
        if self.group_bounds is not None:
            self.group_bounds.check(shape, self.parent, self.row_sums, self.allowed)

    @property
    def row_sums(self) -> np.ndarray | None:
        """Every child's total as a float where it is fixed (invariant or held), else None."""
        return _row_sums(self.child_totals, self.held_totals)


@dataclass(frozen=True, kw_only=True)
class ChildrenProblem(FamilyConstraints):
    """The noisy measurements and invariants of the children of one parent.

    Attributes:
        marginals: per query, an int64 array of length ``n``; entry ``j`` is the marginal cell
            (in ``[0, m_q)``) that cell ``j`` contributes to.
        marginal_sizes: per query, ``m_q``. A marginal cell that no active cell maps to is
            allowed; its measurement only adds a constant to the objective.
        weights: float array of length ``Q`` (``w_q = 1 / sigma_q**2``, shared by every
            child) or of shape ``(k, Q)`` (``w_{c,q}``, child by child); finite and ``>= 0``,
            ``0`` for a query that was not measured (its answers are then ignored).
        noisy: per query, a float array of shape ``(k, m_q)``: the noisy answers ``y_{q,c}``.
        parent: the parent's released integer histogram (int64, length ``n``, ``>= 0``), or
            ``None`` at the root, where ``k`` must be 1.
        child_totals: invariant total of every child (int64, length ``k``, ``>= 0``), or
            ``None``. When ``parent`` is also given they must have the same sum.
        held_totals: every child's total held exactly at a real value (float, length ``k``,
            ``>= 0``), or ``None``: the totals a first estimation pass fitted
            (``passes.total_pass``), which the L2 stage meets like invariant totals and
            the rounder rounds first (``rounding.round_totals``). Not with ``child_totals``;
            with a parent their sum is the parent's total (to ``HELD_SUM_TOLERANCE``).
        allowed: bool array of shape ``(k, n)``: ``x_{c,j}`` must be 0 where it is False; or
            ``None``, everything allowed. Every cell where the parent is positive needs an
            allowed child, and every child with a positive total an allowed cell where the
            parent is positive (any allowed cell at the root).
        group_bounds: bounds on every child's sums over groups of cells (``GroupBounds``),
            or ``None``.

    Construction validates shapes and values and raises ``ValueError`` naming the field.
    Arrays are stored as given: callers must not mutate them afterwards.
    """

    marginals: tuple[np.ndarray, ...]
    marginal_sizes: tuple[int, ...]
    weights: np.ndarray
    noisy: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        n_queries = len(self.marginals)
        if n_queries == 0:
            raise ValueError("marginals: at least one query is required")
        if len(self.marginal_sizes) != n_queries:
            raise ValueError(
                f"marginal_sizes: {len(self.marginal_sizes)} sizes for {n_queries} queries"
            )
        if len(self.noisy) != n_queries:
            raise ValueError(f"noisy: {len(self.noisy)} arrays for {n_queries} queries")
        n_cells = self._check_marginals()
        n_children = self._check_noisy()
        weights = np.asarray(self.weights)
        if weights.shape not in ((n_queries,), (n_children, n_queries)):
            raise ValueError(
                f"weights: shape {weights.shape}, expected ({n_queries},) or"
                f" ({n_children}, {n_queries})"
            )
        if not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError("weights: must be finite and non-negative")
        self._check_constraints(n_children, n_cells)

    def _check_marginals(self) -> int:
        n_cells = np.asarray(self.marginals[0]).shape[0] if self.marginals[0].ndim == 1 else -1
        if n_cells <= 0:
            raise ValueError("marginals: each query must be a non-empty 1-d int array")
        for q, (cell_to_marginal, size) in enumerate(
            zip(self.marginals, self.marginal_sizes, strict=True)
        ):
            if cell_to_marginal.shape != (n_cells,):
                raise ValueError(
                    f"marginals[{q}]: shape {cell_to_marginal.shape}, expected ({n_cells},)"
                )
            if not np.issubdtype(cell_to_marginal.dtype, np.integer):
                raise ValueError(f"marginals[{q}]: dtype {cell_to_marginal.dtype} is not integer")
            if int(size) < 1:
                raise ValueError(f"marginal_sizes[{q}]: {size} is not positive")
            if cell_to_marginal.min() < 0 or cell_to_marginal.max() >= size:
                raise ValueError(f"marginals[{q}]: values must lie in [0, {size})")
        return n_cells

    def _check_noisy(self) -> int:
        n_children = np.asarray(self.noisy[0]).shape[0] if np.ndim(self.noisy[0]) == 2 else -1
        if n_children <= 0:
            raise ValueError("noisy: each query's answers must be a 2-d (k, m_q) array, k >= 1")
        for q, (answers, size) in enumerate(zip(self.noisy, self.marginal_sizes, strict=True)):
            if np.shape(answers) != (n_children, size):
                raise ValueError(
                    f"noisy[{q}]: shape {np.shape(answers)}, expected ({n_children}, {size})"
                )
            if not np.all(np.isfinite(answers)):
                raise ValueError(f"noisy[{q}]: values must be finite")
        return n_children

    @property
    def n_children(self) -> int:
        """``k``, the number of children."""
        return int(self.noisy[0].shape[0])

    @property
    def per_child_weights(self) -> bool:
        """Whether ``weights`` differ by child (shape ``(k, Q)``)."""
        return np.ndim(self.weights) == 2

    def child_weights(self) -> np.ndarray:
        """``w_{c,q}`` as a ``(k, Q)`` array."""
        return np.broadcast_to(self.weights, (self.n_children, len(self.marginals)))

    @property
    def n_cells(self) -> int:
        """``n``, the number of active cells."""
        return int(self.marginals[0].shape[0])


@dataclass(frozen=True, kw_only=True)
class PrecisionProblem(FamilyConstraints):
    """Children fitted to per-child targets, each weighted by its own precision matrix.

    The full-information top-down pass: minimise ``sum_c (x_c - b_c)^T P_c (x_c - b_c)``
    over the children's histograms under the same constraints as ``ChildrenProblem``.

    Attributes:
        targets: float array ``(k, n)``, the ``b_c`` (the children's bottom-up estimates).
        precisions: float array ``(k, n, n)``, each symmetric positive definite.
        parent: as in ``ChildrenProblem`` (None at the root, where ``k`` must be 1).
        child_totals: as in ``ChildrenProblem``.
        held_totals: as in ``ChildrenProblem`` (``passes.total_pass_to_targets``).
        allowed: as in ``ChildrenProblem``.
        group_bounds: as in ``ChildrenProblem``.

    Construction validates shapes and values and raises ``ValueError`` naming the field.
    """

    targets: np.ndarray
    precisions: np.ndarray

    def __post_init__(self) -> None:
        if self.targets.ndim != 2 or 0 in self.targets.shape:
            raise ValueError("targets: must be a non-empty (k, n) array")
        k, n = self.targets.shape
        if self.precisions.shape != (k, n, n):
            raise ValueError(f"precisions: shape {self.precisions.shape}, expected ({k}, {n}, {n})")
        if not np.all(np.isfinite(self.targets)) or not np.all(np.isfinite(self.precisions)):
            raise ValueError("targets, precisions: values must be finite")
        self._check_constraints(k, n)

    @property
    def n_children(self) -> int:
        return int(self.targets.shape[0])

    @property
    def n_cells(self) -> int:
        return int(self.targets.shape[1])


HELD_SUM_TOLERANCE = 1e-9
"""Held totals may miss the parent's total by this much, relative (round-off of the fit)."""


def _check_held(
    held: np.ndarray | None, invariant: np.ndarray | None, parent: np.ndarray | None, k: int
) -> None:
    if held is None:
        return
    if invariant is not None:
        raise ValueError("held_totals: not with child_totals (invariant totals are held already)")
    if not isinstance(held, np.ndarray) or held.shape != (k,):
        raise ValueError(f"held_totals: expected an array of shape ({k},)")
    if not np.issubdtype(held.dtype, np.floating) or not np.all(np.isfinite(held)):
        raise ValueError("held_totals: values must be finite floats")
    if np.any(held < 0):
        raise ValueError("held_totals: totals must be non-negative")
    if parent is not None:
        expected = float(parent.sum())
        if abs(float(held.sum()) - expected) > HELD_SUM_TOLERANCE * max(1.0, expected):
            raise ValueError(
                f"held_totals: sum {float(held.sum())!r} differs from the parent's total"
                f" {int(parent.sum())}"
            )


def _check_allowed(
    allowed: np.ndarray | None,
    parent: np.ndarray | None,
    row_sums: np.ndarray | None,
    shape: tuple[int, int],
) -> None:
    """Raise ``ValueError`` unless ``allowed`` is None or a ``shape`` bool array that leaves
    every positive parent cell a child and every positive total a cell to be held in."""
    if allowed is None:
        return
    if not isinstance(allowed, np.ndarray) or allowed.shape != shape:
        raise ValueError(f"allowed: expected an array of shape {shape}")
    if allowed.dtype != np.bool_:
        raise ValueError(f"allowed: dtype {allowed.dtype} is not bool")
    usable = allowed
    if parent is not None:
        j = _first_stranded(parent, np.asarray(allowed.any(axis=0)))
        if j is not None:
            raise ValueError(
                f"allowed: cell {j} of the parent (count {int(parent[j])}) has no child"
                " allowed to hold it"
            )
        usable = allowed & (parent > 0)[None, :]
    if row_sums is not None:
        c = _first_stranded(row_sums, np.asarray(usable.any(axis=1)))
        if c is not None:
            raise ValueError(
                f"allowed: child {c} (total {row_sums[c]!r}) has no allowed cell to hold it"
            )


def _first_stranded(sums: np.ndarray, reachable: np.ndarray) -> int | None:
    """The first index with a positive sum and nothing that may hold it, or None."""
    stranded = np.flatnonzero((sums > 0) & ~reachable)
    return int(stranded[0]) if stranded.size else None


def _row_sums(invariant: np.ndarray | None, held: np.ndarray | None) -> np.ndarray | None:
    if invariant is not None:
        return invariant.astype(float)
    return held


def _check_counts(name: str, counts: np.ndarray, length: int) -> None:
    """Raise ``ValueError`` unless ``counts`` is a non-negative integer vector of ``length``."""
    if not isinstance(counts, np.ndarray) or counts.shape != (length,):
        raise ValueError(f"{name}: expected an array of shape ({length},)")
    if not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(f"{name}: dtype {counts.dtype} is not integer")
    if np.any(counts < 0):
        raise ValueError(f"{name}: counts must be non-negative")


@dataclass(frozen=True)
class FreeBlock:
    """The entries a least-squares solver must actually solve for.

    Rows of children whose total is 0 or that have no allowed cell, and cells where the parent
    is 0 or that no remaining child is allowed, are 0 in every solution; ``rows`` and ``cols``
    mark the rest, with the parent and totals as floats (None if absent), and ``allowed`` the
    mask on the block (``None`` when it allows everything there).
    """

    rows: np.ndarray
    cols: np.ndarray
    parent: np.ndarray | None
    totals: np.ndarray | None
    allowed: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.rows.sum()) * int(self.cols.sum()) ** 2


def free_block(
    problem: ChildrenProblem | PrecisionProblem,
) -> tuple[np.ndarray, FreeBlock | None]:
    """The all-zero ``(k, n)`` start and the block left to solve, or None when the start is
    already the solution (filled in for a lone child, which must equal its parent)."""
    k, n = problem.n_children, problem.n_cells
    parent = None if problem.parent is None else problem.parent.astype(float)
    totals = problem.row_sums
    x = np.zeros((k, n))
    if parent is not None and k == 1:
        x[0] = parent
        return x, None
    rows = np.ones(k, dtype=bool) if totals is None else totals > 0
    cols = np.ones(n, dtype=bool) if parent is None else parent > 0
    allowed = problem.allowed
    if allowed is not None:
        rows &= allowed[:, cols].any(axis=1)
        cols &= allowed[rows].any(axis=0)
    if not rows.any() or not cols.any():
        return x, None
    block_allowed = None if allowed is None else allowed[np.ix_(rows, cols)]
    if block_allowed is not None and block_allowed.all():
        block_allowed = None
    return x, FreeBlock(rows, cols, parent, totals, block_allowed)


_MAX_SCALING_STEPS = 2_000
_SCALING_TOLERANCE = 1e-13
_INTERIOR_TOLERANCE = 1e-9


def masked_feasible_point(
    allowed: np.ndarray, column_sums: np.ndarray | None, row_sums: np.ndarray | None
) -> np.ndarray:
    """A feasible point that is zero on the forbidden entries and, where the mask allows it,
    positive on the allowed ones: the mask scaled to the sums.

    With one kind of sum each line's sum is spread evenly over its allowed entries (exact).
    With both, iterative proportional fitting (Sinkhorn scaling) alternately scales the rows
    and the columns, ending on the columns so that they are exact, until the rows are within
    ``1e-13`` relative. It converges slowly only when some allowed entry is zero in every
    feasible point; if after ``_MAX_SCALING_STEPS`` the rows still miss by more than ``1e-9``
    relative, a linear program finds the point instead (``_interior_by_lp``).
    """
    mask = allowed.astype(float)
    if row_sums is None:
        return mask * (_need(column_sums) / mask.sum(axis=0))[None, :]
    if column_sums is None:
        return mask * (row_sums / mask.sum(axis=1))[:, None]
    x = mask
    size = max(float(row_sums.max()), float(column_sums.max()))
    miss = np.inf
    for _ in range(_MAX_SCALING_STEPS):
        x = x * (row_sums / x.sum(axis=1))[:, None]
        x = x * (column_sums / x.sum(axis=0))[None, :]
        miss = float(np.max(np.abs(x.sum(axis=1) - row_sums)))
        if miss <= _SCALING_TOLERANCE * size:
            return x
    if miss <= _INTERIOR_TOLERANCE * size:
        return x
    return _interior_by_lp(allowed, column_sums, row_sums)


def _interior_by_lp(
    allowed: np.ndarray, column_sums: np.ndarray, row_sums: np.ndarray
) -> np.ndarray:
    """The feasible point on the mask maximising its smallest allowed entry, by HiGHS (its
    sums hold to the LP's feasibility tolerance, which the face solves that follow remove).
    Raises ``ValueError`` when no point on the mask meets both sums."""
    k, n = allowed.shape
    children, cells = np.nonzero(allowed)
    m = children.size
    entries = np.arange(m)
    sums = sparse.csr_matrix(
        (np.ones(2 * m), (np.concatenate([cells, n + children]), np.tile(entries, 2))),
        shape=(n + k, m + 1),
    )
    floor = sparse.hstack([-sparse.identity(m), np.ones((m, 1))], format="csr")
    cost = np.zeros(m + 1)
    cost[-1] = -1.0
    result = linprog(
        cost,
        A_ub=floor,
        b_ub=np.zeros(m),
        A_eq=sums,
        b_eq=np.concatenate([column_sums, row_sums]),
        bounds=(0.0, None),
        method="highs",
    )
    if result.status != 0 or result.x is None:
        raise ValueError("allowed: no point on the mask meets both the parent and the totals")
    x = np.zeros((k, n))
    x[children, cells] = np.maximum(result.x[:m], 0.0)
    return x


def _need(values: np.ndarray | None) -> np.ndarray:
    if values is None:
        raise AssertionError("a constraint needed here is missing")
    return values
