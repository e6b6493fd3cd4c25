"""``[estimation] passes`` end to end on one real RI county, through the CLI: the Census's two
passes with either method keep every guarantee on the same noisy measurements, and
``passes = ["all"]`` is today's release, table for table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from tests.helpers.release import TOPDOWN_GUARANTEES_HELD, assert_same_tables, with_method

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"


def config_with(tmp_path: Path, lines: str, method: str = "full_information") -> Path:
    text = with_method(DEMO.read_text(), method)
    path = tmp_path / "config.toml"
    path.write_text(text.replace("[estimation]\n", "[estimation]\n" + lines))
    return path


def release(config: Path, county_csv: Path, secret: Path, output: Path) -> Path:
    args = ["--input", str(county_csv), "--output", str(output), "--secret-file", str(secret)]
    assert main(["topdown", "--config", str(config), *args, "--master", "local[2]"]) == 0
    return output


def estimates(spark, output: Path):
    return spark.read.format("delta").load(str(output / "estimates")).toPandas()


@pytest.mark.parametrize("method", ["topdown", "full_information"])
def test_two_passes_keep_every_guarantee(
    spark, method, county_csv, fixed_secret, reference_release, tmp_path
):
    config = config_with(tmp_path, 'passes = ["total", "all"]\n', method)
    out = release(config, county_csv, fixed_secret, tmp_path / "out")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == TOPDOWN_GUARANTEES_HELD
    assert 'passes = ["total", "all"]' in manifest["config_text"]
    assert_same_tables(spark, out, reference_release, tables=("noisy_measurements",))
    two, one = estimates(spark, out), estimates(spark, reference_release)
    totals = {
        name: table.groupby(["level", "geocode"])["count"].sum()
        for name, table in (("two", two), ("one", one))
    }
    # The invariant state total and its lone county are the same; below, the fit differs.
    for level in ("nation", "state", "county"):
        assert totals["two"][level].equals(totals["one"][level])
    assert not totals["two"]["block"].equals(totals["one"]["block"])


def test_one_pass_is_todays_release(spark, county_csv, fixed_secret, reference_release, tmp_path):
    config = config_with(tmp_path, 'passes = ["all"]\n')
    out = release(config, county_csv, fixed_secret, tmp_path / "out")
    assert_same_tables(spark, out, reference_release)
