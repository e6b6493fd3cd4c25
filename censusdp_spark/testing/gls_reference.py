"""The exact generalised-least-squares (GLS, best linear unbiased) estimate of every node's
histogram from all the noisy measurements of a finished TopDown release: the yardstick the
estimation methods are measured against, computed independently of the project's estimators.

    PYTHONPATH=$PWD .venv/bin/python -m censusdp_spark.testing.gls_reference \
        --release OUTPUT_DIR [--config FILE] [--input FILE] [--write gls.parquet] [--solver tree]

The model. The unknowns are the leaf histograms over the cells that are not structural zeros.
Node ``v`` of level ``l`` and query ``q`` was measured as ``A_q h_v + e`` with ``h_v`` the sum
of the leaf histograms under ``v`` and ``e`` independent noise of variance
``sigma2(v, q)`` per coordinate: the exact ``sigma2`` of its row of ``noisy_measurements``
(``config.budget.sigma2_for(l, q)`` for a table without that column). With bypassing a
single-child parent has no rows (its weight is 0: its histogram is its child's through the
tree constraints) and the measured node of its chain spends the chain's budget (the discrete Gaussian's
variance is slightly below sigma2: by at most 6e-4 relative on the RI/HI demos at rho <= 10, at
the state queries at rho = 10, elsewhere below 1e-15; the weights ignore it). The invariant
totals (``[estimation] invariants``: the configured levels and every level above) hold exactly,
at their true values from the input, as in the release. GLS minimises
``sum_{v,q} ||A_q h_v - y_{v,q}||^2 / sigma2(l(v), q)`` under those equalities; with every
leaf measured in detail the minimiser is unique and is the BLUE of every node's histogram.

The solve. Writing every node's histogram ``h_v`` as a variable tied to its children by
``h_v = sum_c h_c`` makes the objective block-diagonal (one ``m x m`` block per node, ``m``
cells), so the KKT system

    [ H  E^T ] [h]   [b]        H = blockdiag(sum_q A_q^T A_q / sigma2(l, q)),
    [ E   0  ] [l] = [d]        b_v = sum_q A_q^T y_{v,q} / sigma2(l, q)

(E: the parent = sum of children rows and one total row per invariant node of the deepest
invariant level; the totals above follow from them) is sparse with the tree's shape, and a
sparse LU (SuperLU, minimum-degree ordering on A^T + A) factors it with fill linear in the
number of nodes: RI 2010 (25 K blocks x 16 cells, 434 K unknowns) factors in a few seconds.
The achieved relative residual is measured and reported, and one step of iterative refinement
is taken. For schemas whose per-node blocks are too large for the LU (the 2,016-cell
production schema), ``--solver tree`` gets the same minimiser by Gaussian elimination along
the tree instead (``solve_gls_by_tree``; both are checked against a dense null-space solve in
the tests), and certifies it by the optimality of its leaf gradient. Nothing here imports the
project's estimation or solver code: only config, schema and query parsing, and the released
tables are read from their Delta logs with pyarrow.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from censusdp_spark.topdown.config import TopDownConfig, load_topdown_config

NOISY_MEASUREMENTS = "noisy_measurements"
ESTIMATES = "estimates"
# A factorisation whose refined relative residual is above this is reported as a failure
# (e.g. a query set that leaves some leaf cell unidentified makes the KKT matrix singular).
MAX_RELATIVE_RESIDUAL = 1e-8
# SuperLU takes the diagonal pivot unless it is below this fraction of the column's largest
# entry; the Hessian blocks are well conditioned, so a small threshold keeps the fill-reducing
# order and the refinement step recovers any accuracy lost.
DIAG_PIVOT_THRESHOLD = 0.1


# --- the pure problem and its solve ---------------------------------------------------------


@dataclass(frozen=True)
class LevelMeasurements:
    """One level of the tree: its nodes' parents and what was measured of them.

    ``parent[i]`` is the index, in the level above, of node ``i`` (empty for the root level);
    ``queries`` pairs each query matrix ``A`` (``r x m``, over the active cells) with its noise
    variance (one for the level, or one per node, ``inf`` for a node not measured) and the
    ``k x r`` noisy answers of the level's ``k`` nodes; ``invariant_totals``
    are the exact node totals where the level is invariant (else None).
    """

    name: str
    n_nodes: int
    parent: np.ndarray
    queries: tuple[tuple[np.ndarray, float | np.ndarray, np.ndarray], ...]
    invariant_totals: np.ndarray | None = None


@dataclass(frozen=True)
class TreeProblem:
    levels: tuple[LevelMeasurements, ...]  # root first, leaves last
    n_cells: int  # active cells (structural zeros removed)


@dataclass(kw_only=True)
class SolveStats:
    unknowns: int
    constraints: int
    kkt_nonzeros: int
    factor_nonzeros: int
    assemble_s: float
    factor_s: float
    solve_s: float
    relative_residual: float  # ||K s - r||_inf / ||r||_inf after refinement
    relative_residual_unrefined: float
    max_constraint_violation: float  # max |E h - d| (children sums and invariant totals)

    def text(self) -> str:
        return (
            f"{self.unknowns} unknowns, {self.constraints} constraints, KKT nnz "
            f"{self.kkt_nonzeros}, LU nnz {self.factor_nonzeros}; assemble {self.assemble_s:.2f} s,"
            f" factor {self.factor_s:.2f} s, solve {self.solve_s:.2f} s; relative residual "
            f"{self.relative_residual:.1e} (unrefined {self.relative_residual_unrefined:.1e}), "
            f"max constraint violation {self.max_constraint_violation:.1e}"
        )


def deepest_invariant_level(problem: TreeProblem) -> int | None:
    """Only the deepest invariant level's totals are constraints: every total above is the sum
    of totals below it, and writing it again would make the KKT matrix singular."""
    found = [i for i, lv in enumerate(problem.levels) if lv.invariant_totals is not None]
    return max(found) if found else None


def solve_gls(problem: TreeProblem) -> tuple[list[np.ndarray], SolveStats]:
    """The GLS estimate of every node's histogram, a ``(k_l, m)`` float array per level."""
    started = time.perf_counter()
    m = problem.n_cells
    sizes = [lv.n_nodes for lv in problem.levels]
    offsets = np.concatenate([[0], np.cumsum(np.array(sizes, dtype=np.int64) * m)])
    n = int(offsets[-1])
    blocks = []
    rhs_h = np.zeros(n)
    for i, lv in enumerate(problem.levels):
        block = sp.csr_matrix((lv.n_nodes * m, lv.n_nodes * m))
        b = np.zeros((lv.n_nodes, m))
        for a, sigma2, y in lv.queries:
            weight = 1.0 / np.broadcast_to(np.asarray(sigma2, dtype=np.float64), (lv.n_nodes,))
            block = block + sp.kron(sp.diags(weight), sp.csr_matrix(a.T @ a), format="csr")
            b += weight[:, None] * (np.asarray(y, dtype=np.float64) @ a)
        blocks.append(block)
        rhs_h[offsets[i] : offsets[i + 1]] = b.ravel()
    hessian = sp.block_diag(blocks, format="csr")

    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    row = 0
    cells = np.arange(m)
    for i in range(1, len(problem.levels)):
        k_parent, lv = sizes[i - 1], problem.levels[i]
        parent_vars = np.arange(k_parent * m)
        rows.append(row + parent_vars)
        cols.append(offsets[i - 1] + parent_vars)
        vals.append(np.ones(k_parent * m))
        rows.append((row + lv.parent[:, None] * m + cells[None, :]).ravel())
        cols.append(offsets[i] + np.arange(lv.n_nodes * m))
        vals.append(-np.ones(lv.n_nodes * m))
        row += k_parent * m
    rhs_d = [np.zeros(row)]
    inv = deepest_invariant_level(problem)
    if inv is not None:
        totals = problem.levels[inv].invariant_totals
        assert totals is not None
        k = sizes[inv]
        rows.append(np.repeat(row + np.arange(k), m))
        cols.append(offsets[inv] + np.arange(k * m))
        vals.append(np.ones(k * m))
        rhs_d.append(np.asarray(totals, dtype=np.float64))
        row += k
    constraints = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row, n)
    )
    # The constraint rows are scaled to the size of the Hessian's diagonal: with unit entries
    # against weights 1/sigma^2 of ~0.01-0.5, SuperLU's threshold pivoting leaves the diagonal
    # and the fill explodes; scaled, it keeps the minimum-degree order (linear fill).
    gamma = float(hessian.diagonal().mean())
    kkt = sp.bmat([[hessian, gamma * constraints.T], [gamma * constraints, None]], format="csc")
    rhs = np.concatenate([rhs_h, gamma * np.concatenate(rhs_d)])
    assembled = time.perf_counter()
    lu = spla.splu(kkt, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=DIAG_PIVOT_THRESHOLD)
    factored = time.perf_counter()
    solution = lu.solve(rhs)
    scale = max(np.abs(rhs).max(), 1e-300)
    unrefined = float(np.abs(kkt @ solution - rhs).max() / scale)
    solution += lu.solve(rhs - kkt @ solution)
    residual = float(np.abs(kkt @ solution - rhs).max() / scale)
    solved = time.perf_counter()
    h = solution[:n]
    violation = float(np.abs(constraints @ h - np.concatenate(rhs_d)).max()) if row else 0.0
    stats = SolveStats(
        unknowns=n,
        constraints=row,
        kkt_nonzeros=kkt.nnz,
        factor_nonzeros=lu.L.nnz + lu.U.nnz,
        assemble_s=assembled - started,
        factor_s=factored - assembled,
        solve_s=solved - factored,
        relative_residual=residual,
        relative_residual_unrefined=unrefined,
        max_constraint_violation=violation,
    )
    if not np.isfinite(residual) or residual > MAX_RELATIVE_RESIDUAL:
        raise ArithmeticError(
            f"GLS solve failed: relative residual {residual:.2e} > {MAX_RELATIVE_RESIDUAL:g} "
            "(are the leaves measured in enough detail for every cell to be identified?)"
        )
    return [h[offsets[i] : offsets[i + 1]].reshape(k, m) for i, k in enumerate(sizes)], stats


# --- the same GLS by elimination along the tree (for schemas too large for the sparse LU) ---


@dataclass
class TreeSolveStats:
    unknowns: int
    distinct_covariances: int
    solve_s: float
    relative_residual: float  # optimality: leaf gradients off the invariants' span, / max |b|
    max_constraint_violation: float  # max over children sums and invariant totals

    def text(self) -> str:
        return (
            f"{self.unknowns} unknowns (tree elimination, {self.distinct_covariances} distinct"
            f" covariances); solve {self.solve_s:.2f} s; relative optimality residual "
            f"{self.relative_residual:.1e}, max constraint violation "
            f"{self.max_constraint_violation:.1e}"
        )


def _information(lv: LevelMeasurements, m: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Per node: the index of its information matrix ``sum_q A_q^T A_q / sigma2`` among the
    level's distinct ones (nodes with the same variances share one), those matrices, and
    ``b_v = sum_q A_q^T y_{v,q} / sigma2``."""
    weights = (
        np.stack(
            [
                1.0 / np.broadcast_to(np.asarray(s, dtype=np.float64), (lv.n_nodes,))
                for _, s, _ in lv.queries
            ]
        )
        if lv.queries
        else np.zeros((0, lv.n_nodes))
    )
    keys, key_of = np.unique(weights.T, axis=0, return_inverse=True)
    grams = [a.T @ a for a, _, _ in lv.queries]
    info = [sum((w * g for w, g in zip(key, grams, strict=True)), np.zeros((m, m))) for key in keys]
    b = np.zeros((lv.n_nodes, m))
    for (a, _, y), w in zip(lv.queries, weights, strict=True):
        b += w[:, None] * (np.asarray(y, dtype=np.float64) @ a)
    return key_of.reshape(-1), info, b


def _condition_on_total(
    cov: np.ndarray, mean: np.ndarray, total: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The Gaussian ``(mean, cov)`` of histograms conditioned on their exact ``total`` (one
    covariance shared by the rows of ``mean``): the equality-constrained least squares."""
    u = cov.sum(axis=1)
    spread = float(u.sum())
    if spread <= 1e-12 * max(float(np.trace(cov)), 1e-300):  # the total is already exact
        return cov, mean
    mean = mean + np.outer(np.asarray(total, dtype=np.float64) - mean.sum(axis=1), u / spread)
    return cov - np.outer(u, u) / spread, mean


def _pinv_solve(s: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``S^+ r`` for a symmetric positive semi-definite ``S`` (singular along exact totals)."""
    values, vectors = np.linalg.eigh(s)
    keep = values > 1e-10 * max(float(values[-1]), 1e-300)
    return vectors[:, keep] @ ((vectors[:, keep].T @ r) / values[keep, None])


def _children_of(parent: np.ndarray, n_parents: int) -> list[np.ndarray]:
    order = np.argsort(parent, kind="stable")
    return np.split(order, np.searchsorted(parent[order], np.arange(1, n_parents)))


@dataclass
class _ParentGroup:
    """Parents whose children have the same covariances (``pairs``: covariance index and
    multiplicity) and who share one information matrix: they share one covariance too."""

    pairs: tuple[tuple[int, int], ...]
    info: int
    parents: list[int] = field(default_factory=list)

    def children_covariance(self, covs: list[np.ndarray]) -> np.ndarray:
        """``S``, the covariance of the sum of the children's estimates."""
        return sum((n * covs[j] for j, n in self.pairs), np.zeros_like(covs[0]))


def _parent_groups(
    children_of: list[np.ndarray], child_cov_of: np.ndarray, info_of: np.ndarray
) -> list[_ParentGroup]:
    groups: dict[tuple[tuple[tuple[int, int], ...], int], _ParentGroup] = {}
    for v, children in enumerate(children_of):
        ids, counts = np.unique(child_cov_of[children], return_counts=True)
        pairs = tuple((int(j), int(n)) for j, n in zip(ids, counts, strict=True))
        key = (pairs, int(info_of[v]))
        groups.setdefault(key, _ParentGroup(pairs, int(info_of[v]))).parents.append(v)
    return list(groups.values())


@dataclass
class _Up:
    """A level after the pass up: each node's estimate from its subtree, the level's distinct
    covariances and each node's index among them; above the leaves, its parents' groups and
    the sums of their children's estimates."""

    mean: np.ndarray
    covs: list[np.ndarray]
    cov_of: np.ndarray
    groups: list[_ParentGroup] = field(default_factory=list)
    child_sums: np.ndarray | None = None


def _leaves_up(
    lv: LevelMeasurements, info: list[np.ndarray], info_of: np.ndarray, b: np.ndarray
) -> _Up:
    try:
        factors = [np.linalg.inv(np.linalg.cholesky(h)) for h in info]
    except np.linalg.LinAlgError as err:
        raise ArithmeticError(
            "GLS by tree: a leaf's information is singular (the leaves must be measured in"
            " enough detail for every cell to be identified)"
        ) from err
    mean = np.zeros_like(b)
    covs = []
    for j, factor in enumerate(factors):
        cov = factor.T @ factor
        rows = info_of == j
        x = b[rows] @ cov
        if lv.invariant_totals is not None:
            cov, x = _condition_on_total(cov, x, lv.invariant_totals[rows])
        mean[rows] = x
        covs.append(cov)
    return _Up(mean, covs, info_of)


def _parents_up(
    lv: LevelMeasurements,
    info: list[np.ndarray],
    info_of: np.ndarray,
    b: np.ndarray,
    below: _Up,
    children_of: list[np.ndarray],
) -> _Up:
    """``Sigma = (I + S H)^-1 S`` and ``x = (I + S H)^-1 (s + S b)``, one solve per group of
    parents sharing ``S`` and ``H``, then conditioned on an invariant total."""
    m = b.shape[1]
    sums = np.stack([below.mean[c].sum(axis=0) for c in children_of])
    groups = _parent_groups(children_of, below.cov_of, info_of)
    mean = np.zeros_like(b)
    covs: list[np.ndarray] = []
    cov_of = np.zeros(lv.n_nodes, dtype=np.int64)
    for group in groups:
        rows = np.array(group.parents)
        s_cov = group.children_covariance(below.covs)
        rhs = np.column_stack([s_cov, sums[rows].T + s_cov @ b[rows].T])
        both = np.linalg.solve(np.eye(m) + s_cov @ info[group.info], rhs)
        cov, x = 0.5 * (both[:, :m] + both[:, :m].T), both[:, m:].T
        if lv.invariant_totals is not None:
            cov, x = _condition_on_total(cov, x, lv.invariant_totals[rows])
        mean[rows] = x
        cov_of[rows] = len(covs)
        covs.append(cov)
    return _Up(mean, covs, cov_of, groups, sums)


def _children_down(
    up: _Up, final_parents: np.ndarray, below: _Up, children_of: list[np.ndarray]
) -> np.ndarray:
    """Each child moved from its own estimate by ``Sigma_c S^+ (x_parent - s)``."""
    x = below.mean.copy()
    assert up.child_sums is not None
    for group in up.groups:
        rows = np.array(group.parents)
        steps = _pinv_solve(
            group.children_covariance(below.covs), (final_parents[rows] - up.child_sums[rows]).T
        )
        for column, p in enumerate(group.parents):
            children = children_of[p]
            for j in np.unique(below.cov_of[children]):
                moved = children[below.cov_of[children] == j]
                x[moved] += below.covs[j] @ steps[:, column]
    return x


def solve_gls_by_tree(problem: TreeProblem) -> tuple[list[np.ndarray], TreeSolveStats]:
    """The GLS of every node's histogram by Gaussian elimination along the tree, dense in the
    cells: up the tree, each node's estimate from its subtree's measurements and its covariance
    (a leaf's is its information's inverse; a parent's combines the sum of its children's with
    its own measurements, ``Sigma = (I + S H)^-1 S``, ``x = (I + S H)^-1 (s + S b)``, then
    conditions on an invariant total); down the tree, each child moves from its own estimate
    by ``Sigma_c S^+ (x_parent - s)``, the minimiser of its children's quadratics under their
    sum being the parent's final value. Nodes share a covariance when their children's
    covariances and their own variances are the same (leaves with the same variances; parents
    with as many such children), so the memory is ``m^2`` per distinct covariance (Perry County
    at 2,016 cells: 1 for the 511 blocks, 18 above). The result is certified by the leaves'
    gradient of the objective, which must be a constant per deepest invariant node (its
    multipliers) and zero elsewhere."""
    started = time.perf_counter()
    m = problem.n_cells
    levels = problem.levels
    informations = [_information(lv, m) for lv in levels]
    children = [
        _children_of(levels[i + 1].parent, levels[i].n_nodes) for i in range(len(levels) - 1)
    ]
    info_of, info, b = informations[-1]
    ups = [_leaves_up(levels[-1], info, info_of, b)]
    for i in range(len(levels) - 2, -1, -1):
        info_of, info, b = informations[i]
        ups.insert(0, _parents_up(levels[i], info, info_of, b, ups[0], children[i]))
    final = [ups[0].mean]
    for i in range(1, len(levels)):
        final.append(_children_down(ups[i - 1], final[-1], ups[i], children[i - 1]))
    solved = time.perf_counter()
    residual, violation = _tree_certificate(problem, final, informations)
    stats = TreeSolveStats(
        unknowns=levels[-1].n_nodes * m,
        distinct_covariances=sum(len(up.covs) for up in ups),
        solve_s=solved - started,
        relative_residual=residual,
        max_constraint_violation=violation,
    )
    if not np.isfinite(residual) or residual > MAX_RELATIVE_RESIDUAL:
        raise ArithmeticError(
            f"GLS by tree failed: relative optimality residual {residual:.2e} > "
            f"{MAX_RELATIVE_RESIDUAL:g}"
        )
    return final, stats


def _tree_certificate(
    problem: TreeProblem,
    estimates: list[np.ndarray],
    informations: list[tuple[np.ndarray, list[np.ndarray], np.ndarray]],
) -> tuple[float, float]:
    """How far the leaf estimates are from optimal and feasible. Every node's histogram is
    summed from the leaves; each leaf's gradient is the sum over its ancestors (itself
    included) of ``H_v h_v - b_v``; at the optimum it is ``c 1`` with one ``c`` per deepest
    invariant node (the multipliers of the invariant totals above the leaf) and 0 without
    invariants. Returns (max gradient off that span / max |b|, max constraint violation)."""
    levels = problem.levels
    leaves = estimates[-1]
    sums = [leaves]
    for i in range(len(levels) - 1, 0, -1):
        up = np.zeros((levels[i - 1].n_nodes, problem.n_cells))
        np.add.at(up, levels[i].parent, sums[0])
        sums.insert(0, up)
    violation = max(float(np.abs(h - e).max()) for h, e in zip(sums, estimates, strict=True))
    gradient = np.zeros((levels[0].n_nodes, problem.n_cells))
    scale = 1e-300
    for i, (key_of, info, b) in enumerate(informations):
        if i:
            gradient = gradient[levels[i].parent]
        for j, h in enumerate(info):
            rows = key_of == j
            gradient[rows] += sums[i][rows] @ h
        gradient -= b
        scale = max(scale, float(np.abs(b).max()))
    inv = deepest_invariant_level(problem)
    if inv is not None:
        totals = problem.levels[inv].invariant_totals
        assert totals is not None
        violation = max(violation, float(np.abs(sums[inv].sum(axis=1) - totals).max()))
        group = np.arange(levels[inv].n_nodes)
        for i in range(inv + 1, len(levels)):
            group = group[levels[i].parent]
        for g in np.unique(group):
            gradient[group == g] -= gradient[group == g].mean()
    return float(np.abs(gradient).max()) / scale, violation


# --- reading a release ------------------------------------------------------------------------


def read_delta(path: Path) -> pd.DataFrame:
    """A Delta table's current snapshot as pandas, partition columns included, replayed from
    its ``_delta_log`` (the latest single-file checkpoint, then the JSON commits after it)."""
    log = path / "_delta_log"
    if not log.is_dir():
        raise FileNotFoundError(f"{path}: not a Delta table (no _delta_log)")
    active: dict[str, dict[str, str]] = {}
    start = -1
    checkpoints = sorted(log.glob("*.checkpoint*.parquet"))
    if checkpoints and not checkpoints[-1].name.endswith(".checkpoint.parquet"):
        raise NotImplementedError(f"{checkpoints[-1]}: only single-file checkpoints are read")
    if checkpoints:
        start = int(checkpoints[-1].name.split(".")[0])
        table = pq.read_table(checkpoints[-1], columns=["add"]).to_pylist()
        for rec in table:
            if rec["add"] is not None:
                active[rec["add"]["path"]] = dict(rec["add"]["partitionValues"] or {})
    for commit in sorted(log.glob("*.json")):
        if int(commit.stem) <= start:
            continue
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                active[action["add"]["path"]] = action["add"].get("partitionValues") or {}
            elif "remove" in action:
                active.pop(action["remove"]["path"], None)
    frames = []
    for rel, partition in sorted(active.items()):
        frame = pq.read_table(path / urllib.parse.unquote(rel)).to_pandas()
        for key, value in partition.items():
            frame[key] = value
        frames.append(frame)
    if not frames:
        raise ValueError(f"{path}: the Delta table has no data files")
    return pd.concat(frames, ignore_index=True)


def _read_input_frame(config: TopDownConfig) -> pd.DataFrame:
    spec = config.input
    assert spec is not None
    if spec.format == "csv":
        return pd.read_csv(spec.path, dtype=str, keep_default_na=False)
    if spec.format == "parquet":
        return pd.read_parquet(spec.path)
    return read_delta(spec.path)


def true_leaf_histograms(config: TopDownConfig) -> tuple[np.ndarray, np.ndarray]:
    """Sorted leaf geocodes and their true dense histograms ``(n_leaves, n_cells)`` (int64),
    read from the run's input (``block_counts`` or ``microdata``) with pandas."""
    spec = config.input
    if spec is None:
        raise ValueError(f"{config.source}: [input] missing")
    df = _read_input_frame(config)
    geocode = df[list(spec.geocode_columns)].astype(str).apply(lambda c: c.str.strip())
    geocodes = geocode.agg("".join, axis=1).to_numpy().astype(str)
    n_cells = config.schema.n_cells
    if spec.layout == "block_counts":
        hist = np.zeros((len(df), n_cells), dtype=np.int64)
        for c in spec.cells:
            value = np.zeros(len(df), dtype=np.int64)
            for col in c.plus:
                value += pd.to_numeric(df[col]).to_numpy(dtype=np.int64)
            for col in c.minus:
                value -= pd.to_numeric(df[col]).to_numpy(dtype=np.int64)
            hist[:, c.cell] = value
        order = np.argsort(geocodes, kind="stable")
        return geocodes[order], hist[order]
    levels = []
    for a in spec.attributes:
        attr = config.schema.attribute(a.attribute)
        raw = df[a.column].astype(str).str.strip().map(dict(a.value_map))
        levels.append(raw.map({lv: i for i, lv in enumerate(attr.levels)}).to_numpy(dtype=np.int64))
    cell = config.schema.cell_of(np.stack(levels, axis=1))
    leaves, leaf_index = np.unique(geocodes, return_inverse=True)
    hist = np.zeros((len(leaves), n_cells), dtype=np.int64)
    np.add.at(hist, (leaf_index, cell), 1)
    return leaves, hist


@dataclass
class LevelReference:
    name: str
    geocodes: np.ndarray  # sorted
    gls: np.ndarray  # (k, n_cells) float: unrounded GLS, may be negative; 0 at structural zeros
    truth: np.ndarray  # (k, n_cells) int64


@dataclass
class GlsReference:
    levels: list[LevelReference]
    stats: SolveStats | TreeSolveStats
    read_s: float
    timings: dict[str, float] = field(default_factory=dict)

    def level(self, name: str) -> LevelReference:
        return next(lv for lv in self.levels if lv.name == name)

    def frame(self) -> pd.DataFrame:
        """Long table ``level, geocode, cell, gls, truth`` (every cell of every node)."""
        parts = []
        for lv in self.levels:
            k, m = lv.gls.shape
            parts.append(
                pd.DataFrame(
                    {
                        "level": lv.name,
                        "geocode": np.repeat(lv.geocodes, m),
                        "cell": np.tile(np.arange(m), k),
                        "gls": lv.gls.ravel(),
                        "truth": lv.truth.ravel(),
                    }
                )
            )
        return pd.concat(parts, ignore_index=True)


def invariant_level_names(config: TopDownConfig) -> list[str]:
    """The configured invariant levels and every level above them."""
    if not config.invariant_levels:
        return []
    deepest = max(config.hierarchy.index(lv) for lv in config.invariant_levels)
    return list(config.hierarchy.names[: deepest + 1])


def release_config(release: Path, config: Path | None, input_path: Path | None) -> TopDownConfig:
    """The run's config (``config`` or the manifest's ``config_file``), its input overridden by
    ``input_path`` or the manifest's ``input``."""
    manifest_path = release / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if config is None:
        if "config_file" not in manifest:
            raise ValueError(f"{release}: no manifest.json; pass the run's config")
        config = Path(manifest["config_file"])
    loaded = load_topdown_config(config)
    if input_path is None and "input" in manifest:
        input_path = Path(manifest["input"])
    if input_path is not None and loaded.input is not None:
        loaded = replace(loaded, input=replace(loaded.input, path=input_path))
    return loaded


def build_problem(
    config: TopDownConfig, noisy: pd.DataFrame, leaf_geocodes: np.ndarray, leaf_truth: np.ndarray
) -> tuple[TreeProblem, list[np.ndarray], list[np.ndarray], np.ndarray]:
    """The tree problem of a release; also each level's sorted geocodes and true histograms and
    the active (non-structural-zero) cells."""
    hierarchy = config.hierarchy
    zero = np.zeros(config.schema.n_cells, dtype=bool)
    zero[list(config.structural_zero_cells)] = True
    active = np.flatnonzero(~zero)
    if leaf_truth[:, zero].any():
        raise ValueError("the input has people in structural-zero cells")
    inv_levels = set(invariant_level_names(config))
    geocodes: list[np.ndarray] = []
    truths: list[np.ndarray] = []
    levels: list[LevelMeasurements] = []
    by_level = dict(tuple(noisy.groupby("level", sort=False)))
    for i, level in enumerate(hierarchy.levels):
        prefixes = np.array([g[: level.digits] for g in leaf_geocodes])
        nodes, leaf_to_node = np.unique(prefixes, return_inverse=True)
        truth = np.zeros((len(nodes), config.schema.n_cells), dtype=np.int64)
        np.add.at(truth, leaf_to_node, leaf_truth)
        if i == 0:
            parent = np.zeros(0, dtype=np.int64)
        else:
            up = hierarchy.levels[i - 1].digits
            parent = np.searchsorted(geocodes[-1], np.array([g[:up] for g in nodes]))
        rows = by_level.get(level.name)
        if rows is None and not config.bypass_single_child:
            raise ValueError(f"noisy_measurements has no rows for level {level.name!r}")
        if rows is None:
            rows = noisy.iloc[:0]
        measured = set(rows["geocode"])
        if not measured <= set(nodes) or (
            measured != set(nodes) and not config.bypass_single_child
        ):
            raise ValueError(
                f"level {level.name!r}: the measured nodes ({len(measured)}) are not the input's "
                f"({len(nodes)})"
            )
        queries = []
        for q in config.queries[level.name]:
            sub = rows[rows["query"] == q.name]
            index = pd.Index(nodes).get_indexer(sub["geocode"])
            if len(sub) != len(measured) or (index < 0).any() or len(set(index)) != len(sub):
                raise ValueError(f"level {level.name!r}, query {q.name!r}: not one row per node")
            y = np.zeros((len(nodes), q.size), dtype=np.float64)
            y[index] = np.stack(sub["noisy"].to_numpy()).astype(np.float64) if len(sub) else 0.0
            a = q.matrix()[:, active].astype(np.float64)
            sigma2 = np.full(len(nodes), np.inf)
            if "sigma2" in sub.columns:
                sigma2[index] = [float(Fraction(v)) for v in sub["sigma2"]]
            else:
                sigma2[index] = float(config.budget.sigma2_for(level.name, q.name))
            queries.append((a, sigma2, y))
        levels.append(
            LevelMeasurements(
                name=level.name,
                n_nodes=len(nodes),
                parent=parent,
                queries=tuple(queries),
                invariant_totals=truth.sum(axis=1) if level.name in inv_levels else None,
            )
        )
        geocodes.append(nodes)
        truths.append(truth)
    return TreeProblem(tuple(levels), len(active)), geocodes, truths, active


Solver = Callable[[TreeProblem], tuple[list[np.ndarray], SolveStats | TreeSolveStats]]
SOLVERS: dict[str, Solver] = {"lu": solve_gls, "tree": solve_gls_by_tree}
SOLVER_HELP = (
    "lu: the sparse KKT factorisation (fast for small schemas; dense per node, so not for 2,016"
    " cells); tree: elimination along the tree, dense in the cells (m^2 memory per parent)"
)


def gls_reference(
    release: Path, config: Path | None = None, input_path: Path | None = None, solver: str = "lu"
) -> GlsReference:
    """The exact GLS of every node of a finished release, beside the true histograms."""
    started = time.perf_counter()
    run = release_config(release, config, input_path)
    leaf_geocodes, leaf_truth = true_leaf_histograms(run)
    noisy = read_delta(release / NOISY_MEASUREMENTS)
    problem, geocodes, truths, active = build_problem(run, noisy, leaf_geocodes, leaf_truth)
    read_s = time.perf_counter() - started
    estimates, stats = SOLVERS[solver](problem)
    levels = []
    for lv, nodes, truth, est in zip(problem.levels, geocodes, truths, estimates, strict=True):
        full = np.zeros((lv.n_nodes, run.schema.n_cells))
        full[:, active] = est
        levels.append(LevelReference(lv.name, nodes, full, truth))
    return GlsReference(levels, stats, read_s)


def level_errors(estimate: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Mean absolute error of node totals and mean detailed L1 over the level's nodes."""
    diff = estimate - truth
    return {
        "mae_total": float(np.abs(diff.sum(axis=1)).mean()),
        "l1_detailed": float(np.abs(diff).sum(axis=1).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True, help="a finished release folder")
    parser.add_argument("--config", type=Path, help="the run's config (default: the manifest's)")
    parser.add_argument("--input", type=Path, help="the run's input (default: the manifest's)")
    parser.add_argument("--write", type=Path, help="write level, geocode, cell, gls, truth here")
    parser.add_argument("--solver", choices=sorted(SOLVERS), default="lu", help=SOLVER_HELP)
    args = parser.parse_args()
    ref = gls_reference(args.release, args.config, args.input, args.solver)
    print(f"read {ref.read_s:.1f} s; {ref.stats.text()}")
    print("| level | nodes | MAE total | mean detailed L1 |")
    print("|---|---|---|---|")
    for lv in ref.levels:
        e = level_errors(lv.gls, lv.truth)
        print(f"| {lv.name} | {len(lv.geocodes)} | {e['mae_total']:.3f} | {e['l1_detailed']:.3f} |")
    if args.write:
        ref.frame().to_parquet(args.write, index=False)


if __name__ == "__main__":
    main()
