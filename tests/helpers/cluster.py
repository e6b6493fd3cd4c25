"""A real Spark standalone cluster on 127.0.0.1 (one master, two workers) for tests.

Started with ``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker`` from
the project's virtualenv; stopped (process group killed) whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from censusdp_spark.engine.session import delta_jars

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


# The commands of a cluster's daemons and of a job's submission, as the project image runs them
# (docker-compose.yml; tests/e2e/test_container.py holds it to these) and as this module runs them
# from the virtualenv (``on_path``).
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def master_command(host: str, port: int, ui_port: int) -> list[str]:
    return [
        "spark-class",
        MASTER_CLASS,
        "--host",
        host,
        "--port",
        str(port),
        "--webui-port",
        str(ui_port),
    ]


def worker_command(master: str, host: str, cores: int, memory: str, ui_port: int) -> list[str]:
    return [
        "spark-class",
        WORKER_CLASS,
        master,
        "--host",
        host,
        "--cores",
        str(cores),
        "--memory",
        memory,
        "--webui-port",
        str(ui_port),
    ]


def submit_command(
    master: str, jars: list[str], script: str, *args: str, options: tuple[str, ...] = ()
) -> list[str]:
    """``spark-submit`` of ``script``; ``options`` (e.g. ``--executor-memory 6g``) go before it."""
    return [
        "spark-submit",
        "--master",
        master,
        *options,
        "--jars",
        ",".join(jars),
        "--conf",
        "spark.sql.shuffle.partitions=4",
        "--conf",
        "spark.ui.enabled=false",
        script,
        *args,
    ]


def on_path(command: list[str]) -> list[str]:
    """The command with its program taken from this virtualenv."""
    return [str(BIN / command[0]), *command[1:]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_MASTER_HOST="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_NO_DAEMONIZE="1",
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    # The drivers' JVM options (the tests set them), the daemons' too.
    if env.get("SPARK_SUBMIT_OPTS"):
        env.setdefault("SPARK_DAEMON_JAVA_OPTS", env["SPARK_SUBMIT_OPTS"])
    return env


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


@dataclass(frozen=True)
class Cluster:
    url: str  # the master's spark:// URL
    pids: tuple[int, ...]  # the daemons' processes (executors are their workers' children)


@contextmanager
def standalone_cluster(
    log_dir: Path, workers: int = 2, cores: int = 1, memory: str = "2g"
) -> Iterator[Cluster]:
    """Yield a running cluster; kill every daemon on exit."""
    port, ui = free_port(), free_port()
    env = cluster_env()
    procs: list[subprocess.Popen] = []

    def start(name: str, command: list[str]) -> None:
        log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(
            subprocess.Popen(
                on_path(command),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    try:
        start("master", master_command("127.0.0.1", port, ui))
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            start(
                f"worker{i}",
                worker_command(url, "127.0.0.1", cores, memory, free_port())
                + ["--work-dir", str(log_dir / f"work{i}")],
            )
        deadline = time.time() + 120
        while _alive_workers(ui) < workers:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"standalone cluster did not come up; logs in {log_dir}")
            time.sleep(1)
        yield Cluster(url, tuple(p.pid for p in procs))
    finally:
        for p in procs:
            with suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def spark_submit(master: str, script: str, *args: str, log: Path) -> subprocess.CompletedProcess:
    """``submit_command`` run against ``master``, its output in ``log``; the executors' JVMs take
    the driver's options from ``$SPARK_SUBMIT_OPTS`` (the tests set them), if any."""
    jars = [str(j) for j in delta_jars()]
    driver = os.environ.get("SPARK_SUBMIT_OPTS", "").strip()
    options = ("--conf", f"spark.executor.extraJavaOptions={driver}") if driver else ()
    cmd = on_path(submit_command(master, jars, str(ROOT / script), *args, options=options))
    with open(log, "w") as out:
        return subprocess.run(
            cmd, env=cluster_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=900
        )
