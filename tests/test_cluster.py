"""The TopDown job via spark-submit on a real standalone cluster equals a local-mode run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import spark_submit, standalone_cluster

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def tract_csv(tmp_path_factory) -> Path:
    lines = (ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()
    path = tmp_path_factory.mktemp("input") / "bristol.csv"
    path.write_text("\n".join([lines[0], *[ln for ln in lines[1:] if ln.startswith("44001")]]) + "\n")
    return path


def test_cluster_release_is_identical_to_local(spark, tract_csv, secret_file, tmp_path):
    args = ["--config", "conf/ri_2010_demo.toml", "--input", str(tract_csv), "--secret-file", str(secret_file)]
    local = spark_submit("local[2]", "jobs/topdown.py", *args, "--output", str(tmp_path / "local"),
                         log=tmp_path / "local.log")
    assert local.returncode == 0, (tmp_path / "local.log").read_text()[-3000:]
    with standalone_cluster(tmp_path) as master:
        run = spark_submit(master, "jobs/topdown.py", *args, "--output", str(tmp_path / "cluster"),
                           log=tmp_path / "cluster.log")
    assert run.returncode == 0, (tmp_path / "cluster.log").read_text()[-3000:]
    assert "TopDown release written to" in (tmp_path / "cluster.log").read_text()
    for table in ("noisy_measurements", "estimates", "microdata"):
        a = spark.read.format("delta").load(str(tmp_path / "local" / table))
        b = spark.read.format("delta").load(str(tmp_path / "cluster" / table))
        assert a.count() > 0
        assert a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0, table
