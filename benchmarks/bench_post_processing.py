"""Post-processing published noisy measurements: a production release exported in the Census
NMF layout and estimated again from that file, against the original run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_post_processing.py [--inputs perry ri]
        [--work DIR]

For each input (``perry``: the shipped Perry County PPMF sample; ``ri``: the real RI 2010 blocks
expanded to 2,016 cells, as ``bench_production.py`` makes them), three processes, each
``censusdp`` on this worktree's code:

1. the release: ``censusdp topdown`` with ``conf/pl94_2020_production.toml``
   (``full_information``) and the fixed secret of index 0;
2. ``censusdp export-nmf`` of that release to the NMF layout;
3. ``censusdp topdown --noisy-measurements NMF --noisy-format census_nmf`` to another folder.

Reported: whether the second release's ``noisy_measurements``, ``estimates``, ``microdata`` and
``bottom_up`` equal the first's row for row (Spark ``exceptAll`` both ways), and the times from
the manifests: the original's estimation stages (``bottom_up_*`` and ``estimate_*``) against the
post-processing's reading of the file and the same stages (``read_and_validate``,
``copy_measurements``, ``bottom_up_*``, ``estimate_*``), their ratio (the goal: at most 1.2),
and each process's wall time. Writes benchmarks/results/post_processing.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import _common as common
from _topdown_runs import censusdp_topdown, production_config, production_input, production_secret

from censusdp_spark.engine.session import spark_session

RESULTS = common.RESULTS_DIR / "post_processing.md"
TABLES = ("noisy_measurements", "estimates", "microdata", "bottom_up")
METHOD = "full_information"


def estimation_s(timings: dict[str, float]) -> float:
    """The seconds of the estimation stages: the bottom-up pass and every level's estimates."""
    return sum(v for k, v in timings.items() if k.startswith(("bottom_up_", "estimate_")))


def export_nmf(release: Path, nmf: Path, config: Path) -> float:
    """``censusdp export-nmf`` in a child process: its wall time."""
    started = time.perf_counter()
    subprocess.run(
        [str(common.CENSUSDP), "export-nmf", "--release", str(release), "--output", str(nmf),
         "--config", str(config), "--master", "local[2]"],
        check=True, cwd=common.ROOT, env={**os.environ, "PYTHONPATH": str(common.ROOT)},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - started


def same_rows(spark, a: Path, b: Path, table: str) -> bool:
    left = spark.read.format("delta").load(str(a / table))
    right = spark.read.format("delta").load(str(b / table))
    return left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def run_input(name: str, work: Path) -> dict:
    """The three processes of ``name`` and what they show."""
    config = production_config(METHOD, work, name)
    source = production_input(name, work)
    secret = common.write_secret(work / "secret0.hex", production_secret(0))
    original, nmf, again = work / f"{name}_release", work / f"{name}_nmf", work / f"{name}_again"
    shutil.rmtree(nmf, ignore_errors=True)  # export-nmf writes a new folder
    release_wall = censusdp_topdown(
        ["--config", str(config), *(["--input", str(source)] if source else []),
         "--output", str(original), "--overwrite", "--secret-file", str(secret),
         "--reuse-secret", "--master", "local[2]"],
        work,
    )  # fmt: skip
    export_wall = export_nmf(original, nmf, config)
    again_wall = censusdp_topdown(
        ["--config", str(config), "--output", str(again), "--overwrite",
         "--noisy-measurements", str(nmf), "--noisy-format", "census_nmf", "--master", "local[2]"],
        work,
    )  # fmt: skip
    first = json.loads((original / "manifest.json").read_text())
    second = json.loads((again / "manifest.json").read_text())
    spark = spark_session("bench-post-processing", "local[2]")
    equal = {t: same_rows(spark, original, again, t) for t in TABLES}
    reading = sum(
        second["timings_s"].get(k, 0.0) for k in ("read_and_validate", "copy_measurements")
    )
    return {
        "input": name,
        "blocks": first["nodes"]["block"],
        "equal": equal,
        "release_wall_s": release_wall,
        "export_wall_s": export_wall,
        "again_wall_s": again_wall,
        "original_estimation_s": estimation_s(first["timings_s"]),
        "again_reading_s": reading,
        "again_estimation_s": estimation_s(second["timings_s"]),
        "load": common.load_now(),
    }


def report(rows: list[dict]) -> list[str]:
    lines = [
        "## TopDown: post-processing published noisy measurements",
        "",
        common.spark_run_note(),
        "",
        "Each input's production release (`conf/pl94_2020_production.toml`, `full_information`,"
        " fixed secret 0), exported with `censusdp export-nmf` to the Census NMF layout, then"
        " estimated again with `censusdp topdown --noisy-measurements NMF --noisy-format"
        " census_nmf`: the tables compared row for row, and the manifests' stage times."
        " Baseline: the original run's estimation stages (`bottom_up_*`, `estimate_*`) in the same"
        " invocation; the post-processing's cost is its reading of the file (`read_and_validate`,"
        " `copy_measurements`) plus the same stages.",
        "",
        "| input | blocks | tables equal | original estimation s | file read s |"
        " estimation from the file s | ratio (goal <= 1.2) | walls: release / export / again s |"
        " load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        equal = (
            "all 4"
            if all(r["equal"].values())
            else ", ".join(f"{t} {'yes' if ok else 'NO'}" for t, ok in r["equal"].items())
        )
        cost = r["again_reading_s"] + r["again_estimation_s"]
        lines.append(
            f"| {r['input']} | {r['blocks']:,} | {equal} | {r['original_estimation_s']:.1f} |"
            f" {r['again_reading_s']:.1f} | {r['again_estimation_s']:.1f} |"
            f" {cost / r['original_estimation_s']:.2f}× | {r['release_wall_s']:.0f} /"
            f" {r['export_wall_s']:.0f} / {r['again_wall_s']:.0f} | {r['load']} |"
        )
    return lines


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--inputs", nargs="+", default=["perry", "ri"], choices=["perry", "ri"])
    common.work_option(parser, "post_processing")
    common.results_option(parser, RESULTS)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.inputs:
        row = run_input(name, args.work)
        print(json.dumps(row), flush=True)
        rows.append(row)
    common.write_report(args.results, report(rows), announce=True)


if __name__ == "__main__":
    main()
