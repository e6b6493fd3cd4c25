"""The command line as a user meets it: the installed ``censusdp`` in a subprocess of its own,
a run stopped on purpose, and the error lines it leaves on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def censusdp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The installed ``censusdp`` run from the repository root (its JVM a process of its own),
    with ``env`` added to this process's environment."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [str(Path(sys.executable).parent / "censusdp"), *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def censusdp_with_fault(fault: list[str], *args: str) -> subprocess.CompletedProcess:
    """``censusdp *args`` in a subprocess of its own with one fault injected
    (``censusdp_spark.testing.faults``: ``--kill-driver-after STEP`` or ``--kill-worker-once
    MARKER``)."""
    return subprocess.run(
        [sys.executable, "-m", "censusdp_spark.testing.faults", *fault, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


def censusdp_stopped_after(step: str, *args: str) -> None:
    """``censusdp *args`` in this process, stopped once ``step`` is committed
    (``testing.faults.FailAfter``): its tables and run state are left as a driver killed there
    leaves them, for a ``--resume`` to take up. Where the test is about the process itself (a
    kill, its exit code), ``censusdp_with_fault`` runs one."""
    from censusdp_spark.cli import build_parser, run_command
    from censusdp_spark.testing.faults import FailAfter, InjectedFault

    command = build_parser().parse_args(list(args))
    command.observer = FailAfter(step)
    try:
        run_command(command)
    except InjectedFault:
        return
    raise AssertionError(f"the run ended without reaching step {step}")


def error_lines(captured: str) -> list[str]:
    """stderr without the stage lines (``[censusdp] read_and_validate: 1.2 s``)."""
    return [ln for ln in captured.strip().splitlines() if not ln.startswith("[censusdp]")]
