"""The TopDown job via spark-submit on a real standalone cluster equals a local-mode run."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cluster import spark_submit, standalone_cluster
from tests.helpers.release import assert_same_tables

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def master(tmp_path_factory) -> Iterator[str]:
    """One standalone cluster (a master and two workers on 127.0.0.1) for the module's jobs."""
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster.url


def test_cluster_release_is_identical_to_local(
    spark, master, quick_tract, quick_secret, quick_reference, tmp_path
):
    """The reference release ran in local mode with the same config, input and secret."""
    csv, config = quick_tract
    args = ["--config", str(config), "--input", str(csv), "--secret-file", str(quick_secret)]
    run = spark_submit(
        master, "jobs/topdown.py", *args, "--output", str(tmp_path / "cluster"),
        log=tmp_path / "cluster.log",
    )  # fmt: skip
    assert run.returncode == 0, (tmp_path / "cluster.log").read_text()[-3000:]
    assert "TopDown release written to" in (tmp_path / "cluster.log").read_text()
    assert_same_tables(spark, quick_reference, tmp_path / "cluster")


def small_production_input(folder: Path, tracts: int = 1) -> Path:
    """The SYNTHETIC production persons and spine of DC's first ``tracts`` tracts, laid out as
    the generator writes them (``persons/`` beside ``spine/``)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from censusdp_spark.generate.production import generate_production

    generate_production(2020, folder / "dc", states=["11"])
    spine = pq.read_table(folder / "dc" / "spine")
    kept = pc.unique(pc.utf8_slice_codeunits(spine["GEOID"], 0, 11))[:tracts]
    spine = spine.filter(pc.is_in(pc.utf8_slice_codeunits(spine["GEOID"], 0, 11), kept))
    persons = pq.read_table(folder / "dc" / "persons")
    tract = pc.binary_join_element_wise(
        pc.cast(persons["TABBLKST"], "string"),
        pc.cast(persons["TABBLKCOU"], "string"),
        pc.cast(persons["TABTRACT"], "string"),
        "",
    )
    persons = persons.filter(pc.is_in(tract, kept))
    small = folder / "small"
    for name, table in (("spine", spine), ("persons", persons)):
        (small / name).mkdir(parents=True)
        pq.write_table(table, small / name / "state_11.parquet")
    return small / "persons"


def test_the_production_schema_on_a_cluster_is_identical_to_local(spark, master, tmp_path):
    """The 2,016-cell production release of SYNTHETIC national persons (a DC tract, the
    spine found beside them), on a standalone cluster and in local mode, same secret."""
    from censusdp_spark.cli import main

    persons = small_production_input(tmp_path)
    secret = tmp_path / "secret.hex"  # its own: a secret makes one release of one input
    secret.write_text(secrets.token_hex(32) + "\n")
    secret.chmod(0o600)
    args = ["--config", "conf/national_production.toml", "--input", str(persons)]
    args += ["--secret-file", str(secret)]
    local = tmp_path / "local"
    assert main(["topdown", *args, "--output", str(local), "--master", "local[2]"]) == 0
    run = spark_submit(
        master, "jobs/topdown.py", *args, "--output", str(tmp_path / "cluster"),
        log=tmp_path / "cluster.log",
    )  # fmt: skip
    assert run.returncode == 0, (tmp_path / "cluster.log").read_text()[-3000:]
    tables = ("noisy_measurements", "bottom_up", "estimates", "microdata", "pl94_tables")
    assert_same_tables(spark, local, tmp_path / "cluster", tables)
