"""The budget optimizer: workloads, the expected error of a config's allocation, the
optimizer's result and the config it writes."""

from __future__ import annotations

import re
import tomllib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from censusdp_spark.model.errors import ConfigError
from censusdp_spark.topdown import strategy
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.solvers.expected_error import FieldGrams, final_covariances
from censusdp_spark.topdown.solvers.gaussian_estimates import LevelDesign

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "conf" / "pl94_2020_production.toml"
DEMO = ROOT / "conf" / "ri_2010_demo.toml"
PERRY_NODES = {"nation": 1, "state": 1, "county": 1, "tract": 3, "block_group": 12, "block": 511}
RI_NODES = {"nation": 1, "state": 1, "county": 5, "tract": 244, "block_group": 815, "block": 25181}


@pytest.fixture(scope="module")
def production():
    return load_topdown_config(PRODUCTION)


@pytest.fixture(scope="module")
def demo():
    return load_topdown_config(DEMO)


def write_workload(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "workload.toml"
    path.write_text(text)
    return path


def test_the_pl94_preset_is_p1_to_p4_at_three_levels(production):
    workload = strategy.load_workload("pl94", production)
    assert [t.name for t in workload.tables] == ["P1", "P2", "P3", "P4"]
    assert dict(workload.levels) == {"county": 1.0, "tract": 1.0, "block_group": 1.0}
    for table in workload.tables:
        assert table.fields.shape[0] == production.schema.n_cells
        assert set(np.unique(table.fields)) <= {0, 1}
    # P1's first field is the total population: every cell counts once
    assert workload.tables[0].fields[:, 0].sum() == production.schema.n_cells


def test_a_workload_file_of_queries_and_weights(demo, tmp_path):
    path = write_workload(
        tmp_path,
        'queries = ["votingage * hisprace", "total"]\n[levels]\ncounty = 2.0\ntract = 0.5\n',
    )
    workload = strategy.load_workload(path, demo)
    assert [t.fields.shape[1] for t in workload.tables] == [16, 1]
    assert dict(workload.levels) == {"county": 2.0, "tract": 0.5}


@pytest.mark.parametrize(
    ("text", "key", "rule"),
    [
        ('queries = ["total"]\n[levels]\nward = 1.0\n', "levels.ward", "not a level"),
        ('queries = ["total"]\n[levels]\ncounty = 0.0\n', "levels.county", "must be > 0"),
        ('queries = ["total"]\n[levels]\n', "levels", "names no level"),
        ("[levels]\ncounty = 1.0\n", "-", "names no table and no query"),
        ('queries = ["age"]\n[levels]\ncounty = 1.0\n', "queries", "age"),
        ('tables = ["P1"]\n[levels]\ncounty = 1.0\n', "tables", "no [output.pl94_tables]"),
        ('queries = ["total"]\nweights = 1\n[levels]\ncounty = 1.0\n', "", "weights"),
    ],
)
def test_a_bad_workload_file_is_refused_naming_it_and_the_key(demo, tmp_path, text, key, rule):
    path = write_workload(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(rule)) as raised:
        strategy.load_workload(path, demo)
    assert str(path) in str(raised.value)
    if key:
        assert raised.value.key == key


def test_an_unknown_table_is_refused(production, tmp_path):
    path = write_workload(tmp_path, 'tables = ["P9"]\n[levels]\ntract = 1.0\n')
    with pytest.raises(ConfigError, match="unknown table 'P9'"):
        strategy.load_workload(path, production)


def test_the_configs_allocation_is_its_sigmas(production):
    allocation = strategy.Allocation.of(production)
    assert sum(allocation.levels.values()) == pytest.approx(1.0)
    rho = float(production.budget.total_rho)
    for level in production.hierarchy.names:
        assert sum(allocation.queries[level].values()) == pytest.approx(1.0)
        for q in production.queries[level]:
            weight = rho * allocation.levels[level] * allocation.queries[level][q.name]
            assert weight == pytest.approx(1 / float(production.budget.sigma2_for(level, q.name)))


def test_the_models_errors_are_those_of_the_configs_own_sigmas(demo, tmp_path):
    """An independent path: every level's design weighted by ``1 / sigma^2`` from the config's
    budget accounting, dense covariances, the workload's fields."""
    path = write_workload(tmp_path, 'queries = ["votingage * hisprace"]\n[levels]\ncounty = 1.0\n')
    workload = strategy.load_workload(path, demo)
    model = strategy.ErrorModel(demo, RI_NODES, workload)
    designs = [
        LevelDesign(
            level=level,
            marginals=tuple(q.cell_to_marginal for q in demo.queries[level]),
            marginal_sizes=tuple(q.size for q in demo.queries[level]),
            weights=np.array(
                [1 / float(demo.budget.sigma2_for(level, q.name)) for q in demo.queries[level]]
            ),
        )
        for level in demo.hierarchy.names
    ]
    names = demo.hierarchy.names
    fanouts = [1.0] + [RI_NODES[b] / RI_NODES[a] for a, b in zip(names, names[1:], strict=False)]
    exact = [True, True, False, False, False, False]  # the state invariant, and the nation
    covariances = final_covariances(designs, fanouts, exact, "full_information")
    fields = FieldGrams(workload.tables[0].fields, None)
    for row in model.errors(strategy.Allocation.of(demo)):
        variances = fields.variances(covariances[names.index(row.level)])
        assert row.l1 == pytest.approx(np.sqrt(2 * variances / np.pi).sum(), rel=1e-9)
        assert row.largest_sd == pytest.approx(np.sqrt(variances.max()), rel=1e-9)


def test_exact_shares_sum_to_one_and_stay_positive():
    shares = strategy._exact_shares({"a": 0.9999, "b": 1e-9, "c": 1e-4, "d": 0.00003})
    assert sum(shares.values()) == 1
    assert all(isinstance(s, Fraction) and s >= Fraction(1, 10_000) for s in shares.values())
    assert shares["a"] == Fraction(9997, 10_000)


@pytest.fixture(scope="module")
def optimized_demo(demo, tmp_path_factory):
    path = write_workload(
        tmp_path_factory.mktemp("workload"),
        'queries = ["votingage * hisprace", "total"]\n'
        "[levels]\ncounty = 1.0\ntract = 1.0\nblock_group = 1.0\n",
    )
    workload = strategy.load_workload(path, demo)
    model = strategy.ErrorModel(demo, RI_NODES, workload)
    return model, strategy.optimize(model)


def test_the_optimum_beats_the_config_and_every_nearby_allocation(optimized_demo):
    model, optimized = optimized_demo
    assert optimized.objective < 0.95 * optimized.baseline_objective
    found = optimized.allocation.as_floats()
    assert model.objective(found) == pytest.approx(optimized.objective)
    rng = np.random.default_rng(5)
    for _ in range(20):  # shares moved by up to 10%, renormalised
        levels = {lv: s * rng.uniform(0.9, 1.1) for lv, s in found.levels.items()}
        norm = sum(levels.values())
        queries = {}
        for lv, qs in found.queries.items():
            moved = {q: s * rng.uniform(0.9, 1.1) for q, s in qs.items()}
            queries[lv] = {q: s / sum(moved.values()) for q, s in moved.items()}
        nearby = strategy.Allocation({lv: s / norm for lv, s in levels.items()}, queries)
        assert model.objective(nearby) >= optimized.objective * (1 - 1e-3)


def test_the_optimizer_is_deterministic(optimized_demo):
    model, optimized = optimized_demo
    assert strategy.optimize(model).allocation == optimized.allocation


def test_the_written_config_holds_the_optimized_budget_and_the_rest_unchanged(
    demo, optimized_demo, tmp_path
):
    _, optimized = optimized_demo
    out = tmp_path / "optimized.toml"
    strategy.write_config(DEMO, demo, optimized.allocation, out)
    written = load_topdown_config(out)
    assert written.budget.total_rho == demo.budget.total_rho
    again = strategy.Allocation.of(written).exact()
    assert again == optimized.allocation
    before, after = tomllib.loads(DEMO.read_text()), tomllib.loads(out.read_text())
    assert {k: v for k, v in before.items() if k != "budget"} == {
        k: v for k, v in after.items() if k != "budget"
    }


def test_a_production_evaluation_is_fast_enough_to_optimize(production):
    """Not a timing threshold: the compact path must stay compact (15 x 15 blocks)."""
    model = strategy.ErrorModel(production, PERRY_NODES, strategy.load_workload("pl94", production))
    covariance = model.covariances(strategy.Allocation.of(production))[3]
    assert covariance.blocks.shape == (4, 15, 15)


def test_no_share_falls_below_a_hundredth_of_the_largest(optimized_demo):
    """The bound that keeps the fits' precisions well-conditioned (``SHARE_RATIO``)."""
    _, optimized = optimized_demo
    allocation = optimized.allocation
    shares = [
        allocation.levels[lv] * s for lv, qs in allocation.queries.items() for s in qs.values()
    ]
    assert min(shares) >= max(shares) / strategy.SHARE_RATIO * Fraction(9, 10)  # exact rounding
