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

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from censusdp_spark.group_sizes.config import load_pgsr_config
from censusdp_spark.topdown.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "conf" / "national_demo.toml"
PGSR_CONFIG = ROOT / "conf" / "pgsr_national.toml"
MEMORY_ESTIMATE = re.compile(r"^\[censusdp\] memory estimate: ~([0-9.]+) (GiB|MiB)")
STAGE = re.compile(r"^\[censusdp\] (\w+): ([0-9.]+) s(?: \((\d+) nodes\))?")


def _tree_rss_bytes(*root_pids: int) -> int:
    """Sum of RSS over ``root_pids`` and all their descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pid, ppid, pages = int(entry.name), int(fields[1]), int(fields[21])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
        rss[pid] = pages * os.sysconf("SC_PAGE_SIZE")
    total, stack = 0, list(root_pids)
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def _input(fraction: float, work: Path) -> Path:
    folder = work / f"national_{fraction:g}"
    if not (folder / "metadata.json").exists():
        subprocess.run(
            [sys.executable, "-m", "censusdp_spark.cli", "generate", "national", "--seed", "2020",
             "--fraction", str(fraction), "--output", str(folder), "--overwrite"],
            check=True,
        )  # fmt: skip
    return folder


def method_config(method: str, work: Path) -> Path:
    """``conf/national_demo.toml`` with ``[estimation] method`` set (relative paths in it resolve
    against the current directory, so the copy may live anywhere)."""
    if method == load_config(CONFIG).estimation_method:
        return CONFIG
    text = re.sub(r"(?m)^method = .*\n", "", CONFIG.read_text())
    if "\n[estimation]\n" not in text:
        raise ValueError(f"{CONFIG} has no [estimation] table to set the method in")
    variant = work / f"national_demo_{method}.toml"
    setting = f'\n[estimation]\nmethod = "{method}"\n'
    variant.write_text(text.replace("\n[estimation]\n", setting, 1))
    return variant


def run_job(
    job: str, blocks: Path, output: Path, config: Path = CONFIG, master: str = "local[2]"
) -> dict:
    job_args = (
        ["topdown", "--config", str(config)]
        if job == "topdown"
        else ["pgsr", "--config", str(PGSR_CONFIG), "--mechanism", "dp"]
    )
    command = [
        sys.executable, "-m", "censusdp_spark.cli", *job_args,
        "--input", str(blocks), "--output", str(output), "--overwrite", "--master", master,
    ]  # fmt: skip
    result = measure_job(command, job)
    if job == "pgsr":
        manifest = json.loads((output / "manifest.json").read_text())
        result.update(stages=manifest["timings_s"], nodes=manifest["nodes"])
    return result


def measure_job(
    command: list[str],
    job: str = "topdown",
    env: dict[str, str] | None = None,
    also_measured: tuple[int, ...] = (),
) -> dict:
    """Run a release's ``command``; its wall time, stages and nodes (its ``[censusdp]`` lines)
    and the peak memory of its process tree plus the trees of ``also_measured`` (a standalone
    cluster's daemons, whose executors are their children)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_bytes(proc.pid, *also_measured))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stages: dict[str, float] = {}
    nodes: dict[str, int] = {}
    estimate_gib = float("nan")
    tail: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        tail = [*tail[-40:], line]
        estimate = MEMORY_ESTIMATE.match(line)
        if estimate:
            estimate_gib = float(estimate[1]) / (1 if estimate[2] == "GiB" else 1024)
        match = STAGE.match(line)
        if match:
            stages[match[1]] = float(match[2])
            if match[3] and match[1].startswith("estimate_"):
                nodes[match[1].removeprefix("estimate_")] = int(match[3])
    code = proc.wait()
    done.set()
    sampler.join()
    if code != 0:
        raise RuntimeError(
            f"{job} failed with exit code {code}: {' '.join(command)}\n" + "".join(tail)
        )
    return {
        "wall_s": time.perf_counter() - started,
        "stages": stages,
        "nodes": nodes,
        "peak_gib": peak / 2**30,
        "memory_estimate_gib": estimate_gib,
    }


def noised_cells(job: str, nodes: dict[str, int]) -> int:
    if job == "pgsr":
        return sum(nodes.values()) * load_pgsr_config(PGSR_CONFIG).groups.max_size
    config = load_config(CONFIG)
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
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M')}, local[2] on "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end). Inputs: "
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fractions", default="0.01,0.1,0.3,1")
    parser.add_argument("--work", type=Path, default=Path("/tmp/censusdp_national"))
    parser.add_argument("--job", choices=["topdown", "pgsr"], default="topdown")
    parser.add_argument("--methods", default="topdown", help="TopDown estimation methods to run")
    parser.add_argument("--results", type=Path, help="default benchmarks/results/<job>.md")
    parser.add_argument("--previous", type=Path, help="JSON rows printed by an earlier run")
    args = parser.parse_args()
    name = "national.md" if args.job == "topdown" else "pgsr_national.md"
    results = args.results or ROOT / "benchmarks" / "results" / name
    rows = []
    if args.previous is not None:
        rows = [
            json.loads(ln) for ln in args.previous.read_text().splitlines() if ln.startswith("{")
        ]
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
        results.write_text(
            markdown(args.job, rows, " ".join(["benchmarks/bench_national.py", *sys.argv[1:]]))
        )


if __name__ == "__main__":
    main()
