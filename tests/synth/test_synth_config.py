"""The synthetic-data config: both shipped configs load; every rule is checked at the door."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from censusdp_spark.model.errors import ConfigError
from censusdp_spark.synth.config import (
    household_count,
    load_synth_config,
    mwem_fit_text,
    mwem_refusal,
    refuse_unfit_method,
)

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
[input]
households = "h.csv"
persons = "p.csv"
household_id = "ID"
member_order = "ORD"
max_members = 3

[budget]
rho = "1/10"
rounds = 5

[[group]]
name = "tenure"
column = "TEN"
levels = { owned = [1, 2], rented = [3] }

[[individual]]
name = "age"
column = "AGEP"
ranges = { child = [0, 18], adult = [18, 200] }
"""


def load(tmp_path: Path, text: str):
    path = tmp_path / "synth.toml"
    path.write_text(text)
    return load_synth_config(path, tmp_path)


def test_shipped_configs_load_with_the_documented_attributes():
    full = load_synth_config(ROOT / "conf" / "synth_pums.toml", ROOT)
    reduced = load_synth_config(ROOT / "conf" / "synth_pums_reduced.toml", ROOT)
    assert (len(full.domain.group), len(full.domain.individual), full.domain.max_members) == (
        10,
        11,
        10,
    )
    assert (
        len(reduced.domain.group),
        len(reduced.domain.individual),
        reduced.domain.max_members,
    ) == (4, 4, 3)
    assert full.domain.roles is not None and full.domain.roles.max_members == 6
    assert full.input.households == ROOT / "data" / "pums" / "households.csv"
    assert reduced.budget.rho == Fraction(1, 10) and reduced.budget.select_share == Fraction(1, 2)


def test_minimal_config_gets_defaults(tmp_path):
    config = load(tmp_path, MINIMAL)
    assert config.degree == 2 and config.domain.roles is None  # |S| = 3 needs three attributes
    assert config.domain.individual[0].levels == ("child", "adult")
    assert config.hpd_fixed.components > 0
    assert not config.input.drop_larger  # households over M are input errors unless dropped


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t + "\n[colour]\nx = 1\n", "unknown key(s) ['colour']"),
        (
            lambda t: t.replace('column = "TEN"', 'column = "TEN"\nbins = 3'),
            "unknown key(s) ['bins']",
        ),
        (lambda t: t.replace('rho = "1/10"', "rho = 0.1"), "is a float"),
        (lambda t: t.replace("rounds = 5", "rounds = 0"), "budget.rounds"),
        (lambda t: t.replace("rented = [3]", "rented = [2]"), "value 2 is in two levels"),
        (lambda t: t.replace("adult = [18, 200]", "adult = [17, 200]"), "ranges overlap"),
        (
            lambda t: t.replace("rented = [3]", "rented = []"),
            "only the 'missing' level may be empty",
        ),
        (lambda t: t.replace("max_members = 3", "max_members = 11"), "at most 10"),
        (
            lambda t: (
                t + '\n[relationships]\nattribute = "rel"\nhead = "h"\nspouse = "s"\nchild = "c"\n'
            ),
            "not an individual attribute",
        ),
        (lambda t: t + "\n[hpd_fixed]\nlearning_rate = -1\n", "positive number"),
        (
            lambda t: t.replace('column = "AGEP"', 'column = "TEN"'),
            "[group/individual] column 'TEN' is declared at both levels",
        ),
        (
            lambda t: t.replace("max_members = 3", 'max_members = 3\nlarger_households = "keep"'),
            "[input.larger_households] 'keep' must be one of ('refuse', 'drop')",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_key(tmp_path, edit, message):
    with pytest.raises(
        ConfigError,
        match=message.replace("[", r"\[")
        .replace("]", r"\]")
        .replace("(", r"\(")
        .replace(")", r"\)"),
    ):
        load(tmp_path, edit(MINIMAL))


def test_rounds_scale_with_the_square_root_of_rho_when_a_reference_is_set(tmp_path):
    budget = load_synth_config(ROOT / "conf" / "synth_pums.toml", ROOT).budget
    assert budget.rounds_at_rho == Fraction(1, 50)
    assert [budget.rounds_for(Fraction(1, 50 * 4**k)) for k in range(4)] == [60, 30, 15, 8]
    assert budget.rounds_for(Fraction(1, 10**9)) == 1
    assert load(tmp_path, MINIMAL).budget.rounds_for(Fraction(1, 10**6)) == 5  # no reference


def test_a_domain_too_large_for_mwem_is_refused_from_the_config_alone(tmp_path):
    """Two household levels times the 2 + 3 + 4 multisets of one to three persons of two
    levels: 18 households. The inputs named do not exist: nothing is read to decide."""
    config = load(tmp_path, MINIMAL + "\n[mwem]\nmax_domain = 17\n")
    assert not config.input.households.exists() and config.domain.explicit_size() == 18
    with pytest.raises(ConfigError) as refused:
        refuse_unfit_method(config, "mwem")
    message = str(refused.value)
    assert message.count("\n") == 0 and message.startswith(f"{tmp_path / 'synth.toml'}: ")
    assert "[mwem.max_domain]" in message and "18 households, above the limit 17" in message
    for method in ("hpd_fixed", "hpd_gen", "independent"):
        refuse_unfit_method(config, method)  # they never enumerate the domain
    assert mwem_refusal(load(tmp_path, MINIMAL + "\n[mwem]\nmax_domain = 18\n")) is None


def test_mwem_domain_sizes_of_the_shipped_configs_are_reported_before_any_run():
    full = load_synth_config(ROOT / "conf" / "synth_pums.toml", ROOT)
    reduced = load_synth_config(ROOT / "conf" / "synth_pums_reduced.toml", ROOT)
    assert mwem_refusal(reduced) is None
    assert mwem_fit_text(reduced) == (
        "MWEM's explicit domain: 134,976 households, limit mwem.max_domain = 2,000,000 (fits)"
    )
    assert "~2.63e57 households" in mwem_fit_text(full) and "--method mwem is refused" in (
        mwem_fit_text(full)
    )
    assert household_count(10**12 - 1) == "999,999,999,999"
    assert household_count(2 * 10**400) == "~2.00e400"  # past what a float holds
