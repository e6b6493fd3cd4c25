"""The synthetic national generator keeps its promises on small states (DC, Wyoming).

The full-nation run (exact 2020 tallies) is marked slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.generate.national import (
    NATIONAL_TALLIES,
    ModelParameters,
    OutputExistsError,
    apportion,
    apportion_within,
    draw_layout,
    generate_national,
    load_spine,
    select_states,
)
from censusdp_spark.topdown.config import load_topdown_config

ROOT = Path(__file__).resolve().parents[2]
RACES = ("white", "black", "hisp", "aian", "asian", "nhpi", "other", "two")
HOUSEHOLDS = [f"hh_size_{s}" for s in range(1, 7)] + ["hh_size_7plus"]
DC, WYOMING = "11", "56"


@pytest.fixture(scope="module")
def dc_wy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dc_wy")
    generate_national(7, out, states=[DC, WYOMING])
    return out


@pytest.fixture(scope="module")
def blocks(dc_wy: Path) -> pd.DataFrame:
    return pd.read_parquet(dc_wy / "blocks")


@pytest.fixture(scope="module")
def spine() -> pd.DataFrame:
    frame = pd.read_csv(ROOT / "data/spine/tracts_2020_population.csv", dtype={"GEOID": str})
    return frame[frame["GEOID"].str[:2].isin([DC, WYOMING])].set_index("GEOID")


def test_block_populations_add_up_to_the_real_tract_populations(blocks, spine):
    by_tract = blocks.groupby(blocks["GEOID"].str[:11])["pop"].sum()
    pd.testing.assert_series_equal(
        by_tract.sort_index(), spine["pop20"].sort_index(), check_names=False, check_dtype=False
    )


def test_race_columns_sum_to_pop_and_vap_columns_to_vap(blocks):
    assert (blocks[[f"pop_{r}" for r in RACES]].sum(axis=1) == blocks["pop"]).all()
    assert (blocks[[f"vap_{r}" for r in RACES]].sum(axis=1) == blocks["vap"]).all()
    for race in RACES:
        assert (blocks[f"vap_{race}"] <= blocks[f"pop_{race}"]).all()
    assert (blocks.drop(columns="GEOID") >= 0).all().all()


def test_households_fit_in_their_block(blocks):
    people = sum(size * blocks[col] for size, col in enumerate(HOUSEHOLDS, start=1))
    households = blocks[HOUSEHOLDS].sum(axis=1)
    assert (people <= blocks["pop"]).all()
    assert (households[blocks["pop"] == 0] == 0).all()
    populated = blocks["pop"] > 0
    assert (households[populated] == 0).mean() < 0.03  # only whole group-quarters blocks
    assert 0.95 < people.sum() / blocks["pop"].sum() <= 1


def test_geocodes_nest_like_real_block_codes(blocks, spine):
    geoid = blocks["GEOID"]
    assert geoid.str.fullmatch(r"[0-9]{15}").all() and geoid.is_unique
    assert set(geoid.str[:11]) == set(spine.index)
    assert geoid.str[11].isin(list("123456789")).all()
    bg = geoid.str[:12]
    digits = bg.drop_duplicates().str[11].astype(int)
    per_tract = digits.groupby(bg.drop_duplicates().str[:11].to_numpy())
    assert (per_tract.max() == per_tract.size()).all()  # block groups numbered 1..n
    number = geoid.str[12:].astype(int)
    assert (number.groupby(bg).max() + 1 == bg.value_counts().sort_index()).all()


def test_share_of_empty_blocks_is_realistic(blocks):
    assert 0.15 < (blocks["pop"] == 0).mean() < 0.5


def test_report_and_readme_say_synthetic_and_tallies_are_met(dc_wy, blocks):
    report = json.loads((dc_wy / "metadata.json").read_text())
    assert report["synthetic"] is True and report["seed"] == 7
    assert report["states"] == [DC, WYOMING]
    assert report["tallies"]["generated"] == report["tallies"]["target_selected_states"]
    assert report["tallies"]["generated"]["blocks"] == len(blocks)
    assert set(report["validation"]) == {"generated", "RI 2010", "HI 2010"}
    assert (dc_wy / "README.txt").read_text().startswith("SYNTHETIC DATA - NOT CENSUS DATA")


def test_a_state_file_depends_only_on_the_seed(dc_wy, tmp_path):
    generate_national(7, tmp_path / "same", states=[DC])
    generate_national(8, tmp_path / "other", states=[DC])
    reference = (dc_wy / "blocks" / "state_11.parquet").read_bytes()
    assert (tmp_path / "same" / "blocks" / "state_11.parquet").read_bytes() == reference
    assert (tmp_path / "other" / "blocks" / "state_11.parquet").read_bytes() != reference


def test_existing_output_is_kept_unless_overwrite(dc_wy):
    with pytest.raises(OutputExistsError):
        generate_national(7, dc_wy, states=[DC])


def test_national_demo_config_accounts_for_every_column(blocks):
    spec = load_topdown_config(ROOT / "conf" / "national_demo.toml", ROOT).input
    assert spec is not None and spec.format == "parquet"
    assert spec.path == ROOT / "data" / "national" / "blocks"
    assert set(spec.used_columns()) | set(spec.ignore) == set(blocks.columns)
    assert not set(spec.used_columns()) & set(spec.ignore)


def test_apportion_hits_the_total_within_bounds():
    weights = np.array([0.1, 1.0, 50.0, 3.0, 1e-6])
    counts = apportion(20, weights, 1, 9)
    assert counts.sum() == 20 and counts.min() >= 1 and counts.max() <= 9
    assert counts[2] == 9 and counts[4] == 1
    assert apportion(45, weights, 1, 9).tolist() == [9] * 5
    with pytest.raises(ValueError):
        apportion(46, weights, 1, 9)


def test_apportion_within_splits_each_group_total_exactly():
    group = np.array([0, 0, 0, 1, 1, 2])
    counts = apportion_within(group, np.array([10, 7, 0]), np.array([1.0, 1.0, 1.0, 3.0, 1.0, 0.0]))
    assert counts.tolist() == [4, 3, 3, 5, 2, 0]


def test_fraction_keeps_whole_states_near_the_share():
    layout = draw_layout(load_spine(), 3, ModelParameters())
    blocks = dict(zip(layout.states.tolist(), layout.state_blocks().tolist(), strict=True))
    share = sum(blocks[s] for s in select_states(layout, 0.25, 3).tolist()) / sum(blocks.values())
    assert abs(share - 0.25) < 0.05
    assert len(select_states(layout, 1.0, 3)) == NATIONAL_TALLIES.states


@pytest.mark.slow
def test_the_whole_nation_hits_the_2020_tallies(tmp_path):
    report = generate_national(2020, tmp_path)
    assert report["tallies"]["generated"] == report["tallies"]["target_national"]
    assert 0.26 < report["validation"]["generated"]["empty_block_share"] < 0.30
