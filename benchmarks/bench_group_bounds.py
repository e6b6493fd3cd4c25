"""What the group bounds cost the least squares: ``solve_children`` on families whose
unbounded solution breaks some children's lower bounds, against the same family solved
without bounds (the baseline, same run), by the default fallback (the multipliers' Newton
method, then the interior-point QP) and by the interior-point QP alone.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_group_bounds.py

A family: ``k`` children of ``n`` cells (two attributes, 2 x n/2), total, one-way and
detailed queries with noise sigma 2 on a Poisson(0.6) truth, the second half of the cells one
group whose lower bound is the truth's group sum for ``binding`` children (0 for the others).
Every bounded answer is checked to meet the bounds and to agree with the interior-point one
(1e-6 relative objective) before a time is reported. Median of 3. Writes
benchmarks/results/group_bounds_solvers.md.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import _common as common
import numpy as np

from censusdp_spark.topdown.solvers import ChildrenProblem, bounded, solve_children
from censusdp_spark.topdown.solvers.subproblem import GroupBounds

RESULTS = common.RESULTS_DIR / "group_bounds_solvers.md"
CASES = ((30, 16, 3), (30, 64, 3), (20, 252, 1), (20, 252, 3), (20, 252, 20))
REPEATS = 3


def family(k: int, n: int, binding: int, seed: int) -> tuple[ChildrenProblem, ChildrenProblem]:
    """The bounded family and the same without bounds."""
    rng = np.random.default_rng(seed)
    total, half, detail = np.zeros(n, dtype=np.int64), np.arange(n) // (n // 2), np.arange(n)
    truth = rng.poisson(0.6, (k, n))
    maps, sizes = (total, half, detail), (1, 2, n)
    noisy = tuple(
        np.stack([np.bincount(m, row, minlength=s) for row in truth]) + rng.normal(0, 2, (k, s))
        for m, s in zip(maps, sizes, strict=True)
    )
    members = np.zeros((1, n), dtype=bool)
    members[0, n // 2 :] = True
    sums = truth @ members.T.astype(float)
    lower = np.where(np.arange(k)[:, None] < binding, sums, 0.0)
    bounds = GroupBounds(members, lower, np.full(lower.shape, np.inf))
    weights = np.array([1.0, 0.5, 0.5])
    parent = truth.sum(axis=0)
    return (
        ChildrenProblem(
            marginals=maps,
            marginal_sizes=sizes,
            weights=weights,
            noisy=noisy,
            parent=parent,
            child_totals=None,
            group_bounds=bounds,
        ),
        ChildrenProblem(
            marginals=maps,
            marginal_sizes=sizes,
            weights=weights,
            noisy=noisy,
            parent=parent,
            child_totals=None,
        ),
    )


def timed(solve: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    times, x = [], None
    for _ in range(REPEATS):
        started = time.perf_counter()
        x = solve()
        times.append(time.perf_counter() - started)
    assert x is not None
    return statistics.median(times), x


def objective(problem: ChildrenProblem, x: np.ndarray) -> float:
    total = 0.0
    for m, s, w, y in zip(
        problem.marginals, problem.marginal_sizes, problem.weights, problem.noisy, strict=True
    ):
        total += float(w * np.sum((np.stack([np.bincount(m, r, minlength=s) for r in x]) - y) ** 2))
    return total


def main() -> None:
    common.argument_parser(__doc__).parse_args()
    rows = []
    for k, n, binding in CASES:
        problem, free = family(k, n, binding, seed=k * n + binding)
        assert problem.group_bounds is not None
        base, x_free = timed(lambda p=free: solve_children(p))
        broken = int(problem.group_bounds.violation(x_free) > 1e-6)
        auto, x_auto = timed(lambda p=problem: solve_children(p))
        limit = bounded.MAX_MULTIPLIER_SOLVES
        bounded.MAX_MULTIPLIER_SOLVES = 0
        try:
            interior, x_interior = timed(lambda p=problem: solve_children(p))
        finally:
            bounded.MAX_MULTIPLIER_SOLVES = limit
        for x in (x_auto, x_interior):
            assert problem.group_bounds.violation(x) <= 1e-7 * max(1.0, x.sum())
        best = objective(problem, x_interior)
        assert abs(objective(problem, x_auto) - best) <= 1e-6 * max(1.0, abs(best))
        rows.append((k, n, binding, broken, base, auto, interior))
        print(rows[-1], flush=True)
    lines = [
        "## Group bounds in the least squares (solver families)",
        "",
        common.command_note(
            "OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_group_bounds.py",
            packages=(),
        )
        + ". Baseline: the same family without bounds, same run."
        " Median of 3; every bounded answer meets its bounds and matches the interior-point"
        " optimum (1e-6 relative objective).",
        "",
        "| children k | cells n | children bounded | unbounded (baseline) | default fallback |"
        " interior point alone | default / baseline | interior / baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, n, binding, broken, base, auto, interior in rows:
        lines.append(
            f"| {k} | {n} | {binding}{'' if broken else ' (none broken)'} | {base * 1e3:.1f} ms |"
            f" {auto * 1e3:.1f} ms | {interior * 1e3:.1f} ms | {auto / base:.1f}× |"
            f" {interior / base:.1f}× |"
        )
    common.write_report(RESULTS, lines)


if __name__ == "__main__":
    main()
