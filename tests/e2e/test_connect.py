"""The releases over a real Spark Connect server equal a local-mode run with the same secret, and
a ``--remote`` where no server listens is one line, fast, with nothing written."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.helpers.cluster import free_port
from tests.helpers.connect import connect_server, run_cli
from tests.helpers.release import assert_same_tables

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "conf" / "ri_2010_demo.toml")
NO_SERVER_LIMIT_S = 30


@pytest.mark.connect
def test_topdown_over_spark_connect_is_identical_to_local(
    spark, quick_tract, quick_secret, quick_reference, tmp_path, monkeypatch
):
    """The reference release ran in local mode with the same config, input and secret (the
    pandas UDF paths of measurement and estimation run on the server's Python workers).
    Progress lines come from the server's progress messages."""
    csv, config = quick_tract
    out, log = tmp_path / "connect", tmp_path / "client.log"
    monkeypatch.setenv("CENSUSDP_PROGRESS_SECONDS", "1")
    with connect_server(tmp_path) as remote:
        run = run_cli(
            "topdown",
            "--config", str(config),
            "--input", str(csv),
            "--output", str(out),
            "--secret-file", str(quick_secret),
            "--remote", remote,
            log=log,
        )  # fmt: skip
    assert run.returncode == 0, log.read_text()[-3000:]
    assert "TopDown release written to" in log.read_text()
    assert "log4j" not in log.read_text()  # no JVM started in the client
    assert "[censusdp] progress (" in log.read_text()
    assert (out / "manifest.json").exists()
    assert_same_tables(spark, quick_reference, out)


@pytest.mark.parametrize("how", ["flag", "env", "silent listener"])
def test_remote_with_no_server_is_one_line_and_writes_nothing(
    county_csv, fixed_secret, tmp_path, monkeypatch, how
):
    with socket.socket() as silent:
        if how == "silent listener":  # the kernel accepts connections; nothing ever answers
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            remote = f"sc://127.0.0.1:{silent.getsockname()[1]}"
        else:
            remote = f"sc://127.0.0.1:{free_port()}"  # nothing listens there
        run_without_server(county_csv, fixed_secret, tmp_path, monkeypatch, how, remote)


def run_without_server(county_csv, fixed_secret, tmp_path, monkeypatch, how, remote) -> None:
    out, log = tmp_path / "out", tmp_path / "client.log"
    args = ["topdown", "--config", CONFIG, "--input", str(county_csv), "--output", str(out)]
    args += ["--secret-file", str(fixed_secret)]
    if how == "env":
        monkeypatch.setenv("SPARK_REMOTE", remote)
    else:
        args += ["--remote", remote]
    start = time.monotonic()
    run = run_cli(*args, log=log, timeout=120)
    elapsed = time.monotonic() - start
    text = log.read_text()
    assert run.returncode == 2, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("censusdp: error: no Spark Connect server at")
    assert remote in lines[0]
    assert elapsed < NO_SERVER_LIMIT_S, elapsed
    assert not out.exists() and not (tmp_path / "out.private").exists()
