"""Progress lines of long stages: Spark's own task counts, throttled, nothing when off."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pandas as pd
import pytest

from censusdp_spark.engine.progress import StageProgress, progress_line, reporting_progress


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[list[str]]:
    handler = _Lines()
    log = logging.getLogger("censusdp")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler.lines
    log.removeHandler(handler)
    log.setLevel(level)


def slow_job(spark, tasks: int, seconds: float) -> int:
    def sleep(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            time.sleep(seconds)
            yield batch

    return spark.range(0, tasks, numPartitions=tasks).mapInPandas(sleep, "id long").count()


def test_a_long_stage_reports_its_tasks_done_out_of_the_total(spark, lines):
    with reporting_progress(spark, interval=0.5):
        assert slow_job(spark, 4, 1.5) == 4
    progress = [line for line in lines if line.startswith("progress (")]
    assert progress, lines
    assert any("/4 tasks" in line for line in progress), progress  # then the count's 1 task


def test_no_line_when_turned_off_or_when_the_stage_ends_first(spark, lines):
    with reporting_progress(spark, interval=0):
        slow_job(spark, 2, 0.5)
    with reporting_progress(spark, interval=60):
        slow_job(spark, 2, 0.5)
    assert not [line for line in lines if line.startswith("progress (")]


def test_the_line_names_each_running_stage_and_the_time_into_the_run():
    stages = [StageProgress(12, 340, 800), StageProgress(13, 0, 200)]
    assert progress_line(stages, 90.4) == (
        "progress (1 m 30 s): stage 12 340/800 tasks, stage 13 0/200 tasks"
    )
    assert progress_line(stages[:1], 7) == "progress (7 s): stage 12 340/800 tasks"
