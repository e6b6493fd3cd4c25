"""The memory check at the door (``group_sizes.memory``): a config whose N would make a mechanism
exceed a worker's memory is refused in one line naming the file, the key and the rule, from
public quantities only; the shipped configs pass."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from censusdp_spark.engine.families import NOISE_GROUP_DEPTH, level_shapes
from censusdp_spark.group_sizes import memory
from censusdp_spark.group_sizes.config import GroupSizes, GroupSizesConfig, load_group_sizes_config
from censusdp_spark.group_sizes.memory import (
    check_memory,
    estimate_memory,
    worker_memory,
)
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import Hierarchy, LevelShape
from censusdp_spark.model.memory import parse_memory
from tests.helpers.geography import national_shapes_of

ROOT = Path(__file__).resolve().parents[2]
CALM = load_group_sizes_config(ROOT / "conf" / "pgsr_calm.toml", ROOT)
NATIONAL = load_group_sizes_config(ROOT / "conf" / "pgsr_national.toml", ROOT)
SCALABLE = ("dp", "cumulative", "relaxed_families")


@pytest.fixture(autouse=True)
def default_budget(monkeypatch):
    monkeypatch.delenv(memory.WORKER_MEMORY_ENV, raising=False)


def shapes_of(leaves: pd.Series, hierarchy: Hierarchy) -> list[LevelShape]:
    """``level_shapes`` in pandas, from the leaves' geocodes."""
    shapes = []
    for i, level in enumerate(hierarchy.levels):
        nodes = leaves.str[: level.digits].drop_duplicates()
        parent = nodes.str[: hierarchy.levels[max(i - 1, 0)].digits]
        group = nodes.str[: hierarchy.levels[max(i - NOISE_GROUP_DEPTH, 0)].digits]
        family, noise = parent.value_counts().max(), group.value_counts().max()
        shapes.append(LevelShape(level.name, len(nodes), int(family), int(noise)))
    return shapes


def calm_leaves() -> pd.Series:
    frame = pd.read_csv(ROOT / "data" / "calm" / "calm_taz_household_sizes.csv", dtype=str)
    return frame["county"] + frame["tract"] + frame["block_group"] + frame["taz"]


CALM_SHAPES = shapes_of(calm_leaves(), CALM.hierarchy)


@pytest.fixture(scope="module")
def national_shapes() -> list[LevelShape]:
    return national_shapes_of()


def with_sizes(config: GroupSizesConfig, sizes: int, mechanism: str) -> GroupSizesConfig:
    return replace(config, groups=GroupSizes(sizes, True), mechanism=mechanism)


@pytest.mark.parametrize("mechanism", [*SCALABLE, "relaxed"])
def test_the_shipped_calm_config_passes_with_every_mechanism(mechanism):
    found = check_memory(replace(CALM, mechanism=mechanism), CALM_SHAPES)
    assert 0 < found.bytes < 2**30 / 10  # well inside the default budget


@pytest.mark.parametrize("mechanism", SCALABLE)
def test_the_shipped_national_config_passes(national_shapes, mechanism):
    assert [s.nodes for s in national_shapes[1:]] == [51, 3_143, 84_414, 239_780, 8_132_968]
    found = check_memory(replace(NATIONAL, mechanism=mechanism), national_shapes)
    assert found.bytes < worker_memory() / 2


def test_the_whole_tree_qp_on_the_national_tree_is_refused_by_its_own_cell_limit(
    national_shapes,
):
    with pytest.raises(ConfigError, match=r"\[mechanism\] .*RELAXED_MAX_CELLS"):
        check_memory(replace(NATIONAL, mechanism="relaxed"), national_shapes)


@pytest.mark.parametrize("mechanism", [*SCALABLE, "relaxed"])
def test_a_huge_n_is_refused_in_one_line_naming_file_key_rule_estimate_and_fix(mechanism):
    config = with_sizes(CALM, 5_000_000, mechanism)
    with pytest.raises(ConfigError) as error:
        check_memory(config, CALM_SHAPES)
    message = str(error.value)
    assert "\n" not in message
    if mechanism == "relaxed":  # the whole-tree QP's own, smaller limit comes first
        assert message.startswith(f"{CALM.source}: [mechanism] ") and "RELAXED_MAX_CELLS" in message
        return
    assert message.startswith(f"{CALM.source}: [groups] max_size = 5,000,000: the {mechanism} ")
    assert "GiB for " in message and "more than CENSUSDP_WORKER_MEMORY = 4.0 GiB" in message
    assert "top-code" in message and "fewer sizes" in message
    assert "raise CENSUSDP_WORKER_MEMORY" in message


@pytest.mark.parametrize("mechanism", SCALABLE)
def test_the_estimate_grows_linearly_in_n_and_the_budget_is_the_setting(mechanism, monkeypatch):
    small, large = (
        estimate_memory(with_sizes(CALM, n, mechanism), CALM_SHAPES) for n in (10**5, 10**6)
    )
    assert large.bytes == pytest.approx(10 * small.bytes, rel=0.01)
    config = with_sizes(CALM, 10**6, mechanism)
    refused_at = large.bytes - 1
    with pytest.raises(ConfigError, match="CENSUSDP_WORKER_MEMORY"):
        check_memory(config, CALM_SHAPES, budget=refused_at)
    monkeypatch.setenv(memory.WORKER_MEMORY_ENV, str(large.bytes))
    assert check_memory(config, CALM_SHAPES) == large
    monkeypatch.setenv(memory.WORKER_MEMORY_ENV, str(refused_at))
    with pytest.raises(ConfigError, match="CENSUSDP_WORKER_MEMORY"):
        check_memory(config, CALM_SHAPES)


def test_a_larger_arrow_batch_holds_more_cells_in_one_call():
    config = with_sizes(CALM, 1000, "cumulative")
    default = estimate_memory(config, CALM_SHAPES).bytes
    assert estimate_memory(config, CALM_SHAPES, batch_rows=100).bytes < default
    assert estimate_memory(config, CALM_SHAPES, batch_rows=0).bytes >= default  # no limit


def test_memory_settings_parse_like_spark_and_a_bad_one_names_the_setting():
    setting = "CENSUSDP_WORKER_MEMORY"
    assert parse_memory("512m", setting) == 512 * 2**20
    assert parse_memory("4g", setting) == parse_memory("4GiB", setting) == 4 * 2**30
    assert parse_memory("4gb", setting) == 4 * 2**30
    assert parse_memory("1.5t", setting) == int(1.5 * 2**40)
    assert parse_memory("123", setting) == 123
    for bad in ("lots", "0g", "-1g", "4 gigabytes"):
        with pytest.raises(ValueError, match="CENSUSDP_WORKER_MEMORY"):
            parse_memory(bad, setting)
    assert worker_memory() == 4 * 2**30  # the default


def test_the_spark_shape_of_the_calm_geography_is_the_public_one(spark):
    from censusdp_spark.group_sizes.shapes import arrow_batch_rows, leaf_nodes

    leaves = spark.createDataFrame(pd.DataFrame({"geocode": calm_leaves()}))
    assert level_shapes(leaf_nodes(leaves, CALM.hierarchy), CALM.hierarchy) == CALM_SHAPES
    assert [s.nodes for s in CALM_SHAPES] == [1, 3, 35, 114, 930]
    assert arrow_batch_rows(spark) == memory.ARROW_BATCH_ROWS
