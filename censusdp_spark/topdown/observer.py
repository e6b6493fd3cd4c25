"""What a TopDown run tells an observer as it goes: each committed step, on the driver, and
each estimation task as it starts, on an executor.

The default observer, ``QUIET``, does nothing. Tests pass their own to ``run_topdown`` to stop
the run where a crash would (a killed driver after a step, a killed Python worker in a task)
and prove that ``--resume`` and Spark's retries lose nothing; the production code reads no
environment variable and holds no test branch.
"""

from __future__ import annotations


class RunObserver:
    """Hooks of a TopDown run; every one does nothing unless a subclass says otherwise.

    An observer is pickled into the estimation tasks, so it holds only picklable state."""

    def step_committed(self, step: str) -> None:
        """On the driver, once ``step`` (``bottom_up_<level>`` or ``<level>``) is committed."""

    def task_started(self) -> None:
        """On an executor, as a task of a level's estimation starts."""


QUIET = RunObserver()
"""The observer of every run nobody watches."""
