"""Faults on purpose: a TopDown run whose driver or a Python worker dies where a crash would,
to prove that ``--resume`` and Spark's task retries lose nothing.

The faults are observers (``topdown.observer``) passed into the run; the production code holds
no test branch. From a shell (each a process of its own, as a real crash needs)::

    python -m censusdp_spark.testing.faults --kill-driver-after tract topdown --config ...
    python -m censusdp_spark.testing.faults --kill-worker-once /tmp/marker topdown --config ...

``--kill-driver-after STEP`` ends the driver at once (exit 17, no clean-up) once ``STEP``
(``<level>`` or ``bottom_up_<level>``) is committed; ``--kill-worker-once MARKER`` ends the
first Python worker that starts an estimation task while ``MARKER`` does not exist (exit 23),
creating it, so Spark's retry of that task runs undisturbed. In a test's own process,
``FailAfter(STEP)`` raises ``InjectedFault`` once ``STEP`` is committed instead: the tables and
the run state are left as a killed driver leaves them.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from censusdp_spark.cli import build_parser, run_command
from censusdp_spark.topdown.observer import RunObserver

DRIVER_KILLED = 17
"""The exit code of a driver a fault ended."""
WORKER_KILLED = 23
"""The exit code of a Python worker a fault ended."""


@dataclass(frozen=True)
class KillDriverAfter(RunObserver):
    """Ends the driver abruptly once ``step`` is committed, as a killed one would end."""

    step: str

    def step_committed(self, step: str) -> None:
        if step == self.step:
            os._exit(DRIVER_KILLED)


class InjectedFault(RuntimeError):
    """What ``FailAfter`` raises: a run stopped on purpose, in this process."""


@dataclass(frozen=True)
class FailAfter(RunObserver):
    """Raises ``InjectedFault`` once ``step`` is committed: the run stops there and leaves its
    tables and run state as a killed driver would, in the caller's own process (the run lock
    is released, so a ``--resume`` can follow at once)."""

    step: str

    def step_committed(self, step: str) -> None:
        if step == self.step:
            raise InjectedFault(f"stopped on purpose after step {step}")


@dataclass(frozen=True)
class KillWorkerOnce(RunObserver):
    """Ends the first Python worker that starts an estimation task while ``marker`` is
    missing, creating ``marker`` first (the file is what makes it once across processes)."""

    marker: Path

    def task_started(self) -> None:
        if not self.marker.exists():
            self.marker.touch()
            os._exit(WORKER_KILLED)


def main(argv: list[str] | None = None) -> int:
    """``censusdp``'s command line, run with one fault injected."""
    parser = argparse.ArgumentParser(
        prog="python -m censusdp_spark.testing.faults",
        description="Run a censusdp TopDown command with one fault injected.",
    )
    fault = parser.add_mutually_exclusive_group(required=True)
    fault.add_argument("--kill-driver-after", metavar="STEP")
    fault.add_argument("--kill-worker-once", type=Path, metavar="MARKER")
    chosen, command = parser.parse_known_args(argv)
    args = build_parser().parse_args(command)
    if chosen.kill_driver_after:
        args.observer = KillDriverAfter(chosen.kill_driver_after)
    else:
        args.observer = KillWorkerOnce(chosen.kill_worker_once)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
