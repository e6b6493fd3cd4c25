"""The TopDown job via spark-submit on a real standalone cluster equals a local-mode run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_same_tables
from tests.e2e.cluster import spark_submit, standalone_cluster

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster


def test_cluster_release_is_identical_to_local(
    spark, county_csv, fixed_secret, reference_release, tmp_path
):
    """The reference release ran in local mode with the same config, input and secret."""
    args = [
        "--config",
        "conf/ri_2010_demo.toml",
        "--input",
        str(county_csv),
        "--secret-file",
        str(fixed_secret),
    ]
    with standalone_cluster(tmp_path) as master:
        run = spark_submit(
            master,
            "jobs/topdown.py",
            *args,
            "--output",
            str(tmp_path / "cluster"),
            log=tmp_path / "cluster.log",
        )
    assert run.returncode == 0, (tmp_path / "cluster.log").read_text()[-3000:]
    assert "TopDown release written to" in (tmp_path / "cluster.log").read_text()
    assert_same_tables(spark, reference_release, tmp_path / "cluster")
