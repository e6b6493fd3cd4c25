"""Each method end to end on the real reduced PUMS data (few rounds, so the suite stays fast)."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.synth.adaptive import adaptive_measurements, plan_budget, workload_max_errors
from censusdp_spark.synth.config import MwemOptions, load_synth_config
from censusdp_spark.synth.domain import ABSENT, decode, encode_tables
from censusdp_spark.synth.evaluation import error_rows
from censusdp_spark.synth.hpd import FixedModel, HpdSynthesiser, Layout
from censusdp_spark.synth.independent import one_way_workloads
from censusdp_spark.synth.mwem import MwemSynthesiser, domain_size
from censusdp_spark.synth.product import expected_answers
from censusdp_spark.synth.synthesise import MethodOptions, synthesise, training_workloads
from censusdp_spark.synth.workloads import (
    WorkloadSet,
    answers,
    marginal_workloads,
    relationship_workloads,
    totals_of,
)
from tests.helpers.synth import random_households, small_domain

ROOT = Path(__file__).resolve().parents[2]
SECRET = bytes(range(1, 33))


@pytest.fixture(scope="module")
def reduced():
    config = load_synth_config(ROOT / "conf" / "synth_pums_reduced.toml", ROOT)
    spec = config.input
    households = pd.read_csv(spec.households, dtype=str)
    persons = pd.read_csv(spec.persons, dtype=str)
    encoded = encode_tables(
        config.domain, households, persons, spec.household_id, spec.member_order
    )
    return config, encoded.households


def fast_options(config, rounds: int = 3) -> MethodOptions:
    return MethodOptions(
        rounds,
        config.budget.select_share,
        config.mwem,
        replace(config.hpd_fixed, components=32, steps_per_round=40),
        replace(config.hpd_gen, components=32, steps_per_round=40),
    )


def run(
    config, households, method: str, rho=Fraction(1, 2), rounds: int = 3, secret: bytes = SECRET
):
    domain = config.domain
    candidates = training_workloads(method, domain, config.degree)
    truth = answers(households, domain, candidates)
    return synthesise(
        method,
        domain,
        candidates,
        truth,
        totals_of(households, domain),
        rho,
        fast_options(config, rounds),
        secret,
    )


def uniform_error(config, households, workloads) -> float:
    layout = Layout.of(config.domain)
    model = FixedModel(layout, 1, 0.0, np.random.default_rng(0))
    totals = totals_of(households, config.domain)
    uniform = expected_answers(model.mixture(), workloads, totals.households / totals.individuals)
    return float(np.abs(uniform - answers(households, config.domain, workloads)).mean())


@pytest.mark.parametrize("method", ["mwem", "hpd_fixed", "hpd_gen", "independent"])
def test_method_releases_valid_households_spends_rho_exactly_and_beats_uniform(reduced, method):
    config, households = reduced
    result = run(config, households, method)
    synthetic = result.households
    assert synthetic.n_households == households.n_households == 3414
    assert result.rho_spent() == Fraction(1, 2)
    assert (
        synthetic.members[:, 0, config.domain.roles.attribute] == config.domain.roles.head
    ).all()
    assert (
        synthetic.members[:, 1:, config.domain.roles.attribute] != config.domain.roles.head
    ).all()
    workloads = marginal_workloads(config.domain, config.degree)
    truth = answers(households, config.domain, workloads)
    model = error_rows(truth, result.model_answers(workloads), workloads, "model")
    tables = error_rows(truth, answers(synthetic, config.domain, workloads), workloads, "tables")
    baseline = uniform_error(config, households, workloads)
    assert all(row["mean_error"] < 0.7 * baseline for row in model + tables), (
        model,
        tables,
        baseline,
    )


def test_relationship_queries_are_answered_on_the_synthetic_tables(reduced):
    config, households = reduced
    result = run(config, households, "hpd_fixed")
    workloads = relationship_workloads(config.domain, config.degree)
    rows = error_rows(
        answers(households, config.domain, workloads),
        answers(result.households, config.domain, workloads),
        workloads,
        "tables",
    )
    assert rows[0]["query_class"] == "Q_R" and rows[0]["queries"] == workloads.n_queries
    assert 0 < rows[0]["mean_error"] < 0.05


def test_same_secret_reproduces_the_synthetic_households(reduced):
    config, households = reduced
    a, b = (
        run(config, households, "hpd_gen", rounds=2),
        run(config, households, "hpd_gen", rounds=2),
    )
    c = run(config, households, "hpd_gen", rounds=2, secret=bytes(32))
    np.testing.assert_array_equal(a.households.members, b.households.members)
    np.testing.assert_array_equal(a.households.group, b.households.group)
    assert not np.array_equal(a.households.members, c.households.members)


def test_decoded_tables_carry_level_names_and_one_row_per_person(reduced):
    config, households = reduced
    house, persons = decode(config.domain, households)
    assert len(house) == households.n_households and len(persons) == households.n_individuals
    assert set(house["tenure"]) == {"owned", "rented"}
    assert (
        persons.groupby("household_id")["member"].max().to_numpy() == house["members"].to_numpy()
    ).all()
    assert (households.members[households.present] != ABSENT).all()


def test_mwem_domain_is_explicit_on_the_reduced_data_and_refused_on_the_full_data(reduced):
    config, _ = reduced
    assert domain_size(config.domain) == 16 * 12 * (1 + 36 + 36 * 37 // 2)
    full = load_synth_config(ROOT / "conf" / "synth_pums.toml", ROOT)
    with pytest.raises(ValueError, match="use the reduced config"):
        MwemSynthesiser(full.domain, full.mwem, 0.4, 2.4)


def measured_errors(synth, measurements, truth_of) -> np.ndarray:
    """Max error of the model on each measured workload."""
    chosen = WorkloadSet(tuple(m.workload for m in measurements))
    return workload_max_errors(truth_of(chosen), synth.answers(chosen), chosen)


def noise_free_synthesiser(method: str, domain, totals):
    ratio, mean_size = (
        totals.households / totals.individuals,
        totals.individuals / totals.households,
    )
    if method == "mwem":
        return MwemSynthesiser(domain, MwemOptions(passes=10), ratio, mean_size)
    model = FixedModel(Layout.of(domain, np.float64), 16, 0.5, np.random.default_rng(0))
    return HpdSynthesiser(model, 100, 0.05, ratio, mean_size)


@pytest.mark.parametrize("method", ["hpd_fixed", "mwem"])
def test_fitting_without_noise_drives_the_error_on_measured_queries_to_zero(method):
    """ρ = 10¹² stands for ρ = ∞ through the real mechanisms: σ ≈ 10⁻⁸, and selection is the
    argmax. The fit must then reproduce every measured workload almost exactly. (HPD-Gen is left
    out: its fresh latent draws every step leave a sampling floor.)"""
    domain = small_domain(max_members=3)
    households = random_households(domain, 400, seed=7)
    totals = totals_of(households, domain)
    candidates = training_workloads(method, domain, 2)
    truth = answers(households, domain, candidates)
    synth = noise_free_synthesiser(method, domain, totals)
    plan = plan_budget(Fraction(10**12), 5, Fraction(1, 2), len(one_way_workloads(domain)))
    result = adaptive_measurements(synth, candidates, truth, totals, plan, SECRET, "noise-free")
    assert max(m.sigma for m in result.measurements) < 1e-7
    truth_of = lambda w: answers(households, domain, w)  # noqa: E731
    before = measured_errors(
        noise_free_synthesiser(method, domain, totals), result.measurements, truth_of
    )
    for _ in range(10):
        synth.fit(result.targets())
    after = measured_errors(synth, result.measurements, truth_of)
    assert after.max() < min(0.005, before.max() / 10), (before.max(), after.max())
