from fractions import Fraction
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.privacy import zcdp_to_approx_dp
from censusdp_spark.privacy.accounting import (
    BudgetError,
    allocate_by_shares,
    allocate_per_query_rho,
    split_epsilon,
)
from censusdp_spark.topdown.config import load_topdown_config

ROOT = Path(__file__).resolve().parents[2]


def test_production_persons_budget_matches_the_certificate():
    config = load_topdown_config(ROOT / "conf" / "pl94_2020_production.toml", ROOT)
    assert config.budget.total_rho == Fraction(293764, 114921)
    assert round(zcdp_to_approx_dp(config.budget.total_rho, 1e-10), 2) == 17.14


@pytest.mark.parametrize(
    "level, query, sigma",
    [
        ("block", "detailed", 3.18),
        ("county", "total", 2.17),
        ("state", "total", 1.10),
        ("block", "total", 89.2),
    ],
)
def test_production_sigmas_match_the_published_table(level, query, sigma):
    config = load_topdown_config(ROOT / "conf" / "pl94_2020_production.toml", ROOT)
    assert float(config.budget.sigma2_for(level, query)) ** 0.5 == pytest.approx(sigma, rel=5e-3)


def test_production_units_budget_matches_the_certificate():
    config = load_topdown_config(ROOT / "conf" / "pl94_2020_units.toml", ROOT)
    assert config.budget.total_rho == Fraction(11417641, 152349649)
    assert round(zcdp_to_approx_dp(config.budget.total_rho, 1e-10), 2) == 2.47


def test_budget_command_prints_the_table_and_totals(capsys):
    assert main(["budget", "--config", str(ROOT / "conf" / "pl94_2020_production.toml")]) == 0
    out = capsys.readouterr().out
    assert "total rho = 293764/114921 = 2.556226" in out
    assert "17.14" in out
    assert "block" in out and "votingage * hispanic * cenrace" in out


def test_shares_multiply_into_exact_per_query_rho():
    alloc = allocate_by_shares(
        Fraction(1),
        {"a": Fraction(1, 3), "b": Fraction(2, 3)},
        {"a": {"total": Fraction(1)}, "b": {"total": Fraction(1, 4), "detailed": Fraction(3, 4)}},
        ["a", "b"],
    )
    assert alloc.rho_for("b", "detailed") == Fraction(1, 2)
    assert alloc.sigma2_for("b", "detailed") == 2


def test_per_query_rho_mode_adds_up_and_derives_shares():
    alloc = allocate_per_query_rho(
        {"a": {"total": Fraction(1, 10)}, "b": {"detailed": Fraction(3, 10)}}, ["a", "b"]
    )
    assert alloc.total_rho == Fraction(2, 5)
    assert alloc.entries[1].level_share == Fraction(3, 4)


def test_a_float_share_is_refused_naming_the_entry():
    with pytest.raises(
        BudgetError, match=r"budget.levels.a.queries.total: 0.5 must be an exact fraction"
    ):
        allocate_by_shares(Fraction(1), {"a": Fraction(1)}, {"a": {"total": 0.5}}, ["a"])  # type: ignore[dict-item]


def test_a_missing_level_share_is_named():
    with pytest.raises(BudgetError, match="budget.levels.b: missing level share"):
        allocate_by_shares(
            Fraction(1),
            {"a": Fraction(1)},
            {"a": {"total": Fraction(1)}, "b": {"total": Fraction(1)}},
            ["a", "b"],
        )


def test_pure_dp_split_gives_geometric_scales():
    split = split_epsilon(Fraction(1), {"nation": Fraction(1, 2), "state": Fraction(1, 2)})
    assert split.scale("state", 2) == 4
    with pytest.raises(BudgetError, match="sum to 3/4"):
        split_epsilon(Fraction(1), {"nation": Fraction(1, 2), "state": Fraction(1, 4)})
