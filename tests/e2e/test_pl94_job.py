"""TopDown persons end to end on the real P.L. 94-171 legacy files (the 2018 End-to-End
prototype for Providence County, RI), through the CLI: ``conf/pl94_e2e_providence.toml``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from censusdp_spark.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "conf" / "pl94_e2e_providence.toml"
BLOCK_POPULATION = 29_225  # the sample's 569 blocks (its state record says 614,053: the county's)


@pytest.mark.slow
def test_the_providence_config_releases_every_block_with_every_guarantee(spark, tmp_path):
    secret = tmp_path / "secret.hex"
    secret.write_text("c3" * 32 + "\n")
    secret.chmod(0o600)
    out = tmp_path / "out"
    args = ["topdown", "--config", str(CONFIG), "--output", str(out), "--secret-file", str(secret)]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == {
        "negative_counts": 0,
        "children_not_summing_to_parent": 0,
        "invariants_broken": 0,
        "noise_variances_not_from_budget": 0,
        "paths_not_spending_rho": 0,
    }
    assert manifest["nodes"] == {
        "nation": 1, "state": 1, "county": 1, "tract": 7, "block_group": 28, "block": 569
    }  # fmt: skip
    assert manifest["privacy"]["rho"] == "293764/114921"
    noisy = spark.read.format("delta").load(str(out / "noisy_measurements"))
    measured = noisy.where("level = 'block' AND query = 'detailed'").select("geocode")
    assert measured.distinct().count() == 569  # the 215 empty blocks too: the geoheader's spine
    estimates = spark.read.format("delta").load(str(out / "estimates"))
    totals = {r["level"]: r["t"] for r in estimates.groupBy("level").agg({"count": "sum"})
              .withColumnRenamed("sum(count)", "t").collect()}  # fmt: skip
    assert set(totals.values()) == {BLOCK_POPULATION}  # the state total is invariant
    microdata = spark.read.format("delta").load(str(out / "microdata"))
    assert microdata.count() == BLOCK_POPULATION
    assert set(microdata.columns) == {"geocode", "votingage", "hispanic", "cenrace"}
