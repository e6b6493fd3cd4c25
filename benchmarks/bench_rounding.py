"""Benchmark round_children's flow path (nested queries) against the MILP on the same estimates.

Run from the repository root (one BLAS thread, so that other load on the machine does not
distort the comparison):

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rounding.py

Writes benchmarks/results/rounding.md. The families are TopDown families whose queries are nested
(total and detailed, as at the block and state levels of conf/national_demo.toml), generated
here. The baseline is the MILP that round_children used for them before the flow path: the
same call with the laminar test switched off. Every flow rounding is checked to meet the sums
and to have the MILP's objective (within 1e-9) before any time is reported.
"""

from __future__ import annotations

import statistics
import time
from unittest import mock

import _common as common
import numpy as np

import censusdp_spark.topdown.solvers.rounding as rounding
from censusdp_spark.topdown.solvers import ChildrenProblem, round_children, solve_children

# (label, children k, population of the parent, child totals invariant?, families)
FAMILIES: list[tuple[str, int, int, bool, int]] = [
    ("block group, 1% sample", 34, 150, False, 20),
    ("block group, full count", 34, 1_500, False, 20),
    ("tract-sized parent of 300 blocks", 300, 10_000, False, 4),
    ("nation -> 51 states, totals invariant", 51, 330_000_000, True, 4),
]
REPEATS = 3
RESULTS = common.RESULTS_DIR / "rounding.md"
# votingage (2) x hisprace (8): the total and the detailed cells.
MAPS = (np.zeros(16, dtype=np.int64), np.arange(16))
SIZES = (1, 16)
SIGMAS = np.array([np.sqrt(10.0), np.sqrt(10.0 / 9.0)])


def family(rng: np.random.Generator, k: int, population: int, totals: bool) -> ChildrenProblem:
    """A parent from a Dirichlet-multinomial, split among children by another one, measured
    with Gaussian noise (block-level budget split: 1/10 total, 9/10 detailed)."""
    parent = rng.multinomial(population, rng.dirichlet(np.full(16, 0.6)))
    shares = rng.dirichlet(np.full(k, 2.0))
    children = np.stack([rng.multinomial(c, rng.dirichlet(20 * shares)) for c in parent], axis=1)
    noisy = tuple(
        np.stack([np.bincount(m, child, minlength=s) for child in children])
        + rng.normal(0.0, sigma, (k, s))
        for m, s, sigma in zip(MAPS, SIZES, SIGMAS, strict=True)
    )
    return ChildrenProblem(
        marginals=MAPS,
        marginal_sizes=SIZES,
        weights=1.0 / SIGMAS**2,
        noisy=noisy,
        parent=parent.astype(np.int64),
        child_totals=children.sum(axis=1).astype(np.int64) if totals else None,
    )


def deviation(problem: ChildrenProblem, x: np.ndarray, x_hat: np.ndarray) -> float:
    """The rounding objective: ``sum_q sum_c ||Q_q x_c - Q_q x_hat_c||_1``."""
    return float(
        sum(
            np.abs(np.bincount(m, row - row_hat, minlength=s)).sum()
            for m, s in zip(problem.marginals, problem.marginal_sizes, strict=True)
            for row, row_hat in zip(x, x_hat, strict=True)
        )
    )


def milp_rounding(problem: ChildrenProblem, x_hat: np.ndarray) -> np.ndarray:
    with mock.patch.object(rounding, "is_laminar", return_value=False):
        return round_children(problem, x_hat)


def best_ms(run) -> tuple[float, float]:
    """Best wall and best CPU time of ``REPEATS`` runs, in ms. Both are reported: the machine is
    shared, which inflates wall times, and HiGHS also waits on its worker threads."""
    wall, cpu = [], []
    for _ in range(REPEATS):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.process_time() - start_cpu)
    return min(wall) * 1e3, min(cpu) * 1e3


def main() -> None:
    common.argument_parser(__doc__).parse_args()
    rng = np.random.default_rng(20261129)
    rows = []
    for label, k, population, totals, count in FAMILIES:
        flow_ms, milp_ms, fractional = [], [], []
        for _ in range(count):
            problem = family(rng, k, population, totals)
            x_hat = solve_children(problem)
            x, best = round_children(problem, x_hat), milp_rounding(problem, x_hat)
            assert np.array_equal(x.sum(axis=0), problem.parent)
            if totals:
                assert np.array_equal(x.sum(axis=1), problem.child_totals)
            gap = deviation(problem, x, x_hat) - deviation(problem, best, x_hat)
            assert abs(gap) <= 1e-9, f"{label}: flow objective differs from the MILP's by {gap}"
            fractional.append(int(np.count_nonzero(np.abs(x_hat - np.round(x_hat)) > 1e-9)))
            flow_ms.append(best_ms(lambda p=problem, y=x_hat: round_children(p, y)))
            milp_ms.append(best_ms(lambda p=problem, y=x_hat: milp_rounding(p, y)))
        flow = [statistics.median(times) for times in zip(*flow_ms, strict=True)]
        milp = [statistics.median(times) for times in zip(*milp_ms, strict=True)]
        rows.append(
            f"| {label} | {k} | {'yes' if totals else 'no'} | "
            f"{statistics.median(fractional):.0f} | {milp[0]:.2f} / {milp[1]:.2f} | "
            f"{flow[0]:.2f} / {flow[1]:.2f} | {milp[0] / flow[0]:.1f}x / {milp[1] / flow[1]:.1f}x |"
        )
        print(rows[-1], flush=True)
    common.write_report(RESULTS, report(rows))


def report(rows: list[str]) -> list[str]:
    lines = [
        "# Rounding benchmark: the flow path for nested queries vs the MILP",
        "",
        common.command_note(
            "OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rounding.py",
            arch=True,
            load=True,
            packages=("numpy",),
        )
        + ".",
        "",
        "Queries total and detailed over 16 cells (the block and state levels of "
        "`conf/national_demo.toml`). Each family's L2 estimate is rounded by round_children "
        "(flow path) and by the MILP it used before (same call, laminar test off); the two "
        "objectives agree within 1e-9 on every family, checked before timing. Times are "
        f"wall / CPU ms, each the median over families of the best of {REPEATS} runs; `fractional` is the median number of "
        "entries to decide.",
        "",
        "| family | k | child totals | fractional | MILP ms | flow ms | speed-up |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    return lines


if __name__ == "__main__":
    main()
