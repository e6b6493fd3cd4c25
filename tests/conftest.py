"""Shared fixtures: one real local Spark session with Delta for the whole test run."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def spark():
    from censusdp_spark.engine.session import spark_session

    session = spark_session("censusdp-tests", "local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "4")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret.hex"
    path.write_text("ab" * 32)
    path.chmod(0o600)
    return path
