"""The TopDown job end to end on real data (one RI county), through the CLI, with real Delta."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.release.runner import evaluation_dir_for
from tests.helpers.release import (
    TOPDOWN_GUARANTEES_HELD,
    assert_release_unchanged,
    assert_same_tables,
)

ROOT = Path(__file__).resolve().parents[2]


def run(spark, config: Path, *args: str) -> int:
    return main(["topdown", "--config", str(config), *args])


@pytest.fixture
def release(reference_release):
    return reference_release


@pytest.fixture
def secret(fixed_secret):
    return fixed_secret


def delta(spark, path: Path):
    return spark.read.format("delta").load(str(path))


def true_total(county_csv: Path) -> int:
    rows = county_csv.read_text().splitlines()[1:]
    return sum(int(r.split(",")[4]) for r in rows)


def test_release_writes_the_delta_tables_and_manifest(spark, release):
    for table in ("noisy_measurements", "estimates", "microdata"):
        assert (release / table / "_delta_log").is_dir(), table
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == TOPDOWN_GUARANTEES_HELD
    assert manifest["privacy"]["rho"] == "293764/114921"
    assert manifest["nodes"]["block"] == 1092 and manifest["nodes"]["county"] == 1
    unit = manifest["privacy"]["unit"]
    assert unit["neighbours"].startswith("neighbouring inputs differ in one person's record")
    assert any("(invariants, released exact)" in public for public in unit["public"])


def test_noisy_measurements_cover_every_node_and_query_and_hold_no_truth(spark, release):
    noisy = delta(spark, release / "noisy_measurements")
    assert noisy.columns == ["level", "geocode", "query", "noisy", "sigma2", "budget_levels"]
    assert noisy.filter("size(budget_levels) != 1 OR budget_levels[0] != level").count() == 0
    per_level = {r["level"]: r["count"] for r in noisy.groupBy("level").count().collect()}
    manifest = json.loads((release / "manifest.json").read_text())
    queries = {"nation": 3, "state": 2, "county": 4, "tract": 4, "block_group": 4, "block": 2}
    assert per_level == {lv: manifest["nodes"][lv] * q for lv, q in queries.items()}


def test_estimates_hold_the_state_invariant_and_microdata_matches(spark, release, county_csv):
    est = delta(spark, release / "estimates")
    totals = {
        r["level"]: r["t"]
        for r in est.groupBy("level")
        .agg({"count": "sum"})
        .withColumnRenamed("sum(count)", "t")
        .collect()
    }
    assert set(totals.values()) == {true_total(county_csv)}
    assert delta(spark, release / "microdata").count() == true_total(county_csv)


def test_the_release_beats_the_block_by_block_baseline_at_tract_level(spark, release):
    rows = (
        delta(spark, evaluation_dir_for(release) / "table")
        .filter("metric = 'mae_total' AND level = 'tract'")
        .collect()
    )
    mae = {r["method"]: r["value"] for r in rows}
    assert set(mae) == {"full_information", "block_by_block"}  # the demo's method, by name
    assert mae["full_information"] < mae["block_by_block"]
    assert (evaluation_dir_for(release) / "error_by_level.png").stat().st_size > 1000


def test_same_secret_reproduces_the_release_exactly(spark, release, county_csv, secret, tmp_path):
    again = tmp_path / "again"
    assert (
        run(
            spark,
            ROOT / "conf" / "ri_2010_demo.toml",
            "--input",
            str(county_csv),
            "--output",
            str(again),
            "--secret-file",
            str(secret),
        )
        == 0
    )
    assert_same_tables(spark, release, again)


def test_existing_output_is_not_overwritten_without_the_flag(
    spark, release, county_csv, secret, capsys
):
    before = sorted(p.name for p in release.iterdir())
    code = run(
        spark,
        ROOT / "conf" / "ri_2010_demo.toml",
        "--input",
        str(county_csv),
        "--output",
        str(release),
        "--secret-file",
        str(secret),
    )
    assert code == 2
    assert "output exists; pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in release.iterdir()) == before


def test_bad_input_writes_nothing(spark, county_csv, secret, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    lines = county_csv.read_text().splitlines()
    geoid, rest = lines[5].split(",", 1)
    lines[5] = geoid[:-1] + "X," + rest
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert (
        run(
            spark,
            ROOT / "conf" / "ri_2010_demo.toml",
            "--input",
            str(bad),
            "--output",
            str(out),
            "--secret-file",
            str(secret),
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and "bad.csv: row 5, column GEOID: geocode must be exactly 15 digits" in err
    )
    assert not out.exists() or not any(out.iterdir())


def test_secret_never_reaches_output_or_tables(spark, release, secret):
    hexsecret = secret.read_text().strip()
    for path in release.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert hexsecret.encode() not in data and bytes.fromhex(hexsecret) not in data, path


def test_the_demo_config_makes_the_recorded_release_bit_for_bit(spark, reference_release):
    """The demo config on the county with the fixed secret: every table as recorded (a
    refactor changes no release)."""
    assert_release_unchanged(spark, reference_release, "topdown_demo_county")
