"""A real Spark Connect server on 127.0.0.1 for tests, started from the pip wheel's jars.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` with the Delta
jars, extension and catalog (Delta reads and writes through the DataFrame API need nothing more on
the server), and the project importable by the server's Python workers. Stopped (process group
killed) whatever happens.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path

from censusdp_spark.engine.session import delta_jars
from tests.helpers.cluster import cluster_env, free_port, on_path

ROOT = Path(__file__).resolve().parents[2]
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 240  # a loaded two-core machine needs about a minute


def server_command(port: int, jars: list[str], master: str = "local[2]") -> list[str]:
    """The server's command line (docs/deploy.md, "Run over Spark Connect", shows the same)."""
    return [
        "spark-submit",
        "--class",
        SERVER_CLASS,
        "--master",
        master,
        "--jars",
        ",".join(jars),
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
        "--conf",
        "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.driver.bindAddress=127.0.0.1",
        "--conf",
        "spark.sql.shuffle.partitions=4",
        "--conf",
        "spark.ui.enabled=false",
    ]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server_env() -> dict[str, str]:
    """The server's Python workers run this interpreter with the project on their path."""
    env = cluster_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return env


@contextmanager
def connect_server(log_dir: Path):
    """Yield ``sc://127.0.0.1:PORT`` of a running server; kill it on exit."""
    port = free_port()
    log_path = log_dir / "connect-server.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        on_path(server_command(port, [str(j) for j in delta_jars()])),
        env=server_env(),
        cwd=log_dir,  # not the project: the client must hand the server absolute paths
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + START_TIMEOUT_S
        while not _listening(port):
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"Spark Connect server did not come up; log in {log_path}")
            time.sleep(1)
        yield f"sc://127.0.0.1:{port}"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def run_cli(*args: str, log: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``censusdp ARGS`` in its own process (a Connect client and this process's classic session
    cannot share one Python process); stdout and stderr go to ``log``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    code = "import sys; from censusdp_spark.cli import main; sys.exit(main(sys.argv[1:]))"
    with open(log, "w") as out:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
