"""What a resumed TopDown run checks before it continues: the tables are as the run state says.

A killed write leaves no half table (each level is one Delta transaction) but may leave data files
no commit references; they are removed first, so that a plain-Parquet reader of the release
counts nothing Delta does not. Then every step the run state claims done is checked against its
table, in the order the steps depend on each other (measurement, the bottom-up pass from the
leaves, the estimates from the root): the first step whose table is missing or incomplete is
redone, with every step after it. Redoing the measurement redraws exactly the same noise (the
streams are keyed by the run secret), so nothing is spent twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from censusdp_spark.io import delta
from censusdp_spark.model.geography import EVERY_LEVEL, LevelSpan
from censusdp_spark.release.runner import ReleaseRun
from censusdp_spark.topdown.bottom_up import BOTTOM_UP, TOTAL_VARIANCES
from censusdp_spark.topdown.census_tables import PL94_TABLES
from censusdp_spark.topdown.config import TopDownConfig

log = logging.getLogger("censusdp")

TABLES = (
    delta.NOISY_MEASUREMENTS,
    BOTTOM_UP,
    delta.ESTIMATES,
    delta.MICRODATA,
    TOTAL_VARIANCES,
    PL94_TABLES,
)


def remove_uncommitted_files(spark: SparkSession, output: Path) -> None:
    """Every TopDown table of ``output`` without the files no Delta commit references."""
    for name in TABLES:
        removed = delta.remove_uncommitted_files(spark, output, name)
        if removed:
            log.info("resume: removed %d uncommitted file(s) from %s", len(removed), name)


def steps_in_order(config: TopDownConfig) -> list[str]:
    """The committed steps of a run, each after every step it reads."""
    names = list(config.hierarchy.names)
    bottom_up = (
        [f"bottom_up_{lv}" for lv in reversed(names)]
        if config.estimation_method == "full_information"
        else []
    )
    return ["measure", *bottom_up, *names]


def redo_unfinished_steps(
    spark: SparkSession, config: TopDownConfig, run: ReleaseRun, span: LevelSpan = EVERY_LEVEL
) -> None:
    """Redo, from the first one, the steps the run state claims done whose table is missing or
    incomplete. ``span``: the levels the release holds (a state-by-state run's, from the states
    down; a nation's assembly's, the nation and the states)."""
    output = config.run.output
    steps = steps_in_order(config)
    claimed = [s for s in steps if run.done(s)]
    if not claimed:
        return
    complete = _complete_steps(spark, config, output, claimed, span)
    first = next((s for s in claimed if s not in complete), None)
    if first is None:
        return
    log.info(
        "resume: the run state says %s is done but its table is missing or incomplete;"
        " redoing it and every step after it",
        first,
    )
    run.redo(steps[steps.index(first) :])


def _complete_steps(
    spark: SparkSession, config: TopDownConfig, output: Path, claimed: list[str], span: LevelSpan
) -> set[str]:
    """The steps of ``claimed`` whose table holds that step's rows. Each step is one Delta
    transaction (the noisy table whole, a level of ``bottom_up`` or ``estimates``), so a step
    whose rows are there at all is there whole:
    * ``measure``: noisy rows at every level of ``span`` (with bypassing, at the leaves);
    * ``bottom_up_<level>``: rows of the level;
    * ``<level>`` (estimates): rows whose counts sum to the top level's total (every level's
      estimates sum to it: the root's, or the states' in a state-by-state run), the top level
      itself with at least one row."""
    levels = span.names(config.hierarchy)
    complete: set[str] = set()
    noisy = delta.NOISY_MEASUREMENTS
    # With bypassing a level may have no measured node (the nation of a one-state run); the
    # leaves always are.
    measured = [config.hierarchy.leaf.name] if config.bypass_single_child else levels
    if delta.is_table(output, noisy) and set(measured) <= set(
        _rows_per_level(spark, output, noisy)
    ):
        complete.add("measure")
    if any(s.startswith("bottom_up_") for s in claimed) and delta.is_table(output, BOTTOM_UP):
        complete |= {f"bottom_up_{lv}" for lv in _rows_per_level(spark, output, BOTTOM_UP)}
    if delta.is_table(output, delta.ESTIMATES):
        rows = _rows_per_level(spark, output, delta.ESTIMATES, total="count")
        top = levels[0]
        if rows.get(top, (0, 0))[0] > 0:
            complete |= {lv for lv in levels if lv in rows and rows[lv][1] == rows[top][1]}
    return complete


def _rows_per_level(
    spark: SparkSession, output: Path, name: str, total: str | None = None
) -> dict[str, tuple[int, int]]:
    """``level -> (rows, sum of column total)`` of table ``name`` (0 without ``total``); a level
    without rows is absent."""
    sums = [F.sum(total).alias("total")] if total else [F.lit(0).alias("total")]
    grouped = delta.read_table(spark, output, name).groupBy("level")
    return {
        r["level"]: (int(r["rows"]), int(r["total"] or 0))
        for r in grouped.agg(F.count(F.lit(1)).alias("rows"), *sums).collect()
    }
