"""A class-data-sharing archive of the JVM classes a release loads, beside Delta's jars: a local
session's JVM maps them from the archive instead of reading, verifying and linking them from
the jars, and starts faster (``BENCHMARKS.md``, "A session's start").

``build_class_archive(folder)`` (``scripts/setup.sh`` runs it after fetching the jars;
``censusdp jars --class-archive`` for an installed copy) starts a session in a child process with
``-XX:ArchiveClassesAtExit``, runs a small release-shaped workload (a Delta table written by
level, read, merged into; a grouped pandas function; a join and a window), stops it, and checks
that a JVM starts and answers with the archive before moving it into place: a folder never
holds a partial or unusable archive (a torn one would crash every JVM that maps it).

A session whose JVM starts in this process (local mode, or a standalone cluster's driver) maps
the archive of its jars' folder when there is one. The JVM checks the archive against its own
build and class path, and uses none of it where they differ (another Java, other jars), silently:
then the session starts as it would without one. ``$CENSUSDP_CLASS_ARCHIVE=off`` turns the
archive off; no other value is taken (a mistyped one is refused, not read as on). A session maps
only the archive beside its jars, which ``build_class_archive`` checked: a damaged archive
crashes the JVM that maps it. This module imports no Spark at import time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from censusdp_spark.engine.jars import JARS_ENV
from censusdp_spark.model.errors import SetupError

ARCHIVE_NAME = "jvm-classes.jsa"
ARCHIVE_ENV = "CENSUSDP_CLASS_ARCHIVE"
"""``off``: no session maps an archive (unset or empty: the one beside the jars, if any)."""
_DUMP_ENV = "CENSUSDP_CLASS_ARCHIVE_DUMP"
"""Set in the child process that records the archive: where its JVM writes it at exit."""
_RECORDED_ENV = "CENSUSDP_CLASS_ARCHIVE_RECORDED"
"""Set in the child process that checks a recorded archive: the one to map, not yet in place."""
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
BUILD_TIMEOUT_S = 600.0


def archive_file(jars: Sequence[Path]) -> Path | None:
    """The archive beside ``jars`` (their folder's ``ARCHIVE_NAME``), if there is one."""
    if not jars:
        return None
    path = jars[0].parent / ARCHIVE_NAME
    return path if path.is_file() else None


def java_options(jars: Sequence[Path]) -> str | None:
    """The driver JVM's options for the archive of ``jars`` (to record it, in the child process
    of ``build_class_archive``; to map it, when it is there and not turned off), or None."""
    dump = os.environ.get(_DUMP_ENV)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump} {_QUIET}"
    chosen = os.environ.get(ARCHIVE_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        raise SetupError(
            f"${ARCHIVE_ENV}={chosen!r}: the value is off (or unset: the archive is used)"
        )
    recorded = os.environ.get(_RECORDED_ENV)
    path = Path(recorded) if recorded else archive_file(jars)
    return f"-XX:SharedArchiveFile={path} {_QUIET}" if path and path.is_file() else None


def build_class_archive(folder: Path) -> Path:
    """Record the archive of the jars in ``folder`` and move it into place (replacing one
    there); a ``SetupError`` if the JVM could not record it or does not start with it (nothing
    is left behind then)."""
    folder = folder.absolute()  # the children's class path names the jars as sessions do
    final = folder / ARCHIVE_NAME
    with tempfile.TemporaryDirectory(dir=folder, prefix=".archive-") as scratch:
        recorded = Path(scratch) / ARCHIVE_NAME
        _child("record", {JARS_ENV: str(folder), _DUMP_ENV: str(recorded)})
        if not recorded.is_file():
            raise SetupError(f"the JVM wrote no class archive to {recorded}")
        _child("check", {JARS_ENV: str(folder), _RECORDED_ENV: str(recorded)})
        recorded.replace(final)
    return final


def _child(step: str, env: dict[str, str]) -> None:
    """This module's ``step`` run in a child Python with ``env`` added."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, step],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        raise SetupError(f"class archive: the {step} step failed (exit {done.returncode}): {last}")


def _workload(output: Path) -> None:
    """What a release's JVM loads, in small: Delta written by level, read, merged into; a
    grouped pandas function; a join and a window; the session stopped (the JVM then exits,
    writing the archive)."""
    import pandas as pd
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from censusdp_spark.engine.session import spark_session

    spark = spark_session("censusdp-class-archive", "local[2]")
    rows = spark.range(0, 2000).select(
        F.when(F.col("id") % 3 == 0, "block").otherwise("tract").alias("level"),
        F.format_string("%05d", "id").alias("geocode"),
        F.array(F.col("id"), F.col("id") + 1).alias("noisy"),
    )
    table = str(output / "table")
    rows.write.format("delta").partitionBy("level").save(table)
    read = spark.read.format("delta").load(table)

    def total(frame: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"level": [frame["level"].iloc[0]], "n": [len(frame)]})

    read.groupBy("level").applyInPandas(total, "level string, n long").collect()
    ranked = read.withColumn("rank", F.row_number().over(Window.orderBy("geocode")))
    ranked.join(read, ["level", "geocode"]).agg(F.max("rank")).collect()
    DeltaTable.forPath(spark, table).alias("t").merge(
        rows.limit(10).alias("s"), "t.geocode = s.geocode"
    ).whenMatchedUpdateAll().execute()
    spark.stop()


def _check() -> None:
    """A session that maps the archive starts and runs a job (a JVM that cannot map it dies)."""
    from censusdp_spark.engine.session import spark_session

    spark = spark_session("censusdp-class-archive-check", "local[1]")
    spark.range(10).count()
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1] == "record":
        with tempfile.TemporaryDirectory() as work:
            _workload(Path(work))
    else:
        _check()
