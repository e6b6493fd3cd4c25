"""Group-size release: post-processing time of M_c (cumulative) against M_H^dp as the number of
sizes N grows, and against the previous cumulative solver. Writes
benchmarks/results/cumulative_scaling.md.

    .venv/bin/python benchmarks/bench_cumulative_scaling.py [--sizes 7 100 400 1000 5000]
        [--epsilons 1 1/10] [--groups 300000] [--old-timeout 60]

The tree is synthetic and heavy-tailed: root -> 4 -> 28 leaves, each leaf Poisson(groups / 28)
groups with sizes 1..N drawn with probability ~ 1/size^2 (so a few hundred groups above size
1,000 at N = 5,000). Noise is the project's own (keyed geometric, L = 3: scale 6/eps for
histograms, 3/eps for cumulative counts), level faithfulness. `dp` and `cumulative`
post-process the same truth in the same process, one after the other (best of 3 runs each);
the ratio is cumulative / dp. The previous solver (``OLD_COMMIT``'s ``cumulative.py``, read
from git) solves the very families the new one solved (same parents), at the first eps only,
in a child process killed after ``--old-timeout`` seconds; once it times out, larger N are not
tried. Small trees (the real CALM tree, N = 4, and a synthetic national-like spine, N = 7)
compare new and old on every family the same way.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
import types
from fractions import Fraction

import _common as common
import numpy as np
from _group_size_trees import Dataset, calm, heavy_tailed, noisy, spine

from censusdp_spark.group_sizes.solvers import cumulative
from censusdp_spark.group_sizes.solvers.tree import GroupTree, dp_release

OLD_COMMIT = "cf7a790"  # the last commit with the unit-by-unit Bellman-Ford solver
RUNS = 3  # best of 3 runs; the old solver once, and 3 more (in turn with the new) if quick
QUICK_S = 5.0


@functools.cache
def old_module() -> types.ModuleType:
    source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:censusdp_spark/group_sizes/solvers/cumulative.py"],
        cwd=common.ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("old_cumulative")
    exec(compile(source, f"{OLD_COMMIT}:cumulative.py", "exec"), module.__dict__)
    return module


def best_of(runs: int, work) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return min(times), result


def families(
    tree: GroupTree, counts: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every family's inputs (noisy, parent's histogram, caps) below the released ``counts``."""
    total = int(tree.groups[0])
    kids = tree.children()
    return [
        (tree.noisy[kids[r]], counts[r], np.full(kids[r].size, total))
        for r in range(len(kids))
        if kids[r].size
    ]


def family_costs(solver, inputs) -> list[int]:
    costs = []
    for noisy_rows, parent, caps in inputs:
        found = np.cumsum(solver(noisy_rows, parent, "level", caps), axis=1)
        costs.append(int(np.square(found - noisy_rows).sum()))
    return costs


def solve_old(old: types.ModuleType, tree: GroupTree, inputs) -> list[int]:
    old.cumulative_root(tree.noisy[0], int(tree.groups[0]), "level")
    return family_costs(old.cumulative_family, inputs)


def _old_once(tree: GroupTree, inputs) -> tuple[float, list[int], float]:
    old = old_module()
    common.reset_peak_memory()
    seconds, costs = best_of(1, lambda: solve_old(old, tree, inputs))
    return seconds, costs, common.peak_memory_gib()


def run_old(tree: GroupTree, inputs, timeout: float) -> tuple[float, list[int], float] | None:
    """The previous solver on the same root and families, one run in a child process:
    seconds, family objectives, peak GiB (None: timed out)."""
    return common.in_fresh_process(lambda: _old_once(tree, inputs), timeout)


def release(tree: GroupTree) -> np.ndarray:
    return cumulative.cumulative_release(tree)


def compare(data: Dataset, old_timeout: float | None, epsilon: Fraction = Fraction(1)) -> dict:
    cum = noisy(data, "cumulative", epsilon, 0, "level")
    hist = noisy(data, "histogram", epsilon, 0, "level")
    dp_s, _ = best_of(RUNS, lambda: dp_release(hist, "l2"))
    common.reset_peak_memory()
    new_s, counts = best_of(RUNS, lambda: release(cum))
    new_peak = common.peak_memory_gib()
    inputs = families(cum, np.asarray(counts))
    phases = [cumulative.solve_family_certified(n, c, np.cumsum(p)).phases for n, p, c in inputs]
    row = {
        "tree": data.name,
        "eps": epsilon,
        "cells": cum.noisy.size,
        "dp_s": dp_s,
        "new_s": new_s,
        "new_peak": new_peak,
        "phases": max(phases, default=0),
        "engine": "unit paths" if data.truth.shape[1] <= cumulative.DENSE_SIZES else "primal-dual",
        "old": None,
    }
    if old_timeout is not None:
        old = run_old(cum, inputs, old_timeout)
        if old is None:
            row["old"] = "timeout"
            return row
        old_s, old_costs, old_peak = old
        paired_s = new_s
        if old_s < QUICK_S:  # quick: old and new in turn in this process (the load varies)
            module = old_module()
            for _ in range(RUNS):
                old_s = min(old_s, best_of(1, lambda: solve_old(module, cum, inputs))[0])
                paired_s = min(paired_s, best_of(1, lambda: release(cum))[0])
        same = old_costs == family_costs(cumulative.cumulative_family, inputs)
        row["old"] = (old_s, paired_s, same)
    return row


def old_cells(row: dict, timeout: float) -> tuple[str, str, str]:
    if row["old"] is None:
        return "not run", "", ""
    if row["old"] == "timeout":
        return f"> {timeout:.0f} s", "", ""
    old_s, paired_s, same = row["old"]
    return f"{old_s:.3f}", f"{old_s / paired_s:.1f}", "yes" if same else "NO"


def main() -> int:
    parser = common.argument_parser(__doc__)
    parser.add_argument(
        "--sizes", nargs="+", type=int, default=[7, 100, 400, 1_000, 5_000, 20_000, 50_000]
    )
    parser.add_argument("--groups", type=int, default=300_000)
    parser.add_argument(
        "--epsilons", nargs="+", type=Fraction, default=[Fraction(1), Fraction(1, 10)]
    )
    parser.add_argument("--old-timeout", type=float, default=60.0)
    args = parser.parse_args()
    load = common.load_averages()
    started = time.perf_counter()
    rows = []
    for i, epsilon in enumerate(args.epsilons):
        timed_out = i > 0  # the old solver at the first eps only
        for sizes in args.sizes:
            data = heavy_tailed(sizes, args.groups)
            row = compare(data, None if timed_out else args.old_timeout, epsilon)
            timed_out = timed_out or row["old"] == "timeout"
            rows.append(row)
            print(row, f"({time.perf_counter() - started:.0f} s)", flush=True)
    small = [compare(data, args.old_timeout) for data in (calm(), spine([10, 10, 10], 30))]
    for row in small:
        print(row, flush=True)
    lines = [
        "## Group sizes: cumulative (M_c) post-processing time as N grows",
        "",
        f"Command: `{common.command_line('python')}`  ",
        f"{common.machine_line()}; load average at start {load} (shared machine; ratios compare runs in the same process).  ",
        f"Wall time {time.perf_counter() - started:.0f} s. Level faithfulness, one trial per row.",
        "",
        f"Heavy-tailed synthetic tree (root -> 4 -> 28 leaves, {args.groups:,} groups, sizes 1..N",
        "with probability ~ 1/size^2). `dp s` and `cumulative s`: best of 3 in-process runs of",
        "`dp_release` and `cumulative_release` on their own noisy measurements of the same truth.",
        "`phases`: the most primal-dual phases (or unit paths, for N <= 24) any family needed.",
        "`peak GiB`: the process's peak resident memory during the cumulative runs (Python, numpy,",
        f"scipy and pandas included). `old s`: the previous solver (`{OLD_COMMIT}`) on the very",
        "families the new one solved: one run in a child process stopped at the timeout (then",
        f"larger N are not tried); where it took < {QUICK_S:.0f} s, {RUNS} more runs alternating with",
        "the new solver's in this process (best of each). `same optima`: every family's",
        "objective equal, old vs new; `old / new` divides by the new solver's best run of those.",
        "",
        "| tree | eps | cells | dp s | cumulative s | cumulative / dp | phases | peak GiB | old s | old / new | same optima |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows + small:
        old_s, ratio, same = old_cells(row, args.old_timeout)
        lines.append(
            f"| {row['tree']} | {row['eps']} | {row['cells']:,} | {row['dp_s']:.3f} | {row['new_s']:.3f} | "
            f"{row['new_s'] / row['dp_s']:.2f} | {row['phases']} ({row['engine']}) | "
            f"{row['new_peak']:.2f} | {old_s} | {ratio} | {same} |"
        )
    out = common.RESULTS_DIR / "cumulative_scaling.md"
    common.write_report(out, lines, announce=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
