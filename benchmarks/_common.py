"""What the benchmark scripts share: the repository's paths, the command line and its parser,
the note at the head of every report (the command, date, machine, load and versions), the report
writer, the benchmarks' fixed secrets, the bootstrap's size, and the probes of a process's
memory.

A script imports it as its sibling (``import _common as common``): Python puts a script's own
folder first on ``sys.path``, so every script runs as its docstring says, with or without
``PYTHONPATH``; so do the modules the scripts share (``_topdown_runs``, ``_national_runs``,
``_group_size_trees``). Nothing here is a figure: a report's numbers stay in its script.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import queue
import shlex
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
"""Where the scripts write their reports (``benchmarks/collect.py`` assembles BENCHMARKS.md)."""
CENSUSDP = ROOT / ".venv" / "bin" / "censusdp"
"""The command line of the worktree's own environment, as ``scripts/setup.sh`` installs it."""

RESAMPLES = 10_000
"""Bootstrap resamples of the secrets behind an interval (seeded: the report is reproducible)."""

T = TypeVar("T")


# --- the command line -----------------------------------------------------------------------


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's parser; ``--help`` prints the script's docstring as written (its usage, what
    it measures and what it writes)."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def command_line(prefix: str = "") -> str:
    """This invocation as a report quotes it: ``prefix`` (the environment and interpreter, e.g.
    ``PYTHONPATH=$PWD .venv/bin/python``), the script's path from the repository root and its
    arguments, shell-quoted."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return " ".join([*([prefix] if prefix else []), str(shown), *map(shlex.quote, sys.argv[1:])])


def work_option(parser: argparse.ArgumentParser, name: str) -> None:
    """``--work DIR``: where a script keeps what its runs need and make (inputs, configs,
    releases, secrets and their registry), so a later invocation can reuse them."""
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(f"/tmp/censusdp_{name}"),
        help="the folder of the runs' inputs, releases and secrets (default: %(default)s)",
    )


def results_option(
    parser: argparse.ArgumentParser, default: Path | None, *, shown: str = "%(default)s"
) -> None:
    """``--results FILE``: the report a script writes (its saved figures go beside it)."""
    parser.add_argument(
        "--results", type=Path, default=default, help=f"the report to write (default: {shown})"
    )


def previous_rows(path: Path | None) -> list[dict]:
    """The JSON rows an earlier invocation printed (its lines that start with ``{``), so a long
    curve can be finished in several invocations; none without ``path``."""
    if path is None:
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


# --- the note at the head of a report -------------------------------------------------------


def timestamp() -> str:
    """Now, to the minute, in UTC."""
    return f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"


def load_now() -> str:
    """The one-minute load average (the machine is shared: a reader weighs the times by it)."""
    return f"{os.getloadavg()[0]:.1f}"


def load_averages() -> str:
    """The one-, five- and fifteen-minute load averages."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def versions(packages: Sequence[str] = ()) -> str:
    """``Python X.Y.Z`` and each installed package's version."""
    named = [f"{name} {importlib.metadata.version(name)}" for name in packages]
    return ", ".join([f"Python {platform.python_version()}", *named])


def cpu_model() -> str:
    """The processor's model name (Linux), else what ``platform`` knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def command_note(
    commands: str | Sequence[str],
    *,
    master: str | None = None,
    arch: bool = False,
    extra: Sequence[str] = (),
    load: bool = False,
    packages: Sequence[str] | None = None,
) -> str:
    """``Command: `...` (facts)``, the line a report opens with: the command(s) that made it
    (several joined by "; then "), then, in brackets, the date, the architecture (``arch``),
    the Spark master and the CPUs, ``extra`` facts of the run, the load average at the end
    (``load``), and the versions (``packages``: ``()`` for Python alone)."""
    quoted = [commands] if isinstance(commands, str) else list(commands)
    facts = [timestamp()]
    if arch:
        facts.append(platform.machine())
    cpus = f"{os.cpu_count()} CPUs"
    facts.append(f"{master} on {cpus}" if master else cpus)
    facts += extra
    if load:
        facts.append(f"load average {load_now()} at the end")
    if packages is not None:
        facts.append(versions(packages))
    return f"Command: {'; then '.join(f'`{c}`' for c in quoted)} ({', '.join(facts)})"


def spark_run_note() -> str:
    """The opening line of a report of Spark runs in local[2] started by this invocation: its
    command, the load at the end and the Spark and Delta versions."""
    return command_note(
        command_line("PYTHONPATH=$PWD .venv/bin/python"),
        master="local[2]",
        load=True,
        packages=["pyspark", "delta-spark"],
    )


def machine_line(packages: Sequence[str] = ()) -> str:
    """``Date: ... Machine: ...``: the date, the architecture, the CPUs and the versions, for
    the reports that give the load at the start on the same line (it follows, after ``;``)."""
    return (
        f"Date: {timestamp()}. Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{versions(packages)}"
    )


# --- the report -----------------------------------------------------------------------------


def write_report(path: Path, text: str | Sequence[str], *, announce: bool = False) -> str:
    """Write a report (its text, or its lines) to ``path``, its folder made if missing and the
    text ended by a newline, and with ``announce`` say so; return the text written."""
    written = text if isinstance(text, str) else "\n".join(text)
    if not written.endswith("\n"):
        written += "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(written)
    if announce:
        print(f"wrote {path}")
    return written


# --- secrets --------------------------------------------------------------------------------


def secret_hex(label: str) -> str:
    """A benchmark's fixed secret, named by ``label``: a rerun draws the same noise. Fixed
    secrets are for measurements only; their releases are marked not for release and bound in
    a registry of the benchmark's own."""
    return hashlib.sha256(label.encode()).hexdigest()


def write_secret(path: Path, hex_secret: str) -> Path:
    """A secret file as the runner accepts it: the hex secret, readable by its owner alone."""
    path.write_text(hex_secret)
    path.chmod(0o600)
    return path


# --- processes and memory -------------------------------------------------------------------


def in_fresh_process(work: Callable[[], T], timeout: float | None = None) -> T | None:
    """``work()`` in a forked child process, so its peak memory is its own: its result, its
    exception raised again here, or None if it ran past ``timeout`` seconds (it is killed)."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child() -> None:
        try:
            results.put((True, work()))
        except BaseException as error:  # reported by the parent, not lost with the child
            results.put((False, error))

    process = context.Process(target=child)
    process.start()
    try:
        done, value = results.get(timeout=timeout)
    except queue.Empty:
        process.kill()
        process.join()
        return None
    process.join()
    if not done:
        raise value
    return value


def reset_peak_memory() -> None:
    """Start this process's peak resident memory afresh (Linux: ``clear_refs`` 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def memory_baseline() -> int:
    """Collect garbage, start the peak resident memory afresh and return the resident memory
    now: what a call's peak (``memory_status("VmHWM:")``) is measured from."""
    gc.collect()
    reset_peak_memory()
    return memory_status("VmRSS:")


def memory_status(key: str) -> int:
    """Bytes of one memory line of ``/proc/self/status`` (``VmRSS:``, ``VmHWM:``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_memory_gib() -> float:
    """This process's peak resident memory since the last reset, GiB (``VmHWM``)."""
    return memory_status("VmHWM:") / 2**30
