"""The 2020 production release (2,016 cells) on the SYNTHETIC national persons, beside the 16-cell
demo release of the same blocks, at several fractions of the nation.

    .venv/bin/python benchmarks/bench_national_production.py [--fractions 0.01,0.03,0.1]
        [--work DIR] [--previous ROWS.jsonl] [--master local[2]]

For every fraction it generates the input if ``DIR/production_<F>`` does not hold it yet
(``censusdp generate national --schema production --seed 2020 --fraction F``: 16-cell blocks,
persons in the PPMF layout and the block spine, the same blocks), then runs, each as a child
process in ``local[2]`` (or ``--master``):

* ``censusdp topdown --config conf/national_demo.toml`` with ``full_information`` on
  ``DIR/blocks`` (16 cells: the baseline measured in the same invocation), and
* ``censusdp topdown --config conf/national_production.toml --input DIR/persons`` (2,016 cells,
  11 queries a level, 2,603 noisy cells a node, ``full_information``, P1-P5),

and records per stage the wall time (the job's ``[censusdp] <stage>: <s> s`` lines), the peak
resident memory of the whole process tree, the bytes on disk of every table, the nodes and noised
cells, and noised cells per second in the measurement, beside the exact sampler's own rate on
the same mix of variances (one core, times the two cores of ``local[2]``). The figure that compares across machines
is the ratio of the production cost per block to the 16-cell one of the same fraction.

The projection to the whole nation (8,132,968 blocks) fits each stage's time as ``a + b *
blocks`` by least squares over the measured fractions (at least two) and sums the stages; the
table gives each stage's fit.

Writes benchmarks/results/national_production.md and prints one JSON row per run (``--previous``
takes them back, so a long curve can be finished in several invocations).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import _common as common
import numpy as np
import pandas as pd
from _national_runs import measure_job, method_config, run_job

from censusdp_spark.engine.families import NOISE_GROUP_DEPTH
from censusdp_spark.engine.session import LocalMode
from censusdp_spark.model.geography import LevelShape
from censusdp_spark.model.memory import parse_memory
from censusdp_spark.topdown.capacity import estimate_memory, noised_cells
from censusdp_spark.topdown.config import load_topdown_config

PRODUCTION = common.ROOT / "conf" / "national_production.toml"
NATION_BLOCKS = 8_132_968
METHOD = "full_information"


def production_input(fraction: float, work: Path) -> Path:
    folder = work / f"production_{fraction:g}"
    if not (folder / "metadata.json").exists():
        subprocess.run(
            [sys.executable, "-m", "censusdp_spark.cli", "generate", "national", "--schema",
             "production", "--seed", "2020", "--fraction", str(fraction), "--output", str(folder),
             "--overwrite"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return folder


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def table_bytes(release: Path) -> dict[str, int]:
    """Bytes on disk of every table (folder) of a release."""
    return {d.name: folder_bytes(d) for d in sorted(release.iterdir()) if d.is_dir()}


def run(schema: str, folder: Path, work: Path, fraction: float, master: str) -> dict:
    if schema == "production":
        config, data = PRODUCTION, folder / "persons"
    else:
        config, data = method_config(METHOD, work), folder / "blocks"
    release = work / f"release_{schema}_{fraction:g}"
    result = run_job("topdown", data, release, config, master)
    meta = json.loads((folder / "metadata.json").read_text())
    return {
        "sampler_rate": sampler_rate(config, result["nodes"]),
        "fraction": fraction,
        "schema": schema,
        "states": len(meta["states"]),
        "blocks": result["nodes"]["block"],
        "persons": meta["tallies"]["generated"]["population"],
        "cells": noised_cells(load_topdown_config(config), result["nodes"]),
        "tables": table_bytes(release),
        "input_bytes": folder_bytes(data),
        **result,
    }


def spine_shapes(folder: Path) -> list[LevelShape]:
    """The geography of the input's spine (every block), level by level, in pandas."""
    hierarchy = load_topdown_config(PRODUCTION).hierarchy
    files = sorted((folder / "spine").glob("*.parquet"))
    leaves = pd.concat(pd.read_parquet(f, columns=["GEOID"]) for f in files)["GEOID"]
    shapes = []
    for i, level in enumerate(hierarchy.levels):
        nodes = leaves.str[: level.digits].drop_duplicates()
        parent = nodes.str[: hierarchy.levels[max(i - 1, 0)].digits]
        group = nodes.str[: hierarchy.levels[max(i - NOISE_GROUP_DEPTH, 0)].digits]
        family, noise = parent.value_counts().max(), group.value_counts().max()
        shapes.append(LevelShape(level.name, len(nodes), int(family), int(noise)))
    return shapes


def memory_estimate_gib(folder: Path, master: str) -> float:
    """The production job's own memory estimate (``topdown.capacity``) for ``local[N]``."""
    cores = int(master.removeprefix("local[").removesuffix("]"))
    heap = os.environ.get("CENSUSDP_DRIVER_MEMORY", "6g")
    local = LocalMode(cores, parse_memory(heap, "CENSUSDP_DRIVER_MEMORY"))
    return (
        estimate_memory(load_topdown_config(PRODUCTION), spine_shapes(folder), local).total / 2**30
    )


RESUMED_TABLES = ("noisy_measurements", "bottom_up", "estimates", "microdata", "pl94_tables")
RESUME_RESULTS = common.RESULTS_DIR / "national_production_resume.md"


def resume_check(fraction: float, work: Path, master: str) -> dict:
    """Kill the production run of ``fraction`` after its tract estimates
    (``censusdp_spark.testing.faults --kill-driver-after tract``: the driver exits at once, as a
    killed one would), resume it, and compare every table with the uninterrupted release of
    the same secret in ``work`` (``--reuse-secret``: the same measurements again, on purpose),
    made first if missing."""
    reference, secret = reference_release(fraction, work, master)
    release = work / f"release_resumed_{fraction:g}"
    command = [
        "topdown", "--config", str(PRODUCTION),
        "--input", str(work / f"production_{fraction:g}" / "persons"), "--output", str(release),
        "--secret-file", str(secret), "--reuse-secret", "--master", master,
    ]  # fmt: skip
    fault = [sys.executable, "-m", "censusdp_spark.testing.faults", "--kill-driver-after", "tract"]
    cli = [sys.executable, "-m", "censusdp_spark.cli"]
    started = time.perf_counter()
    killed = subprocess.run([*fault, *command, "--overwrite"], capture_output=True, text=True)
    killed_s = time.perf_counter() - started
    if killed.returncode != 17:
        raise RuntimeError(
            f"the killed run ended with {killed.returncode}: {killed.stderr[-2000:]}"
        )
    started = time.perf_counter()
    resumed = subprocess.run([*cli, *command, "--resume"], capture_output=True, text=True)
    if resumed.returncode != 0:
        raise RuntimeError(f"the resumed run failed: {resumed.stderr[-2000:]}")
    resumed_s = time.perf_counter() - started
    manifest = json.loads((reference / "manifest.json").read_text())
    return {
        "fraction": fraction,
        "blocks": manifest["nodes"]["block"],
        "reference_run_s": manifest["elapsed_s"],
        "killed_after": "estimate_tract",
        "killed_run_s": killed_s,
        "resumed_run_s": resumed_s,
        **compare_tables(reference, release),
    }


def reference_release(fraction: float, work: Path, master: str) -> tuple[Path, Path]:
    """The uninterrupted local release of ``fraction`` in ``work`` (made if missing) and a file
    holding its run secret, for a second run of the same secret (``--reuse-secret``)."""
    reference = work / f"release_production_{fraction:g}"
    if not (reference / "manifest.json").exists():
        run("production", production_input(fraction, work), work, fraction, master)
    run_secret = (reference.parent / f"{reference.name}.private" / "run_secret").read_text()
    return reference, common.write_secret(work / f"secret_{fraction:g}.hex", run_secret)


def compare_tables(reference: Path, release: Path) -> dict:
    """Rows of every table of ``reference`` and which tables of ``release`` differ (with the
    rows ``release`` lacks, by level)."""
    from censusdp_spark.engine.session import spark_session

    spark = spark_session("bench-compare-releases", "local[2]")
    rows, differing, by_level = {}, [], {}
    for table in RESUMED_TABLES:
        left = spark.read.format("delta").load(str(reference / table))
        right = spark.read.format("delta").load(str(release / table))
        rows[table] = left.count()
        only_left = left.exceptAll(right)
        if only_left.count() or right.exceptAll(left).count():
            differing.append(table)
            if "level" in left.columns:  # where the difference starts
                counts = only_left.groupBy("level").count().collect()
                by_level[table] = {r["level"]: r["count"] for r in counts}
    spark.stop()
    return {"rows": rows, "differing": differing, "differing_rows_by_level": by_level}


CLUSTER_RESULTS = common.RESULTS_DIR / "national_production_cluster.md"
CLUSTER_WORKERS, WORKER_MEMORY, EXECUTOR_MEMORY, DRIVER_MEMORY = 2, "8g", "7g", "4g"


def cluster_check(fraction: float, work: Path, master: str, local_peak_gib: float) -> dict:
    """The production release of ``fraction`` by ``spark-submit`` on a standalone cluster on
    127.0.0.1 (a master and ``CLUSTER_WORKERS`` one-core workers), with the secret of the local
    release in ``work``: its time and peak memory beside the local run's, and every table
    compared with the local one's."""
    # The cluster's launcher is the tests' own (tests.helpers.cluster), which is not installed:
    # without PYTHONPATH=$PWD the repository's root goes on the path for it.
    sys.path.insert(0, str(common.ROOT))
    from censusdp_spark.engine.session import delta_jars
    from tests.helpers.cluster import cluster_env, on_path, standalone_cluster, submit_command

    reference, secret = reference_release(fraction, work, master)
    release = work / f"release_cluster_{fraction:g}"
    logs = work / f"cluster_{fraction:g}_logs"
    logs.mkdir(exist_ok=True)
    args = [
        "--config", str(PRODUCTION), "--input", str(work / f"production_{fraction:g}" / "persons"),
        "--output", str(release), "--secret-file", str(secret), "--reuse-secret", "--overwrite",
    ]  # fmt: skip
    options = ("--driver-memory", DRIVER_MEMORY, "--executor-memory", EXECUTOR_MEMORY)
    with standalone_cluster(logs, CLUSTER_WORKERS, 1, WORKER_MEMORY) as cluster:
        jars = [str(j) for j in delta_jars()]
        script = str(common.ROOT / "jobs" / "topdown.py")
        command = on_path(submit_command(cluster.url, jars, script, *args, options=options))
        result = measure_job(command, env=cluster_env(), also_measured=cluster.pids)
    # spark-submit's driver logs the stages elsewhere: the manifest has them
    manifest = json.loads((reference / "manifest.json").read_text())
    return {
        "fraction": fraction,
        "blocks": manifest["nodes"]["block"],
        "local_run_s": manifest["elapsed_s"],
        "local_peak_gib": local_peak_gib,
        "cluster_run_s": result["wall_s"],
        "cluster_peak_gib": result["peak_gib"],
        "cluster_stages": json.loads((release / "manifest.json").read_text())["timings_s"],
        "local_stages": manifest.get("timings_s", {}),
        **compare_tables(reference, release),
    }


def resume_markdown(check: dict, command: str) -> str:
    verdict = "identical" if not check["differing"] else f"DIFFERENT: {check['differing']}"
    tables = ", ".join(f"`{t}` ({n:,} rows)" for t, n in check["rows"].items())
    return "\n".join([
        "## Killed and resumed: the production release at national scale",
        "",
        common.command_note(command, master=check.get("master", ""))
        + f". The {check['fraction']:g} fraction of the SYNTHETIC "
        f"national persons ({check['blocks']:,} blocks), `conf/national_production.toml`: the "
        "uninterrupted release, then a run of the same secret whose driver exits right after "
        "the tract estimates are written (`censusdp_spark.testing.faults --kill-driver-after tract`, exit "
        "17, as a killed driver), then `--resume` of that run.",
        "",
        "| uninterrupted (s) | killed after tract estimates (s) | resumed (s) "
        "| killed + resumed / uninterrupted | tables, resumed vs uninterrupted |",
        "|---|---|---|---|---|",
        f"| {check['reference_run_s']:.0f} | {check['killed_run_s']:.0f} | "
        f"{check['resumed_run_s']:.0f} | "
        f"{(check['killed_run_s'] + check['resumed_run_s']) / check['reference_run_s']:.2f}× | "
        f"{verdict}: {tables} |",
        "",
        *[
            f"Rows of the uninterrupted `{table}` the resumed one lacks, by level: "
            + ", ".join(f"{level} {n:,}" for level, n in sorted(counts.items()))
            + ".\n"
            for table, counts in check.get("differing_rows_by_level", {}).items()
        ],
        *(["Rows of the tract level or above were written before the kill, by a run of the "
           "same secret: where they differ, two runs of one secret differ, not the resume."]
          if check["differing"] else []),
    ])  # fmt: skip


def cluster_markdown(check: dict, command: str) -> str:
    verdict = "identical" if not check["differing"] else f"DIFFERENT: {check['differing']}"
    tables = ", ".join(f"`{t}` ({n:,} rows)" for t, n in check["rows"].items())
    stages = [s for s in check["cluster_stages"] if s in check["local_stages"]]
    return "\n".join([
        "## On a cluster: the production release at national scale",
        "",
        common.command_note(command)
        + f". The {check['fraction']:g} fraction of the SYNTHETIC national persons "
        f"({check['blocks']:,} blocks), `conf/national_production.toml`: the local release "
        f"({check.get('master', '')}), then `spark-submit jobs/topdown.py` of the same secret "
        f"(`--reuse-secret`) on a Spark standalone cluster on 127.0.0.1: a master and "
        f"{CLUSTER_WORKERS} workers of one core each (worker memory {WORKER_MEMORY}, "
        f"`--executor-memory {EXECUTOR_MEMORY} --driver-memory {DRIVER_MEMORY}`), the "
        "cluster's driver in client mode. Both share this machine's two cores, so the ratio "
        "is the cost of the cluster's plumbing (executors in their own JVMs, shuffles over "
        "the loopback network), not a speed-up.",
        "",
        "| local wall (s) | cluster wall (s) | cluster / local | peak RSS local / cluster, "
        "whole process trees with the daemons (GiB) | tables, cluster vs local |",
        "|---|---|---|---|---|",
        f"| {check['local_run_s']:.0f} | {check['cluster_run_s']:.0f} | "
        f"{check['cluster_run_s'] / check['local_run_s']:.2f}× | "
        f"{check['local_peak_gib']:.1f} / {check['cluster_peak_gib']:.1f} | {verdict}: {tables} |",
        "",
        "Wall time per stage (s):",
        "",
        "| stage | local | cluster | cluster / local |",
        "|---|---|---|---|",
        *[
            f"| {s} | {check['local_stages'][s]:.1f} | {check['cluster_stages'][s]:.1f} | "
            f"{check['cluster_stages'][s] / max(check['local_stages'][s], 1e-9):.2f}× |"
            for s in stages
        ],
        "",
    ])  # fmt: skip


def linear_fit(rows: list[dict], stage: str) -> tuple[float, float]:
    """``(a, b)`` of ``seconds = a + b * blocks`` by least squares over ``rows``."""
    x = np.array([r["blocks"] for r in rows], dtype=np.float64)
    y = np.array([r["stages"].get(stage, 0.0) for r in rows], dtype=np.float64)
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


SAMPLER_DRAWS = 20_000_000


def sampler_rate(config: Path, nodes: dict[str, int]) -> float:
    """Draws per second of the exact sampler alone on one core, on the run's own mix of
    variances: ``SAMPLER_DRAWS`` draws split over (level, query) in proportion to the run's
    noised cells, one keyed stream, as the measurement draws them."""
    from censusdp_spark.privacy import discrete_gaussian, keyed_rng

    loaded = load_topdown_config(config)
    mix = {
        (level, q.name): (n * q.size, loaded.budget.sigma2_for(level, q.name))
        for level, n in nodes.items()
        for q in loaded.queries[level]
    }
    total = sum(cells for cells, _ in mix.values())
    rng = keyed_rng(bytes(32), "bench")
    started = time.perf_counter()
    drawn = 0
    for cells, sigma2 in mix.values():
        size = max(1, round(SAMPLER_DRAWS * cells / total))
        discrete_gaussian(sigma2, size, rng)
        drawn += size
    return drawn / (time.perf_counter() - started)


def markdown(rows: list[dict], command: str) -> str:
    prod = [r for r in rows if r["schema"] == "production"]
    demo = {r["fraction"]: r for r in rows if r["schema"] == "demo"}
    lines = [
        "## The 2020 production release (2,016 cells) on the SYNTHETIC national persons",
        "",
        common.command_note(command, master=prod[0]["master"] if prod else "", load=True)
        + ". Inputs: "
        "`censusdp generate national --schema production --seed 2020 --fraction F` (SYNTHETIC "
        "persons under the real 2020 tracts; fractions pick whole states). Production: "
        "`conf/national_production.toml` (2021 production strategy, `full_information`, state "
        "populations invariant, P1-P5); 16 cells: `conf/national_demo.toml` with "
        "`full_information` on the same blocks, in the same invocation.",
        "",
        "| fraction | states | blocks | persons | production wall (s) | 16-cell wall (s) "
        "| production ms/block | 16-cell ms/block | cost per block, production / 16-cell "
        "| peak RSS production / 16-cell (GiB) | production memory estimate (GiB) | noised cells | noised cells/s in measure "
        "| vs the exact sampler alone on 2 cores, same draws |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in prod:
        d = demo.get(r["fraction"])
        per_block = 1000 * r["wall_s"] / r["blocks"]
        base = 1000 * d["wall_s"] / d["blocks"] if d else float("nan")
        lines.append(
            f"| {r['fraction']:g} | {r['states']} | {r['blocks']:,} | {r['persons']:,} | "
            f"{r['wall_s']:.0f} | {d['wall_s'] if d else float('nan'):.0f} | {per_block:.2f} | "
            f"{base:.2f} | {per_block / base:.1f}× | {r['peak_gib']:.1f} / "
            f"{d['peak_gib'] if d else float('nan'):.1f} | "
            f"{r['memory_estimate_gib']:.1f} | {r['cells']:,} | "
            f"{r['cells'] / r['stages'].get('measure', float('nan')):,.0f} | "
            f"{r['cells'] / r['stages'].get('measure', float('nan')) / (2 * r['sampler_rate']):.2f}× |"
        )
    lines += ["", "Bytes on disk (MiB) of the input and of every table:", ""]
    names = sorted({t for r in prod for t in r["tables"]})
    lines += [
        "| fraction | input | " + " | ".join(names) + " | release / noisy_measurements |",
        "|---|---|" + "---|" * len(names) + "---|",
    ]
    for r in prod:
        total = sum(r["tables"].values())
        noisy = r["tables"].get("noisy_measurements", 0)
        lines.append(
            f"| {r['fraction']:g} | {_mib(r['input_bytes'])} | "
            + " | ".join(_mib(r["tables"].get(n, 0)) for n in names)
            + f" | {total / noisy if noisy else float('nan'):.2f}× |"
        )
    stages = list(prod[-1]["stages"]) if prod else []
    lines += [
        "",
        "Wall time per stage (s), production, with the per-stage linear fit `a + b * blocks` "
        "over the measured fractions and its value at the nation's 8,132,968 blocks:",
        "",
        "| stage | " + " | ".join(f"{r['fraction']:g}" for r in prod) + " | a (s) "
        "| b (ms/block) | nation (h) |",
        "|---|" + "---|" * len(prod) + "---|---|---|",
    ]
    total_hours = 0.0
    for stage in stages:
        row = " | ".join(f"{r['stages'].get(stage, float('nan')):.1f}" for r in prod)
        if len(prod) >= 2:
            a, b = linear_fit(prod, stage)
            hours = (a + b * NATION_BLOCKS) / 3600
            total_hours += hours
            lines.append(f"| {stage} | {row} | {a:.1f} | {1000 * b:.3f} | {hours:.2f} |")
        else:
            lines.append(f"| {stage} | {row} | - | - | - |")
    if len(prod) >= 2:
        lines += ["", f"Projected production run for the nation on this machine: {total_hours:.1f} h "
                  "(sum of the per-stage fits)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--fractions", default="0.01,0.03,0.1")
    common.work_option(parser, "national_production")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--schemas", default="demo,production", help="which releases to run")
    common.results_option(parser, common.RESULTS_DIR / "national_production.md")
    parser.add_argument("--previous", type=Path, help="JSON rows printed by an earlier run")
    parser.add_argument(
        "--resume-check",
        type=float,
        help="after the runs, kill this fraction's production run mid-way, resume it and "
        "compare the tables with its uninterrupted release in --work (made first if missing); "
        "writes benchmarks/results/national_production_resume.md",
    )
    parser.add_argument(
        "--cluster-check",
        type=float,
        help="after the runs, release this fraction again with the same secret on a Spark "
        "standalone cluster on 127.0.0.1 and compare its time and tables with the local one; "
        "writes benchmarks/results/national_production_cluster.md",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = common.previous_rows(args.previous)
    for r in rows:  # rows of versions that did not log the estimate
        if r["schema"] == "production" and math.isnan(r.get("memory_estimate_gib", math.nan)):
            folder = args.work / f"production_{r['fraction']:g}"
            r["memory_estimate_gib"] = memory_estimate_gib(folder, r["master"])
    command = common.command_line()
    for fraction in (float(f) for f in args.fractions.split(",") if f):
        folder = production_input(fraction, args.work)
        for schema in args.schemas.split(","):
            row = {**run(schema, folder, args.work, fraction, args.master), "master": args.master}
            rows = [r for r in rows if (r["fraction"], r["schema"]) != (fraction, schema)]
            rows = sorted([*rows, row], key=lambda r: (r["fraction"], r["schema"]))
            print(json.dumps(row), flush=True)
            common.write_report(args.results, markdown(rows, command))
    if rows:  # also for rows carried in alone
        common.write_report(args.results, markdown(rows, command))
    if args.resume_check is not None:
        check = {**resume_check(args.resume_check, args.work, args.master), "master": args.master}
        print(json.dumps({"resume_check": check}), flush=True)
        common.write_report(RESUME_RESULTS, resume_markdown(check, command))
    if args.cluster_check is not None:
        local = [
            r for r in rows if (r["fraction"], r["schema"]) == (args.cluster_check, "production")
        ]
        local_peak = local[0]["peak_gib"] if local else float("nan")
        check = cluster_check(args.cluster_check, args.work, args.master, local_peak)
        check["master"] = args.master
        print(json.dumps({"cluster_check": check}), flush=True)
        common.write_report(CLUSTER_RESULTS, cluster_markdown(check, command))


if __name__ == "__main__":
    main()
