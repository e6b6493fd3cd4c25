"""Progress of long stages, for a person watching a run: at most one line every ``interval``
seconds (``CENSUSDP_PROGRESS_SECONDS``, default 30; 0 turns it off) with the tasks done out of
the total of each running Spark stage, through the ``censusdp`` logger beside the stage lines.

It reads Spark's own task counts only (the status tracker in classic mode, the progress
messages of a Spark Connect server), never anything about the data, and prints nothing while
no stage runs, so a short run or a CI log gets no extra lines.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from censusdp_spark.engine.session import is_connect

log = logging.getLogger("censusdp")

PROGRESS_ENV = "CENSUSDP_PROGRESS_SECONDS"
DEFAULT_INTERVAL_S = 30.0


@dataclass(frozen=True)
class StageProgress:
    stage: int
    done: int
    tasks: int


def progress_line(stages: Sequence[StageProgress], seconds: float) -> str:
    """``progress (1 m 30 s): stage 12 340/800 tasks, stage 13 0/200 tasks``."""
    minutes, secs = divmod(int(seconds), 60)
    when = f"{minutes} m {secs} s" if minutes else f"{secs} s"
    parts = ", ".join(f"stage {s.stage} {s.done}/{s.tasks} tasks" for s in stages)
    return f"progress ({when}): {parts}"


def interval_from_env() -> float:
    raw = os.environ.get(PROGRESS_ENV, "")
    try:
        return float(raw) if raw.strip() else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S


class _Throttle:
    """Logs a line of running stages at most once per ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.started = time.monotonic()
        self.last = self.started

    def offer(self, stages: Sequence[StageProgress]) -> None:
        now = time.monotonic()
        if stages and now - self.last >= self.interval:
            self.last = now
            log.info("%s", progress_line(stages, now - self.started))


def _tracked_stages(spark: SparkSession) -> list[StageProgress]:
    tracker = spark.sparkContext.statusTracker()
    stages = []
    for sid in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(sid)
        if info is not None:
            stages.append(StageProgress(sid, info.numCompletedTasks, info.numTasks))
    return stages


def _connect_stages(stages: Iterable[Any] | None) -> list[StageProgress]:
    return [
        StageProgress(s.stage_id, s.num_completed_tasks, s.num_tasks)
        for s in stages or ()
        if not s.done
    ]


@contextmanager
def reporting_progress(spark: SparkSession, interval: float | None = None) -> Iterator[None]:
    """Report the running stages' task counts while the block runs (see the module)."""
    seconds = interval_from_env() if interval is None else interval
    if seconds <= 0:
        yield
        return
    throttle = _Throttle(seconds)
    if is_connect(spark):

        def handler(stages: Any = None, **_: Any) -> None:
            throttle.offer(_connect_stages(stages))

        spark.registerProgressHandler(handler)
        try:
            yield
        finally:
            spark.removeProgressHandler(handler)
        return
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(min(1.0, seconds)):
            throttle.offer(_tracked_stages(spark))

    thread = threading.Thread(target=poll, name="censusdp-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
