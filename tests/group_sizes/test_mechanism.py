"""The mechanism names: ``exact`` names the dynamic program and ``dp`` stays accepted, in a
config and on the command line, and either records ``dp``, so a release's manifest and the
contents its secret is bound to do not depend on the name used."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from censusdp_spark.cli import build_parser
from censusdp_spark.group_sizes.config import (
    MECHANISM_NAMES,
    Mechanism,
    load_group_sizes_config,
)
from censusdp_spark.model.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CALM = tomllib.loads((ROOT / "conf" / "pgsr_calm.toml").read_text())


def calm_with(mechanism: object) -> dict:
    return {**CALM, "mechanism": {**CALM["mechanism"], "default": mechanism}}


@pytest.mark.parametrize("name", ["exact", "dp"])
def test_exact_and_dp_name_the_dynamic_program_which_records_dp(name):
    config = load_group_sizes_config(calm_with(name), ROOT)
    assert config.mechanism is Mechanism.EXACT
    assert config.mechanism.value == "dp" and f"{config.mechanism}" == "dp"


def test_every_other_mechanism_records_its_own_name():
    for name in ("relaxed", "relaxed_families", "cumulative"):
        mechanism = load_group_sizes_config(calm_with(name), ROOT).mechanism
        assert mechanism is Mechanism.named(name) and mechanism.value == name


def test_a_config_without_a_default_runs_the_dynamic_program():
    config = dict(CALM)
    del config["mechanism"]
    assert load_group_sizes_config(config, ROOT).mechanism is Mechanism.EXACT


def test_an_unknown_mechanism_is_refused_naming_every_accepted_one():
    with pytest.raises(ConfigError, match=r"mechanism\.default"):
        load_group_sizes_config(calm_with("dynamic"), ROOT)
    with pytest.raises(ValueError, match="exact, dp, relaxed, relaxed_families, cumulative"):
        Mechanism.named("dynamic")


@pytest.mark.parametrize("name", MECHANISM_NAMES)
def test_the_command_line_accepts_every_name(name):
    args = build_parser().parse_args(["group-sizes", "--config", "c.toml", "--mechanism", name])
    assert Mechanism.named(args.mechanism) is Mechanism.named(name)
