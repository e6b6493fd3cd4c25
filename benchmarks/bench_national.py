"""TopDown or the group-size release on the SYNTHETIC national input at several fractions: how
time and memory scale with the input.

    .venv/bin/python benchmarks/bench_national.py [--job topdown|pgsr] [--fractions 0.01,0.1,0.3,1]
        [--methods topdown,full_information] [--work DIR] [--previous ROWS.jsonl]

``--methods`` runs TopDown once per estimation method on each fraction (the config with its
``[estimation] method`` replaced, written to ``DIR``), so the methods' times and memory are
ratios measured in the same invocation.
(``--previous`` takes the JSON rows an earlier invocation printed, so a long curve can be
finished in several invocations; every row records its own command's run.)

For every fraction it generates the input if ``DIR/national_<F>`` does not hold it yet
(``censusdp generate national --seed 2020 --fraction F``), then runs
``censusdp topdown --config conf/national_demo.toml --master local[2]`` (or ``censusdp pgsr
--config conf/pgsr_national.toml --mechanism dp``) as a child process and records:

* wall time per stage, from the job's ``[censusdp] <stage>: <s> s`` progress lines (TopDown) or
  its manifest's ``timings_s`` (PGSR);
* peak memory: the largest sum of resident set sizes over the whole process tree (driver JVM,
  Python workers), sampled every 0.5 s from /proc;
* noised cells per second of the measurement stage (every node's every marginal cell; for
  PGSR every node's N sizes);
* cost per block relative to the smallest fraction of the same run (1.0 = linear scaling).

Writes benchmarks/results/national.md (pgsr_national.md). Never a unit test: these are
figures, not assertions.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import _common as common
from _national_runs import CONFIG, PGSR_CONFIG, method_config, run_job

from censusdp_spark.group_sizes.config import load_group_sizes_config
from censusdp_spark.topdown.config import load_topdown_config


def _input(fraction: float, work: Path) -> Path:
    folder = work / f"national_{fraction:g}"
    if not (folder / "metadata.json").exists():
        subprocess.run(
            [sys.executable, "-m", "censusdp_spark.cli", "generate", "national", "--seed", "2020",
             "--fraction", str(fraction), "--output", str(folder), "--overwrite"],
            check=True,
        )  # fmt: skip
    return folder


def noised_cells(job: str, nodes: dict[str, int]) -> int:
    if job == "pgsr":
        return sum(nodes.values()) * load_group_sizes_config(PGSR_CONFIG).groups.max_size
    config = load_topdown_config(CONFIG)
    return sum(count * sum(q.size for q in config.queries[level]) for level, count in nodes.items())


def markdown(job: str, rows: list[dict], command: str) -> str:
    base = rows[0]
    base_per_block = base["wall_s"] / base["blocks"]
    stage_names = list(rows[-1]["stages"])
    title, config = (
        ("National scale: TopDown", "`conf/national_demo.toml` (16 cells, production "
         "person rho, state populations invariant)")
        if job == "topdown"
        else ("National scale: the group-size release (M_H^dp)", "`conf/pgsr_national.toml` "
              "(households by size 1..7+, eps = 1, l2, level faithfulness)")
    )  # fmt: skip
    lines = [
        f"## {title} on the SYNTHETIC national input",
        "",
        common.command_note(command, master="local[2]", load=True) + ". Inputs: "
        "`censusdp generate national --seed 2020 --fraction F` (SYNTHETIC blocks under the real "
        f"2020 tracts; fractions pick whole states). Config: {config}.",
        "",
        "| fraction | method | states | blocks | wall (s) | vs topdown, same fraction "
        "| s per 1k blocks | vs linear from the first row | peak RSS, whole tree (GiB) "
        "| noised cells/s in measure |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_block = r["wall_s"] / r["blocks"]
        same = [b for b in rows if b["fraction"] == r["fraction"] and _method(b) == "topdown"]
        versus = f"{r['wall_s'] / same[0]['wall_s']:.2f}×" if same else "-"
        lines.append(
            f"| {r['fraction']:g} | {_method(r)} | {r['states']} | {r['blocks']:,} | "
            f"{r['wall_s']:.0f} | {versus} | {1000 * per_block:.2f} | "
            f"{per_block / base_per_block:.2f}× | {r['peak_gib']:.1f} | "
            f"{r['cells'] / r['stages'].get('measure', float('nan')):,.0f} |"
        )
    lines += [
        "",
        "Wall time per stage (s):",
        "",
        "| fraction | method | " + " | ".join(stage_names) + " |",
        "|---|---|" + "---|" * len(stage_names),
    ]
    for r in rows:
        lines.append(
            f"| {r['fraction']:g} | {_method(r)} | "
            + " | ".join(f"{r['stages'].get(s, float('nan')):.1f}" for s in stage_names)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _method(row: dict) -> str:
    """A row's estimation method (rows recorded before ``--methods`` existed ran TopDown's)."""
    return row.get("method", "topdown")


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--fractions", default="0.01,0.1,0.3,1")
    common.work_option(parser, "national")
    parser.add_argument("--job", choices=["topdown", "pgsr"], default="topdown")
    parser.add_argument("--methods", default="topdown", help="TopDown estimation methods to run")
    common.results_option(parser, None, shown="benchmarks/results/<job>.md")
    parser.add_argument("--previous", type=Path, help="JSON rows printed by an earlier run")
    args = parser.parse_args()
    name = "national.md" if args.job == "topdown" else "pgsr_national.md"
    results = args.results or common.RESULTS_DIR / name
    rows = common.previous_rows(args.previous)
    methods = args.methods.split(",") if args.job == "topdown" else ["dp"]
    for fraction, method in itertools.product(
        (float(f) for f in args.fractions.split(",")), methods
    ):
        folder = _input(fraction, args.work)
        meta = json.loads((folder / "metadata.json").read_text())
        release = args.work / f"{args.job}_release_{fraction:g}"
        config = method_config(method, args.work) if args.job == "topdown" else CONFIG
        result = run_job(args.job, folder / "blocks", release, config)
        row = {
            "fraction": fraction,
            "method": method,
            "states": len(meta["states"]),
            "blocks": result["nodes"]["block"],
            "cells": noised_cells(args.job, result["nodes"]),
            **result,
        }
        rows = sorted([*rows, row], key=lambda r: (r["fraction"], _method(r) != "topdown"))
        print(json.dumps(row), flush=True)
        common.write_report(results, markdown(args.job, rows, common.command_line()))


if __name__ == "__main__":
    main()
