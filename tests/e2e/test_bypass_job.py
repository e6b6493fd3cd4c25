"""``[budget] bypass_single_child = true`` end to end on real RI 2010 blocks, through the CLI:
four tracts of Newport County, two of them with a single block group, so that nation -> state
-> county is one chain and two tracts are bypassed beside two measured ones."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.topdown.config import load_topdown_config
from tests.helpers.release import TOPDOWN_GUARANTEES_HELD, with_method

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"
TRACTS = ("44005040303", "44005040304", "44005041200", "44005990000")
SINGLE_BG = {"44005041200": "440050412001", "44005990000": "440059900000"}  # tract: its one BG


@pytest.fixture(scope="module")
def newport_csv(tmp_path_factory) -> Path:
    lines = (ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()
    path = tmp_path_factory.mktemp("input") / "newport.csv"
    path.write_text("\n".join([lines[0], *[ln for ln in lines[1:] if ln[:11] in TRACTS]]) + "\n")
    return path


@pytest.fixture(scope="module")
def bypass_secret(tmp_path_factory) -> Path:
    """This module's own secret: the session's ``fixed_secret`` already released other inputs,
    and the secret policy refuses it for a new one (as it should)."""
    path = tmp_path_factory.mktemp("bypass_secret") / "secret.hex"
    path.write_text("b7" * 32 + "\n")
    path.chmod(0o600)
    return path


def bypass_config(folder: Path, method: str) -> Path:
    text = DEMO.read_text().replace("[budget]\n", "[budget]\nbypass_single_child = true\n", 1)
    text = with_method(text, method)
    path = folder / f"ri_bypass_{method}.toml"
    path.write_text(text)
    return path


def release(folder: Path, method: str, newport_csv: Path, secret: Path) -> Path:
    out = folder / "out"
    args = ["topdown", "--config", str(bypass_config(folder, method)), "--input"]
    args += [str(newport_csv), "--output", str(out), "--secret-file", str(secret)]
    assert main([*args, "--master", "local[2]"]) == 0
    return out


@pytest.fixture(scope="module")
def topdown_release(spark, newport_csv, bypass_secret, tmp_path_factory) -> Path:
    return release(tmp_path_factory.mktemp("bypass_td"), "topdown", newport_csv, bypass_secret)


def table(spark, path: Path):
    return spark.read.format("delta").load(str(path)).toPandas()


def dense(estimates, level: str, geocode: str) -> dict[int, int]:
    rows = estimates[(estimates["level"] == level) & (estimates["geocode"] == geocode)]
    return dict(zip(rows["cell"], rows["count"], strict=True))


def check_release(spark, out: Path, method: str, newport_csv: Path) -> None:
    for name in ("noisy_measurements", "estimates", "microdata"):
        assert (out / name / "_delta_log").is_dir(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == TOPDOWN_GUARANTEES_HELD
    bypass = manifest["bypass"]
    assert bypass["bypassed"]["nation"] == [""] and bypass["bypassed"]["state"] == ["44"]
    assert bypass["bypassed"]["county"] == []
    assert bypass["bypassed"]["tract"] == ["44005041200", "44005990000"]
    assert [p["rho"] for p in bypass["paths"]] == ["293764/114921"] * 2
    budget = load_topdown_config(bypass_config(out.parent, method), ROOT).budget
    noisy = table(spark, out / "noisy_measurements")
    assert set(noisy["level"]) == {"county", "tract", "block_group", "block"}
    county = noisy[noisy["level"] == "county"]
    chain = {e.query: e.sigma2 for e in budget.node_budget(("nation", "state", "county"))}
    assert {r.query: Fraction(r.sigma2) for r in county.itertuples()} == chain
    assert set(noisy[noisy["level"] == "tract"]["geocode"]) == {"44005040303", "44005040304"}
    estimates = table(spark, out / "estimates")
    nation = dense(estimates, "nation", "")
    assert nation == dense(estimates, "state", "44") == dense(estimates, "county", "44005")
    true_total = sum(int(ln.split(",")[4]) for ln in newport_csv.read_text().splitlines()[1:])
    assert sum(nation.values()) == true_total  # the state total is invariant
    for tract, group in SINGLE_BG.items():
        assert dense(estimates, "tract", tract) == dense(estimates, "block_group", group)


def test_a_one_state_run_with_bypassing_passes_every_guarantee(spark, topdown_release, newport_csv):
    check_release(spark, topdown_release, "topdown", newport_csv)


@pytest.mark.slow
def test_full_information_with_bypassing_passes_every_guarantee(
    spark, newport_csv, bypass_secret, tmp_path_factory
):
    out = release(
        tmp_path_factory.mktemp("bypass_fi"), "full_information", newport_csv, bypass_secret
    )
    check_release(spark, out, "full_information", newport_csv)
    bottom_up = table(spark, out / "bottom_up")
    # The bypassed tracts' bottom-up estimates are their block groups'.
    for tract, group in SINGLE_BG.items():
        here = bottom_up[bottom_up["geocode"] == tract].iloc[0]
        below = bottom_up[bottom_up["geocode"] == group].iloc[0]
        assert list(here["mean"]) == pytest.approx(list(below["mean"]), abs=1e-9)
