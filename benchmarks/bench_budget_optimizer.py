"""The budget optimizer's allocation against the 2021 production allocation: expected and
measured error of the P.L. 94-171 workload on the 2,016-cell production schema.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_budget_optimizer.py [--inputs perry,ri]
        [--secrets 6] [--work DIR]

For each input (``perry``: the shipped Perry County PPMF sample with
``conf/pl94_2020_production.toml``; ``ri``: the real RI 2010 blocks expanded to 2,016 cells by
``benchmarks/expand_pl94.py --seed 1`` on the spine of every RI 2010 block, as
``bench_production.py`` makes it), both with ``full_information``:

1. ``censusdp budget --optimize --workload pl94 --write-config`` writes the optimized config
   (its wall time is reported): the allocation of the same total rho minimising the expected
   error of P1-P4 at county, tract and block group, equal weights, from the config and the
   spine alone;
2. both configs are released with ``--secrets`` secrets each (distinct secrets: a secret is
   never spent twice), in one Spark session;
3. for every level, the measured workload error of a release is the mean over the level's
   nodes of the L1 error of each table's fields (the released estimates against the input's
   true counts), summed over P1-P4 — the quantity the optimizer's objective models as
   ``sum sqrt(2 v / pi)``; the ratio optimized / production is given with the 95% bootstrap
   interval of the ratio of means over secrets.

With ``--national DIR`` it also times the optimizer alone on ``conf/national_production.toml``
with the spine ``DIR/spine`` of every block of the nation (the folder ``censusdp generate
national --schema production --fraction 1`` writes, or a link named ``spine`` to the 16-cell
generator's ``blocks``, which lists the same blocks; the input itself is never read); ``--previous`` carries the rows of an earlier
invocation (its ``results.json``), so the national timing can be added on its own.

Writes benchmarks/results/budget_optimizer.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import _common as common
import numpy as np
from _topdown_runs import production_config, production_input

from censusdp_spark.testing.gls_reference import read_delta, true_leaf_histograms
from censusdp_spark.topdown import strategy
from censusdp_spark.topdown.config import load_topdown_config

RESULTS = common.RESULTS_DIR / "budget_optimizer.md"
METHOD = "full_information"
ALLOCATIONS = ("production", "optimized")


def secret_file(work: Path, name: str, config: Path, i: int) -> Path:
    """Secret ``i`` of a config (its text hashed in: a changed allocation is a new release,
    with secrets of its own)."""
    digest = hashlib.sha256(config.read_bytes()).hexdigest()[:16]
    path = work / f"secret_{name}_{digest}_{i}.hex"
    return common.write_secret(
        path, common.secret_hex(f"bench_budget_optimizer {name} {digest} {i}")
    )


def optimized_config(
    config: Path, work: Path, name: str, source: Path | None
) -> tuple[Path, float, str]:
    """``censusdp budget --optimize`` of ``config``: the written config, its wall time and
    its printed report."""
    out = work / f"optimized_{name}.toml"
    out.unlink(missing_ok=True)
    command = [
        str(common.CENSUSDP), "budget", "--config", str(config), "--optimize",
        "--workload", "pl94", "--write-config", str(out), "--master", "local[2]",
        *(["--input", str(source)] if source else []),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, check=True, cwd=common.ROOT, capture_output=True, text=True)
    return out, time.perf_counter() - started, done.stdout


def level_truth(
    config, leaves: np.ndarray, hist: np.ndarray
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each level's sorted geocodes and true histograms, summed from the leaves."""
    out = {}
    for level in config.hierarchy.levels:
        prefixes = np.array([g[: level.digits] for g in leaves])
        codes, index = np.unique(prefixes, return_inverse=True)
        sums = np.zeros((codes.size, hist.shape[1]), dtype=np.int64)
        np.add.at(sums, index, hist)
        out[level.name] = (codes, sums)
    return out


def measured_errors(
    release: Path, truth: dict, workload: strategy.Workload
) -> dict[str, dict[str, float]]:
    """Level -> table -> the mean over the level's nodes (every node of the spine, as the
    manifest counts them) of the L1 error of the table's fields."""
    estimates = read_delta(release / "estimates")
    nodes = json.loads((release / "manifest.json").read_text())["nodes"]
    out: dict[str, dict[str, float]] = {}
    for level, (true_codes, true) in truth.items():
        rows = estimates[estimates["level"] == level]
        codes = np.union1d(true_codes, rows["geocode"].to_numpy().astype(str))
        error = np.zeros((codes.size, true.shape[1]), dtype=np.int64)
        at = np.searchsorted(codes, rows["geocode"].to_numpy().astype(str))
        np.add.at(error, (at, rows["cell"].to_numpy()), rows["count"].to_numpy())
        error[np.searchsorted(codes, true_codes)] -= true
        out[level] = {
            t.name: float(np.abs(error @ t.fields).sum() / nodes[level]) for t in workload.tables
        }
    return out


def ratio_interval(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """95% bootstrap interval of ``mean(num) / mean(den)``, secrets resampled independently
    for the two allocations (their secrets differ)."""
    rng = np.random.default_rng(0)
    a = num[rng.integers(0, len(num), (common.RESAMPLES, len(num)))].mean(axis=1)
    b = den[rng.integers(0, len(den), (common.RESAMPLES, len(den)))].mean(axis=1)
    low, high = np.percentile(a / b, [2.5, 97.5])
    return float(low), float(high)


def run_input(
    name: str, secrets: int, work: Path, spark, keep: bool, progress: Callable[[dict], None]
) -> dict:
    """Both allocations' releases of ``name`` with ``secrets`` secrets each; ``progress`` gets
    the results so far after every secret. ``keep``: a production release already in ``work``
    is scored again, not rerun (its allocation, secret and code path are the same)."""
    from censusdp_spark.api import run_topdown

    production = production_config(METHOD, work, name)
    source = production_input(name, work)
    optimized, optimize_s, printed = optimized_config(production, work, name, source)
    configs = {"production": production, "optimized": optimized}
    runs: dict[str, list[dict]] = {a: [] for a in ALLOCATIONS}
    loaded = load_topdown_config(production)
    if source is not None:
        from dataclasses import replace

        assert loaded.input is not None
        loaded = replace(loaded, input=replace(loaded.input, path=source))
    workload = strategy.load_workload("pl94", loaded)
    truth = level_truth(loaded, *true_leaf_histograms(loaded))

    def results() -> dict:
        nodes = json.loads((work / f"{name}_production_0" / "manifest.json").read_text())["nodes"]
        expected = {}
        for allocation in ALLOCATIONS:
            config = load_topdown_config(configs[allocation])
            model = strategy.ErrorModel(config, nodes, workload)
            rows = model.errors(strategy.Allocation.of(config))
            expected[allocation] = {f"{r.level}|{r.table}": r.l1 for r in rows}
        return {
            "input": name, "optimize_s": optimize_s, "optimizer_output": printed, "runs": runs,
            "expected": expected, "nodes": nodes, "levels": list(loaded.hierarchy.names),
            "workload_levels": list(workload.levels), "tables": [t.name for t in workload.tables],
        }  # fmt: skip

    for i in range(secrets):
        for allocation in ALLOCATIONS:
            out = work / f"{name}_{allocation}_{i}"
            manifest = out / "manifest.json"
            if keep and allocation == "production" and manifest.exists():
                wall = float(json.loads(manifest.read_text())["elapsed_s"])
            else:
                started = time.perf_counter()
                run_topdown(
                    configs[allocation], spark=spark, input=source, output=out,
                    secret_file=secret_file(work, name, configs[allocation], i), overwrite=True,
                )  # fmt: skip
                wall = time.perf_counter() - started
            errors = measured_errors(out, truth, workload)
            runs[allocation].append({"secret": i, "wall_s": wall, "errors": errors})
            print(
                json.dumps({"input": name, "allocation": allocation, **runs[allocation][-1]}),
                flush=True,
            )
        progress(results())
    return results()


NATIONAL = common.ROOT / "conf" / "national_production.toml"


def national_timing(folder: Path) -> dict:
    """``censusdp budget --optimize`` of the national production config on ``folder``'s spine:
    its wall time and what it printed."""
    command = [
        str(common.CENSUSDP), "budget", "--config", str(NATIONAL),
        "--optimize", "--input", str(folder / "persons"), "--master", "local[2]",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, check=True, cwd=common.ROOT, capture_output=True, text=True)
    return {"wall_s": time.perf_counter() - started, "printed": done.stdout}


def national_lines(national: dict) -> list[str]:
    printed = national["printed"].splitlines()
    spine = next(line for line in printed if line.startswith("spine "))
    objective = next(line for line in printed if line.startswith("weighted workload error"))
    table = [line for line in printed if line[:1].isalpha() and "  " in line and "x" in line[-6:]]
    return [
        "### The nation: the optimizer alone",
        "",
        f"`censusdp budget --config conf/national_production.toml --optimize` on the spine of "
        f"every block of the nation: {national['wall_s']:.0f} s wall on 2 cores (Spark's start "
        f"and the spine's read included; load average {national.get('load', float('nan')):.1f} "
        f"while it ran). It printed `{spine}` and `{objective}`; per level and table:",
        "",
        "```text",
        *[line for line in printed if line.startswith("level ")],
        *table,
        "```",
        "",
    ]


def report(results: list[dict], command: str, national: dict | None = None) -> str:
    lines = [
        "## The budget optimizer against the 2021 production allocation (P.L. 94-171 workload)",
        "",
        common.command_note(command, master="local[2]")
        + ". `censusdp budget --optimize --workload pl94` (P1-P4 at "
        "county, tract and block group, equal weights) re-allocates the production config's "
        "total rho over levels and queries from the config and the spine alone; both configs "
        "are then released with `full_information`, each with its own secrets. *Expected*: the "
        "optimizer's own model (linear estimator on a tree with each level's mean fan-out). "
        "*Measured*: the released estimates against the input's true counts, the mean over a "
        "level's nodes of the L1 error of every field of P1-P4, summed over the tables; the "
        "interval is the 95% bootstrap interval of the ratio of the mean errors over secrets.",
        "",
    ]
    for res in results:
        prod, opt = res["runs"]["production"], res["runs"]["optimized"]
        lines += [
            f"### {res['input']}: {len(prod)} secrets per allocation; the optimizer took "
            f"{res['optimize_s']:.0f} s (Spark start and spine read included)",
            "",
            "| level | workload weight | expected, production | expected, optimized "
            "| expected ratio | measured, production | measured, optimized | measured ratio "
            "(95% interval) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for level in res["levels"]:
            exp = [
                sum(res["expected"][a][f"{level}|{t}"] for t in res["tables"]) for a in ALLOCATIONS
            ]
            measured = [
                np.array([sum(r["errors"][level].values()) for r in runs]) for runs in (prod, opt)
            ]
            low, high = ratio_interval(measured[1], measured[0])
            weight = "1" if level in res["workload_levels"] else "-"
            lines.append(
                f"| {level} | {weight} | {exp[0]:.1f} | {exp[1]:.1f} | {exp[1] / exp[0]:.2f}× | "
                f"{measured[0].mean():.1f} | {measured[1].mean():.1f} | "
                f"{measured[1].mean() / measured[0].mean():.2f}× ({low:.2f}-{high:.2f}) |"
            )
        workload_levels = res["workload_levels"]
        exp_total = [
            sum(res["expected"][a][f"{lv}|{t}"] for lv in workload_levels for t in res["tables"])
            for a in ALLOCATIONS
        ]
        measured_total = [
            np.array([sum(sum(r["errors"][lv].values()) for lv in workload_levels) for r in runs])
            for runs in (prod, opt)
        ]
        low, high = ratio_interval(measured_total[1], measured_total[0])
        lines += [
            f"| **workload** | | {exp_total[0]:.1f} | {exp_total[1]:.1f} | "
            f"**{exp_total[1] / exp_total[0]:.2f}×** | {measured_total[0].mean():.1f} | "
            f"{measured_total[1].mean():.1f} | "
            f"**{measured_total[1].mean() / measured_total[0].mean():.2f}×** ({low:.2f}-{high:.2f}) |",
            "",
            "Wall time per release (s), production / optimized: "
            + ", ".join(
                f"{p['wall_s']:.0f} / {o['wall_s']:.0f}" for p, o in zip(prod, opt, strict=True)
            )
            + ".",
            "",
        ]
    if national is not None:
        lines += national_lines(national)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--inputs", default="perry,ri")
    parser.add_argument("--secrets", type=int, default=6)
    common.work_option(parser, "budget_optimizer")
    common.results_option(parser, RESULTS)
    parser.add_argument("--national", type=Path, help="a generate national folder to time on")
    parser.add_argument("--previous", type=Path, help="results.json of an earlier invocation")
    parser.add_argument(
        "--keep-production",
        action="store_true",
        help="score the production releases already in --work instead of running them again",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["CENSUSDP_SECRET_REGISTRY"] = str(args.work / "secret_registry")
    command = common.command_line()
    results = [] if args.previous is None else json.loads(args.previous.read_text())
    names = [name for name in args.inputs.split(",") if name]
    if names:
        from censusdp_spark.engine.session import spark_session

        spark = spark_session("bench-budget-optimizer", "local[2]")
        for name in names:
            done = [r for r in results if r["input"] != name]

            def progress(partial: dict, done: list[dict] = done) -> None:
                (args.work / "results.json").write_text(json.dumps([*done, partial]))
                common.write_report(args.results, report([*done, partial], command))

            results = [
                *done,
                run_input(name, args.secrets, args.work, spark, args.keep_production, progress),
            ]
        spark.stop()
    national = None
    if args.national is not None:
        national = {**national_timing(args.national), "load": os.getloadavg()[0]}
        (args.work / "national.json").write_text(json.dumps(national))
    common.write_report(args.results, report(results, command, national))


if __name__ == "__main__":
    main()
