"""A SparkSession with Delta Lake, for local runs, tests, spark-submit and Spark Connect alike.

Delta's jars come from ``$CENSUSDP_JARS``, else a checkout's ``jars/`` (``scripts/setup.sh``),
else the per-user cache ``censusdp jars`` fills (:mod:`censusdp_spark.engine.jars`). Under
spark-submit, pass them with ``--jars``; an existing session is reused as it is.

In local mode every listener is on the loopback address, the Spark UI included: Spark binds its
UI to ``$SPARK_LOCAL_IP`` (else every interface, whatever ``spark.driver.bindAddress`` says), so
the JVM is started with ``SPARK_LOCAL_IP`` set to ``$CENSUSDP_UI_HOST`` (default ``127.0.0.1``;
``0.0.0.0`` exposes the UI on every interface). The UI shows no count: no release sets a job
description or group, so Spark names each job by its call site.

With ``remote`` (``--remote sc://HOST:PORT``) or ``$SPARK_REMOTE``, the session is a Spark Connect
client: no JVM starts here, and the server must have Delta (its jars, extension and catalog; see
docs/deploy.md, "Run over Spark Connect"). The releases use only the DataFrame API (no RDD, no
``sparkContext``), so they run unchanged over either kind of session.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from censusdp_spark.engine.class_archive import java_options
from censusdp_spark.engine.jars import JARS_ENV, delta_jars
from censusdp_spark.model.errors import SetupError
from censusdp_spark.model.memory import parse_memory

CONNECT_DEFAULT_PORT = 15002
# A missing server is reported within seconds: a TCP connect, then a gRPC handshake, each
# within this timeout, then one RPC with a few quick retries (the client's default policy would
# retry for about ten minutes).
CONNECT_TIMEOUT_S = 10.0
CONNECT_PROBE_RETRIES = 3
# More rows than any cluster has cores, so every slice of the probe range holds at least one.
PARALLELISM_PROBE_ROWS = 1 << 20
UI_HOST_ENV = "CENSUSDP_UI_HOST"
"""The address a local-mode Spark UI listens on (default loopback; ``0.0.0.0``: every interface)."""
LOOPBACK = "127.0.0.1"
_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


def remote_url(remote: str | None = None) -> str | None:
    """The Spark Connect address to use: ``remote``, else ``$SPARK_REMOTE``, else none."""
    return remote or os.environ.get("SPARK_REMOTE") or None


def spark_session(
    app_name: str, master: str | None = None, remote: str | None = None
) -> SparkSession:
    """Get or create the session; a new one is configured for Delta and Arrow. With ``remote``
    (or ``$SPARK_REMOTE``) it is a Spark Connect session, refused with a :class:`SetupError` when
    no server answers there."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    url = remote_url(remote)
    if url is not None:
        return _connect_session(app_name, url)
    builder = SparkSession.builder.appName(app_name)
    ui_host: str | None = None  # set: the JVM starts here, in local mode
    if os.environ.get(JARS_ENV):
        delta_jars()  # a folder named on purpose (the image names its own) must hold the jars
    # Under spark-submit the master and --jars come from the command line; leave them alone.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers use this interpreter
        master = master or os.environ.get("CENSUSDP_MASTER", "local[*]")
        if master.startswith("local"):
            # In local mode the driver JVM is the executor too: Spark's 1 GiB default heap cannot
            # cache a national input (8.1 M blocks), so default to a heap that can.
            ui_host = os.environ.get(UI_HOST_ENV) or os.environ.get("SPARK_LOCAL_IP") or LOOPBACK
            builder = (
                builder.config("spark.driver.host", LOOPBACK)
                .config("spark.driver.bindAddress", LOOPBACK)
                .config("spark.driver.memory", os.environ.get("CENSUSDP_DRIVER_MEMORY", "6g"))
            )
        jars = delta_jars()
        builder = builder.master(master).config("spark.jars", ",".join(str(j) for j in jars))
        options = java_options(jars)
        if options:  # the defaults, which a user's spark.driver.extraJavaOptions adds to
            builder = builder.config("spark.driver.defaultJavaOptions", options)
    builder = _with_release_conf(
        builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "WARN")
    )
    if ui_host is None:
        return builder.getOrCreate()
    with _jvm_env("SPARK_LOCAL_IP", ui_host):
        return builder.getOrCreate()


@contextmanager
def _jvm_env(name: str, value: str) -> Iterator[None]:
    """``$name`` set to ``value`` while the JVM starts (it copies this process's environment),
    restored afterwards so that processes started later (a standalone cluster's) do not inherit
    it."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client's session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


@dataclass(frozen=True)
class LocalMode:
    """A classic local-mode session's share of this machine: its Python workers (one per core)
    and its JVM's heap."""

    cores: int
    heap: int


def local_mode(spark: SparkSession) -> LocalMode | None:
    """The local-mode facts of ``spark``, or None for a cluster's or Spark Connect's session
    (whose memory is another machine's)."""
    if is_connect(spark):
        return None
    master = spark.conf.get("spark.master", "") or ""
    found = _LOCAL_MASTER.match(master)
    if found is None:
        return None
    cores = found.group(1)
    if cores is None:
        count = 1
    elif cores == "*":
        count = os.cpu_count() or 1
    else:
        count = int(cores)
    heap = parse_memory(spark.conf.get("spark.driver.memory", "1g") or "1g", "spark.driver.memory")
    return LocalMode(count, heap)


def default_parallelism(spark: SparkSession) -> int:
    """The session's default parallelism (what ``sparkContext.defaultParallelism`` gives: total
    executor cores, or ``spark.default.parallelism``), read without ``sparkContext`` so it works
    over Spark Connect: ``spark.range`` without a partition count is split that many ways."""
    from pyspark.sql import functions as F

    slices = spark.range(0, PARALLELISM_PROBE_ROWS).select(F.spark_partition_id().alias("slice"))
    row = slices.agg(F.max("slice")).first()
    assert row is not None
    return int(row[0]) + 1


def _with_release_conf(builder: SparkSession.Builder) -> SparkSession.Builder:
    """The session settings the releases rely on; all are runtime SQL settings, so a Spark
    Connect client can set them on its server session too."""
    return (
        builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "true")
        # Let adaptive execution size shuffles by the data, also under persisted DataFrames.
        .config("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
        # ... but not below one partition per core: its 1 MB floor made the noise pass of a
        # state (a few MB of sparse histograms, seconds of sampling per family) one task.
        .config("spark.sql.adaptive.coalescePartitions.minPartitionSize", "1KB")
        # Tables are partitioned by level and a task holds few levels: write each level's file
        # as its rows come instead of sorting the task's rows by level first.
        .config("spark.sql.maxConcurrentOutputFileWriters", "16")
        .config("spark.databricks.delta.snapshotPartitions", "2")
    )


def _connect_session(app_name: str, url: str) -> SparkSession:
    """A Spark Connect session at ``url``, checked to answer before any release step runs."""
    parsed = urlparse(url)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise SetupError(f"--remote {url}: a Spark Connect address is sc://HOST[:PORT]")
    host, port = parsed.hostname, parsed.port or CONNECT_DEFAULT_PORT
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise SetupError(f"no Spark Connect server at {url}: {err}") from None
    import grpc
    from pyspark.sql.connect.client.core import DefaultChannelBuilder
    from pyspark.sql.connect.client.retries import DefaultPolicy

    # Something listens; the gRPC client would wait without end for one that never answers.
    channel = DefaultChannelBuilder(url).toChannel()
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        raise SetupError(
            f"no Spark Connect server at {url}: {host}:{port} accepts connections but does not"
            f" answer gRPC within {CONNECT_TIMEOUT_S:g} s"
        ) from None
    finally:
        channel.close()

    session = _with_release_conf(SparkSession.builder.remote(url).appName(app_name)).getOrCreate()
    client = cast(Any, session).client  # a Connect session's gRPC client
    policies = client.get_retry_policies()
    client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_PROBE_RETRIES)])
    try:
        session.version  # noqa: B018 - one RPC: is a Spark Connect server answering?
    except Exception as err:
        session.stop()
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise SetupError(f"no Spark Connect server answers at {url}: {first}") from None
    finally:
        client.set_retry_policies(policies)
    return session
