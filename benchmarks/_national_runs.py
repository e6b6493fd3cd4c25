"""Release jobs at national scale, each a child process measured from outside: its wall time,
its stages and nodes (the job's ``[censusdp] <stage>: <s> s`` progress lines), its own memory
estimate, and the peak resident memory of its whole process tree (driver JVM, Python workers;
a standalone cluster's daemons too), sampled every 0.5 s from /proc. ``bench_national.py`` and
``bench_national_production.py`` run their releases here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import ROOT

from censusdp_spark.topdown.config import load_topdown_config

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


def method_config(method: str, work: Path) -> Path:
    """``conf/national_demo.toml`` with ``[estimation] method`` set (relative paths in it resolve
    against the current directory, so the copy may live anywhere)."""
    if method == load_topdown_config(CONFIG).estimation_method:
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
