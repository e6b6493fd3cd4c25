"""A session's start: a fresh process's first Spark session, and a whole small release, with
the JVM class archive beside the jars (``engine.class_archive``) and without it.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_session_start.py [--rounds 3] [--work DIR]

Two commands, each in a fresh process, alternately with ``CENSUSDP_CLASS_ARCHIVE=off`` (the
baseline, measured in the same invocation) and with the archive ``scripts/setup.sh`` recorded:

- ``session``: ``spark_session`` in local[2], then a first Delta table written and read back
  (what every command pays before its own work);
- ``release``: ``censusdp topdown --config conf/ri_2010_demo.toml`` on the real RI 2010 blocks
  of one county (Bristol, 44001), a fixed secret: a whole small release, its JVM's start
  included.

Reported: each command's median wall time of ``--rounds`` runs each way and the ratio of the
medians (archive / without). Writes benchmarks/results/session_start.md.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common as common
from _topdown_runs import censusdp_topdown

from censusdp_spark.engine.class_archive import ARCHIVE_ENV, archive_file
from censusdp_spark.engine.jars import delta_jars

RESULTS = common.RESULTS_DIR / "session_start.md"
COUNTY = "44001"
FIRST_TABLE = """
import sys
from censusdp_spark.engine.session import spark_session
spark = spark_session("bench-session-start", "local[2]")
spark.range(1000).write.format("delta").save(sys.argv[1])
assert spark.read.format("delta").load(sys.argv[1]).count() == 1000
spark.stop()
"""


def session_s(work: Path) -> float:
    """A fresh process's session, first Delta write and read: its wall time."""
    table = work / "first_table"
    shutil.rmtree(table, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", FIRST_TABLE, str(table)],
        check=True,
        cwd=common.ROOT,
        env={**os.environ, "PYTHONPATH": str(common.ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def release_s(work: Path, source: Path, secret: Path) -> float:
    """``censusdp topdown`` of the RI demo on one county: its wall time."""
    out = work / "release"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(work / "release.private", ignore_errors=True)
    args = ["--config", "conf/ri_2010_demo.toml", "--input", str(source), "--output", str(out),
            "--secret-file", str(secret), "--master", "local[2]"]  # fmt: skip
    return censusdp_topdown(args, work)


def county_blocks(work: Path) -> Path:
    """The real RI 2010 blocks of one county, with the header."""
    lines = (common.ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()
    path = work / f"ri_{COUNTY}_blocks.csv"
    path.write_text("\n".join([lines[0], *(x for x in lines[1:] if x.startswith(COUNTY))]) + "\n")
    return path


def report(rows: dict[str, dict[str, list[float]]], rounds: int) -> list[str]:
    lines = [
        "## A session's start: the JVM class archive",
        "",
        common.spark_run_note(),
        "",
        "Each command in a fresh process, alternately without the class archive"
        " (`CENSUSDP_CLASS_ARCHIVE=off`, the baseline) and with the one `scripts/setup.sh`"
        f" records beside the jars, {rounds} runs each way; medians. `session`: a local[2]"
        " session, a first Delta table written and read back. `release`: `censusdp topdown`"
        f" with `conf/ri_2010_demo.toml` on the real RI 2010 blocks of county {COUNTY}.",
        "",
        "| command | without the archive s | with it s | ratio (with / without) | runs without | runs with |",
        "|---|---|---|---|---|---|",
    ]
    for name, walls in rows.items():
        off, on = statistics.median(walls["off"]), statistics.median(walls["on"])
        shown = {k: ", ".join(f"{x:.1f}" for x in v) for k, v in walls.items()}
        lines.append(
            f"| {name} | {off:.1f} | {on:.1f} | {on / off:.2f}× | {shown['off']} | {shown['on']} |"
        )
    return lines


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    common.work_option(parser, "session_start")
    common.results_option(parser, RESULTS)
    args = parser.parse_args()
    if archive_file(delta_jars()) is None:
        raise SystemExit("no class archive beside the jars: run scripts/setup.sh first")
    args.work.mkdir(parents=True, exist_ok=True)
    source = county_blocks(args.work)
    secret = common.write_secret(args.work / "secret.hex", common.secret_hex("session start"))
    rows: dict[str, dict[str, list[float]]] = {
        "session": {"off": [], "on": []},
        "release": {"off": [], "on": []},
    }
    for _ in range(args.rounds):
        for archive in (False, True):
            key = "on" if archive else "off"
            os.environ[ARCHIVE_ENV] = "" if archive else "off"  # "": the one beside the jars
            rows["session"][key].append(session_s(args.work))
            rows["release"][key].append(release_s(args.work, source, secret))
            print(json.dumps({k: v[key][-1] for k, v in rows.items()} | {"archive": archive}))
    common.write_report(args.results, report(rows, args.rounds), announce=True)


if __name__ == "__main__":
    main()
