"""A SparkSession with Delta Lake, for local runs, tests and spark-submit alike.

Delta's jars come from the project's ``jars/`` folder (filled from Maven Central by
``scripts/setup.sh``) or from ``$CENSUSDP_JARS``. Under spark-submit, pass them with ``--jars``;
an existing session is reused as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def delta_jars() -> list[Path]:
    folder = Path(os.environ.get("CENSUSDP_JARS", PROJECT_ROOT / "jars"))
    jars = sorted(folder.glob("delta-*.jar"))
    if not jars:
        raise RuntimeError(f"no Delta Lake jars in {folder}: run scripts/setup.sh first")
    return jars


def spark_session(app_name: str, master: str | None = None) -> SparkSession:
    """Get or create the session; a new one is configured for Delta and Arrow."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit the master and --jars come from the command line; leave them alone.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers use this interpreter
        master = master or os.environ.get("CENSUSDP_MASTER", "local[*]")
        if master.startswith("local"):
            # In local mode the driver JVM is the executor too: Spark's 1 GiB default heap cannot
            # cache a national input (8.1 M blocks), so default to a heap that can.
            builder = (
                builder.config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.driver.memory", os.environ.get("CENSUSDP_DRIVER_MEMORY", "6g"))
            )
        builder = builder.master(master).config(
            "spark.jars", ",".join(str(j) for j in delta_jars())
        )
    return (
        builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "true")
        # Let adaptive execution size shuffles by the data, also under persisted DataFrames.
        .config("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
        .config("spark.ui.showConsoleProgress", "false")
        # Tables are partitioned by level and a task holds few levels: write each level's file
        # as its rows come instead of sorting the task's rows by level first.
        .config("spark.sql.maxConcurrentOutputFileWriters", "16")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .getOrCreate()
    )
