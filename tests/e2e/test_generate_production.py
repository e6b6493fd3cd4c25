"""The SYNTHETIC production persons keep their blocks' counts and the production schema's rules,
and ``conf/national_production.toml`` reads them with the spine written beside them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.generate.national import generate_national
from censusdp_spark.generate.production import (
    CENRACE_CODES,
    PERSON_COLUMNS,
    generate_production,
    load_race_anchors,
)
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.job import TopDownOptions, _apply_options

ROOT = Path(__file__).resolve().parents[2]
DC = "11"
ONE_RACE = {"white": "01", "black": "02", "aian": "03", "asian": "04", "nhpi": "05", "other": "06"}


@pytest.fixture(scope="module")
def dc(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dc_production")
    generate_production(7, out, states=[DC])
    return out


@pytest.fixture(scope="module")
def persons(dc: Path) -> pd.DataFrame:
    frame = pd.read_parquet(dc / "persons").astype(str)
    frame["GEOID"] = frame["TABBLKST"] + frame["TABBLKCOU"] + frame["TABTRACT"] + frame["TABBLK"]
    return frame


@pytest.fixture(scope="module")
def blocks(dc: Path) -> pd.DataFrame:
    return pd.read_parquet(dc / "blocks").set_index("GEOID")


def test_persons_are_the_16_cell_counts_of_their_blocks(persons, blocks):
    adult = persons["VOTING_AGE"] == "2"
    hispanic = persons["CENHISP"] == "2"
    two = ~hispanic & (persons["CENRACE"] > "06")
    group = pd.Series("two", index=persons.index).where(two, "hisp").where(two | hispanic)
    for name, code in ONE_RACE.items():
        group[~hispanic & (persons["CENRACE"] == code)] = name
    counted = persons.groupby([persons["GEOID"], group, adult]).size()
    for name in (*ONE_RACE, "hisp", "two"):
        everyone = counted.xs(name, level=1).groupby(level=0).sum()
        grown = counted.xs((name, True), level=(1, 2))
        expected_all = blocks[f"pop_{name}"][blocks[f"pop_{name}"] > 0]
        expected_adults = blocks[f"vap_{name}"][blocks[f"vap_{name}"] > 0]
        pd.testing.assert_series_equal(
            everyone.sort_index(), expected_all.sort_index(), check_names=False, check_dtype=False
        )
        pd.testing.assert_series_equal(
            grown.sort_index(), expected_adults.sort_index(), check_names=False, check_dtype=False
        )


def test_codes_are_the_ppmf_codes_and_nursing_facilities_hold_adults_only(persons):
    assert list(persons.columns[: len(PERSON_COLUMNS)]) == list(PERSON_COLUMNS)
    assert set(persons["CENRACE"]) <= set(CENRACE_CODES)
    assert set(persons["GQTYPE_PL"]) <= set("01234567")
    assert ((persons["RTYPE"] == "5") == (persons["GQTYPE_PL"] != "0")).all()
    nursing = persons[persons["GQTYPE_PL"] == "3"]
    assert (nursing["VOTING_AGE"] == "2").all()
    in_gq = persons[persons["GQTYPE_PL"] != "0"]
    assert in_gq.groupby("GEOID")["GQTYPE_PL"].nunique().max() == 1  # one type per site


def test_hispanic_race_detail_follows_the_real_providence_shares(persons):
    anchors = load_race_anchors()
    hispanic = persons[persons["CENHISP"] == "2"]["CENRACE"].value_counts(normalize=True)
    expected = pd.Series(anchors.hispanic_race, index=CENRACE_CODES)
    assert len(hispanic) > 20
    top = expected.nlargest(3).index
    np.testing.assert_allclose(hispanic[top], expected[top], atol=0.01)


def test_the_spine_lists_every_block_empty_ones_included(dc, blocks, persons):
    spine = pd.read_parquet(dc / "spine")
    assert sorted(spine["GEOID"]) == sorted(blocks.index)
    assert (blocks["pop"] == 0).any() and set(persons["GEOID"]) < set(spine["GEOID"])


def test_the_16_cell_blocks_are_those_of_the_demo_generator(dc, tmp_path):
    generate_national(7, tmp_path, states=[DC])
    demo = (tmp_path / "blocks" / "state_11.parquet").read_bytes()
    assert (dc / "blocks" / "state_11.parquet").read_bytes() == demo
    assert not (tmp_path / "persons").exists()


def test_the_report_says_synthetic_and_compares_with_the_real_files(dc):
    report = json.loads((dc / "metadata.json").read_text())
    assert report["synthetic"] is True
    validation = report["production"]["validation"]
    assert len(validation) == 3 and "generated" in validation
    assert validation["generated"]["persons"] == report["tallies"]["generated"]["population"]
    readme = (dc / "README.txt").read_text()
    assert readme.startswith("SYNTHETIC DATA - NOT CENSUS DATA") and "persons/" in readme


def test_the_production_config_finds_the_spine_beside_any_input(dc):
    config = load_topdown_config(ROOT / "conf" / "national_production.toml", ROOT)
    assert config.spine is not None and config.input is not None
    assert config.spine.path == ROOT / "data" / "national_production" / "spine"
    moved = _apply_options(config, TopDownOptions(input=dc / "persons"))
    assert moved.spine is not None and moved.spine.path == dc / "spine"
    assert moved.spine.geocode_columns == ("GEOID",)
