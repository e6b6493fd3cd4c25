"""Random TopDown estimation problems and references to check the solvers against: a
second solver (Clarabel), an enumeration of active sets, a KKT certificate; and random product
schemas for the compact covariance."""

from __future__ import annotations

import clarabel
import numpy as np
import scipy.sparse as sparse
from scipy.optimize import linprog

from censusdp_spark.topdown.solvers import ChildrenProblem, PrecisionProblem


def marginal_queries(dims: tuple[int, ...], subsets: list[tuple[int, ...]]):
    """``(cell_to_marginal, sizes)`` of the marginals over ``subsets`` of a product of ``dims``."""
    digits = np.indices(dims).reshape(len(dims), -1)
    maps, sizes = [], []
    for axes in subsets:
        shape = [dims[a] for a in axes]
        index = np.zeros(digits.shape[1], dtype=np.int64)
        for axis in axes:
            index = index * dims[axis] + digits[axis]
        maps.append(index)
        sizes.append(int(np.prod(shape)))
    return tuple(maps), tuple(sizes)


def random_problem(
    rng: np.random.Generator,
    n_children: int,
    dims: tuple[int, ...] = (2, 3),
    subsets: list[tuple[int, ...]] | None = None,
    with_totals: bool = False,
    root: bool = False,
    scale: int = 20,
) -> ChildrenProblem:
    """Children split from a random parent, measured with Gaussian noise."""
    subsets = subsets if subsets is not None else [(), (0,), tuple(range(len(dims)))]
    maps, sizes = marginal_queries(dims, subsets)
    n = maps[0].shape[0]
    parent = rng.poisson(scale * rng.dirichlet(np.full(n, 0.7))).astype(np.int64)
    share = rng.dirichlet(np.full(n_children, 1.5))
    children = np.stack([rng.multinomial(count, share) for count in parent], axis=1)
    sigmas = rng.uniform(0.5, 3.0, len(subsets))
    noisy = tuple(
        np.stack([np.bincount(m, child, minlength=s) for child in children])
        + rng.normal(0.0, sigma, (n_children, s))
        for m, s, sigma in zip(maps, sizes, sigmas, strict=True)
    )
    return ChildrenProblem(
        marginals=maps,
        marginal_sizes=sizes,
        weights=1.0 / sigmas**2,
        noisy=noisy,
        parent=None if root else parent,
        child_totals=children.sum(axis=1).astype(np.int64) if with_totals else None,
    )


def clarabel_solution(
    problem: ChildrenProblem, queries: list[int] | None = None
) -> tuple[float, np.ndarray]:
    """The optimum and a minimiser by Clarabel, on the QP with residuals r = Q x - y as extra
    variables, fitting the listed ``queries`` only (default all).

    Variables ``[x (k*n), r (sum k*m_q)]``; objective ``sum w_q ||r_q||^2``; equality rows
    ``r - Q x = -y``, the column and row sums (invariant or held); and ``x >= 0``. Writing the
    objective in the residuals keeps its value small, which Clarabel's relative gap test needs
    to be accurate.
    """
    k, n = problem.n_children, problem.n_cells
    n_x = k * n
    fitted = range(len(problem.marginals)) if queries is None else queries
    stacked = sparse.vstack(
        [
            sparse.kron(
                sparse.identity(k),
                sparse.csr_matrix(
                    (np.ones(n), (problem.marginals[q], np.arange(n))),
                    shape=(problem.marginal_sizes[q], n),
                ),
            )
            for q in fitted
        ]
    )
    n_r = stacked.shape[0]
    by_child = problem.child_weights()
    weights = np.concatenate([np.repeat(by_child[:, q], problem.marginal_sizes[q]) for q in fitted])
    hessian = sparse.diags(np.concatenate([np.zeros(n_x), 2.0 * weights])).tocsc()
    no_r = sparse.csr_matrix((n, n_r))
    equality_rows = [sparse.hstack([-stacked, sparse.identity(n_r)])]
    equality_rhs = [-np.concatenate([problem.noisy[q].ravel() for q in fitted])]
    if problem.parent is not None:
        equality_rows.append(sparse.hstack([sparse.hstack([sparse.identity(n)] * k), no_r]))
        equality_rhs.append(problem.parent.astype(float))
    if problem.row_sums is not None:
        row_sum = sparse.kron(sparse.identity(k), np.ones((1, n)))
        equality_rows.append(sparse.hstack([row_sum, sparse.csr_matrix((k, n_r))]))
        equality_rhs.append(problem.row_sums)
    n_eq = sum(rhs.size for rhs in equality_rhs)
    matrix = sparse.vstack(
        equality_rows + [sparse.hstack([-sparse.identity(n_x), sparse.csr_matrix((n_x, n_r))])],
        format="csc",
    )
    rhs = np.concatenate(equality_rhs + [np.zeros(n_x)])
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-11
    solver = clarabel.DefaultSolver(
        hessian,
        np.zeros(n_x + n_r),
        matrix,
        rhs,
        [clarabel.ZeroConeT(n_eq), clarabel.NonnegativeConeT(n_x)],
        settings,
    )
    solution = solver.solve()
    assert str(solution.status) == "Solved"
    return float(solution.obj_val), np.asarray(solution.x)[:n_x].reshape(k, n)


def assert_feasible(problem: ChildrenProblem, x: np.ndarray) -> None:
    assert x.shape == (problem.n_children, problem.n_cells)
    assert np.all(x >= 0)
    if problem.parent is not None:
        np.testing.assert_allclose(x.sum(axis=0), problem.parent, rtol=0, atol=1e-9)
    if problem.row_sums is not None:
        np.testing.assert_allclose(x.sum(axis=1), problem.row_sums, rtol=0, atol=1e-9)


def kkt_violation(problem: ChildrenProblem, x: np.ndarray) -> float:
    """Largest KKT violation at the feasible ``x``, relative to the gradient's size.

    Builds the gradient from explicit query matrices, then finds by linear programming the
    equality multipliers (one per cell with a parent, one per child with a total) that make
    the smallest ``t`` with ``|grad + multipliers| <= t`` where ``x > 0`` and
    ``grad + multipliers >= -t`` where ``x = 0``; returns that ``t`` over the gradient's size.
    A cell with parent 0, a child with total 0 and an entry ``problem.allowed`` forbids are
    left out: they are zeros whatever their free multipliers.
    """
    k, n = x.shape
    gradient = np.zeros((k, n))
    for m, s, w, y in zip(
        problem.marginals,
        problem.marginal_sizes,
        problem.child_weights().T,
        problem.noisy,
        strict=True,
    ):
        query = np.zeros((s, n))
        query[m, np.arange(n)] = 1.0
        gradient += 2.0 * w[:, None] * (x @ query.T - y) @ query
    checked = np.ones((k, n), dtype=bool) if problem.allowed is None else problem.allowed.copy()
    blocks = []
    if problem.parent is not None:
        checked[:, problem.parent == 0] = False
        blocks.append(np.tile(np.eye(n), (k, 1)))
    if problem.row_sums is not None:
        checked[problem.row_sums == 0, :] = False
        blocks.append(np.repeat(np.eye(k), n, axis=0))
    size = max(1.0, float(np.abs(gradient).max()))
    positive = (x > 1e-9 * max(1.0, float(x.max()))).ravel()[checked.ravel()]
    grad = gradient.ravel()[checked.ravel()] / size
    multipliers = np.hstack(blocks)[checked.ravel()] if blocks else np.zeros((grad.size, 0))
    n_mult = multipliers.shape[1]
    t_column = -np.ones((grad.size, 1))
    # rows: (grad + M l) <= t on positive entries, -(grad + M l) <= t everywhere checked
    upper = np.hstack([multipliers, t_column])[positive]
    lower = np.hstack([-multipliers, t_column])
    result = linprog(
        np.concatenate([np.zeros(n_mult), [1.0]]),
        A_ub=np.vstack([upper, lower]),
        b_ub=np.concatenate([-grad[positive], grad]),
        bounds=[(None, None)] * n_mult + [(0, None)],
    )
    assert result.status == 0
    return float(result.x[-1])


def random_precision_problem(
    rng: np.random.Generator, k: int, n: int, with_totals: bool, root: bool = False
) -> PrecisionProblem:
    """Children with their own random positive definite precisions and noisy targets."""
    truth = rng.poisson(3.0, (k, n)).astype(np.int64)
    factors = rng.normal(size=(k, n, n))
    precisions = factors @ factors.transpose(0, 2, 1) + 0.1 * np.eye(n)
    return PrecisionProblem(
        targets=truth + rng.normal(0.0, 2.0, (k, n)),
        precisions=precisions,
        parent=None if root else truth.sum(axis=0),
        child_totals=truth.sum(axis=1) if with_totals else None,
    )


def enumerated_optimum(problem: PrecisionProblem) -> np.ndarray:
    """The optimum by enumeration: the best feasible minimiser over every set of entries fixed
    at zero, each an equality-constrained QP solved from its KKT system."""
    k, n = problem.n_children, problem.n_cells
    size = k * n
    hessian = np.zeros((size, size))
    linear = np.zeros(size)
    for c in range(k):
        block = slice(c * n, (c + 1) * n)
        hessian[block, block] = 2.0 * problem.precisions[c]
        linear[block] = 2.0 * problem.precisions[c] @ problem.targets[c]
    rows, rhs = [], []
    if problem.parent is not None:
        rows.append(np.kron(np.ones(k), np.eye(n)))
        rhs.append(problem.parent.astype(float))
    if problem.row_sums is not None:
        rows.append(np.kron(np.eye(k), np.ones(n)))
        rhs.append(problem.row_sums)
    best, best_value = None, np.inf
    for mask in range(1 << size):
        fixed = np.array([(mask >> i) & 1 for i in range(size)], dtype=bool)
        equality = [*rows, np.eye(size)[fixed]]
        a = np.vstack(equality) if any(e.size for e in equality) else np.zeros((0, size))
        b = np.concatenate([*rhs, np.zeros(int(fixed.sum()))])
        kkt = np.block([[hessian, a.T], [a, np.zeros((a.shape[0], a.shape[0]))]])
        solution = np.linalg.lstsq(kkt, np.concatenate([linear, b]), rcond=None)[0]
        x = solution[:size]
        if np.max(np.abs(a @ x - b), initial=0.0) > 1e-8 or x.min() < -1e-9:
            continue
        value = 0.5 * x @ hessian @ x - linear @ x
        if value < best_value:
            best, best_value = x, value
    assert best is not None
    return best.reshape(k, n)


def masked_problem(
    rng: np.random.Generator,
    k: int,
    dims: tuple[int, ...],
    with_totals: bool,
    subsets: list[tuple[int, ...]] | None = None,
    density: float = 0.6,
    scale: int = 6,
) -> ChildrenProblem:
    """A random mask, a random integer truth that is 0 where the mask forbids, the parent its
    column sums (None at the root, k = 1), the totals its row sums; noisy answers of the
    truth's marginals. At least one entry is forbidden."""
    subsets = subsets if subsets is not None else [(), (0,), tuple(range(len(dims)))]
    maps, sizes = marginal_queries(dims, subsets)
    n = maps[0].shape[0]
    allowed = rng.random((k, n)) < density
    allowed.flat[rng.integers(k * n)] = False
    truth = np.where(allowed, rng.poisson(scale, (k, n)), 0).astype(np.int64)
    sigmas = rng.uniform(0.5, 3.0, len(subsets))
    noisy = tuple(
        np.stack([np.bincount(m, child, minlength=s) for child in truth])
        + rng.normal(0.0, sigma, (k, s))
        for m, s, sigma in zip(maps, sizes, sigmas, strict=True)
    )
    return ChildrenProblem(
        marginals=maps,
        marginal_sizes=sizes,
        weights=1.0 / sigmas**2,
        noisy=noisy,
        parent=None if k == 1 else truth.sum(axis=0),
        child_totals=truth.sum(axis=1) if with_totals else None,
        allowed=allowed,
    )


def assert_masked_feasible(
    x: np.ndarray, parent: np.ndarray | None, row_sums: np.ndarray | None, allowed: np.ndarray
) -> None:
    assert np.all(x >= 0)
    assert np.all(x[~allowed] == 0.0)
    if parent is not None:
        np.testing.assert_allclose(x.sum(axis=0), parent, rtol=0, atol=1e-9)
    if row_sums is not None:
        np.testing.assert_allclose(x.sum(axis=1), row_sums, rtol=0, atol=1e-9)


def deviation(problem: ChildrenProblem, x: np.ndarray, x_hat: np.ndarray) -> float:
    """``sum_q sum_c ||Q_q x_c - Q_q x_hat_c||_1``."""
    total = 0.0
    for m, s in zip(problem.marginals, problem.marginal_sizes, strict=True):
        for row, row_hat in zip(x, x_hat, strict=True):
            total += float(np.abs(np.bincount(m, row - row_hat, minlength=s)).sum())
    return total


def product_query(shape: tuple[int, ...], groups: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """``(cell_to_marginal, size)`` of the Kronecker query grouping axis ``a`` by
    ``groups[a]`` (identity: kept; all zeros: summed out; else a recode)."""
    levels = np.indices(shape).reshape(len(shape), -1)
    index = np.zeros(levels.shape[1], dtype=np.int64)
    size = 1
    for a, group in enumerate(groups):
        m = int(group.max()) + 1
        index = index * m + group[levels[a]]
        size *= m
    return index, size


def random_schema(
    rng: np.random.Generator, levels: int, max_cells: int = 96
) -> tuple[tuple[int, ...], list[int], list[list[tuple[np.ndarray, int]]], set[int]]:
    """A random product schema where some attributes are recoded by some query and some are only
    kept or summed out; structural zeros that depend only on recoded attributes.

    Returns ``(shape, structural_zero_cells, queries per level, the symmetric axes)``; the last
    level has the detailed query; the schema has at most ``max_cells`` cells."""
    shape: tuple[int, ...] = ()
    while not shape or np.prod(shape) > max_cells:
        k = int(rng.integers(2, 5))
        recoded = set(int(a) for a in rng.choice(k, size=int(rng.integers(1, k)), replace=False))
        # A recode needs at least 3 levels (a grouping of 2 keeps them or sums them).
        shape = tuple(
            max(3, int(m)) if a in recoded else int(m)
            for a, m in enumerate(rng.integers(2, 5, size=k))
        )
    symmetric = set(range(k)) - recoded
    per_level = []
    for level in range(levels):
        queries = []
        for _ in range(int(rng.integers(1, 5))):
            groups = []
            for a, m in enumerate(shape):
                role = int(rng.integers(3 if a in recoded else 2))
                if role == 0:
                    groups.append(np.arange(m))
                elif role == 1:
                    groups.append(np.zeros(m, dtype=np.int64))
                else:
                    groups.append(np.sort(rng.integers(0, 2, size=m)))
            queries.append(product_query(shape, groups))
        if level == levels - 1:
            queries.append(product_query(shape, [np.arange(m) for m in shape]))
        per_level.append(queries)
    # Every recoded attribute is recoded by at least one query somewhere.
    for a in recoded:
        groups = [np.zeros(m, dtype=np.int64) for m in shape]
        groups[a] = np.array([0] * (shape[a] - 1) + [1])
        per_level[0].append(product_query(shape, groups))
    levels_of = np.indices(shape).reshape(k, -1)
    zero_on = sorted(recoded)[: int(rng.integers(0, 3))]
    zero = np.ones(levels_of.shape[1], dtype=bool)
    for a in zero_on:
        zero &= levels_of[a] == shape[a] - 1
    cells = np.flatnonzero(zero).tolist() if zero_on else []
    return shape, cells, per_level, symmetric
