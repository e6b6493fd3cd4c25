"""Bypassing single-child parents (``[budget] bypass_single_child``): the accounting per path,
the public measurement plan, the per-node variances of the noisy measurements, and that a chain
of single-child parents is released as one node with the chain's budget would be."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from censusdp_spark.cli import main
from censusdp_spark.engine.hierarchy import node_histograms
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.privacy.accounting import BudgetError
from censusdp_spark.topdown.bypass import measurement_plan, plan_summary
from censusdp_spark.topdown.checks import check_measurements
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.estimate import estimate_level, level_measurements, level_plan
from censusdp_spark.topdown.measure import measure
from censusdp_spark.topdown.path_cuts import bypass_paths, cut_at, path_rho

ROOT = Path(__file__).resolve().parents[2]
SECRET = bytes(range(32))

# nation -> state 44 (the only state: bypassed) -> counties 44001, 44003;
# 44001 -> tracts 4400101 (two blocks), 4400102 (one block: bypassed);
# 44003 -> one tract 4400301 (44003 bypassed) -> three blocks.
BLOCKS = {
    "440010101": [3, 1, 0, 2],
    "440010102": [0, 4, 1, 1],
    "440010201": [2, 2, 2, 0],
    "440030101": [5, 0, 1, 1],
    "440030102": [0, 0, 0, 0],
    "440030103": [1, 3, 0, 6],
}
LEVELS = ["nation", "state", "county", "tract", "block"]


def config_doc(bypass: bool = True) -> dict:
    """Queries differ by level, so a bypassed node's family mixes query sets."""
    return {
        "run": {"name": "bypass"},
        "schema": {
            "attributes": [
                {"name": "age", "levels": ["young", "old"]},
                {"name": "kind", "levels": ["a", "b"]},
            ]
        },
        "geography": {
            "levels": [
                {"name": n, "digits": d} for n, d in zip(LEVELS, [0, 2, 5, 7, 9], strict=True)
            ]
        },
        "budget": {
            "rho": "1",
            "bypass_single_child": bypass,
            "levels": {
                "nation": {"share": "1/8", "queries": {"detailed": "1"}},
                "state": {"share": "1/4", "queries": {"total": "1/2", "age": "1/2"}},
                "county": {
                    "share": "1/8",
                    "queries": {"total": "1/4", "kind": "1/4", "detailed": "1/2"},
                },
                "tract": {"share": "1/4", "queries": {"total": "1/2", "detailed": "1/2"}},
                "block": {"share": "1/4", "queries": {"detailed": "1"}},
            },
        },
    }


def without_nation() -> dict:
    """The same run with the nation -> state chain as one node: the state is the root and
    spends the nation's share too."""
    doc = copy.deepcopy(config_doc())
    doc["geography"]["levels"] = [{"name": "state", "digits": 0}] + doc["geography"]["levels"][2:]
    levels = doc["budget"]["levels"]
    levels["state"]["share"] = "3/8"
    del levels["nation"]
    return doc


# --- accounting (exact, no Spark) ---------------------------------------------------------


@pytest.mark.parametrize("conf", ["ri_2010_demo.toml", "pl94_2020_production.toml"])
def test_every_way_bypassing_cuts_a_path_spends_exactly_the_configured_rho(conf):
    budget = load_topdown_config(ROOT / "conf" / conf, ROOT).budget
    paths = bypass_paths(budget)
    assert len(paths) == 2 ** (len(budget.levels) - 1)
    assert {rho for _, rho in paths} == {budget.total_rho}
    assert all(isinstance(rho, Fraction) for _, rho in paths)
    cut = cut_at(budget.levels, [False, True, True, False, True, True])
    assert cut == (("nation", "state"), ("county",), ("tract", "block_group"), ("block",))
    assert path_rho(budget, cut) == budget.total_rho


def test_a_chain_spends_the_sum_of_its_levels_split_by_its_lowest_levels_query_shares():
    budget = load_topdown_config(config_doc()).budget
    chain = budget.node_budget(("nation", "state"))
    assert [(e.level, e.query, e.rho) for e in chain] == [
        ("state", "total", Fraction(3, 16)),
        ("state", "age", Fraction(3, 16)),
    ]
    alone = load_topdown_config(without_nation()).budget
    assert [e.sigma2 for e in chain] == [alone.sigma2_for("state", q) for q in ("total", "age")]
    assert budget.node_budget(("tract",)) == tuple(e for e in budget.entries if e.level == "tract")


def test_a_cut_that_misses_or_repeats_a_level_is_refused():
    budget = load_topdown_config(config_doc()).budget
    with pytest.raises(BudgetError, match="do not cover the levels"):
        path_rho(budget, (("nation", "state"), ("tract",), ("block",)))
    with pytest.raises(BudgetError, match="not consecutive levels"):
        budget.node_budget(("nation", "county"))


def test_the_option_is_off_by_default_and_must_be_a_boolean():
    doc = config_doc()
    del doc["budget"]["bypass_single_child"]
    assert load_topdown_config(doc).bypass_single_child is False
    doc["budget"]["bypass_single_child"] = "yes"
    with pytest.raises(ConfigError, match="budget.bypass_single_child"):
        load_topdown_config(doc)


def test_budget_command_prints_the_chains_and_the_path_check(tmp_path, capsys):
    text = (ROOT / "conf" / "ri_2010_demo.toml").read_text()
    path = tmp_path / "ri_bypass.toml"
    path.write_text(text.replace("[budget]\n", "[budget]\nbypass_single_child = true\n", 1))
    assert main(["budget", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nation+state" in out and "0.962872" in out
    assert "all 32 ways bypassing can cut it re-added, each spends rho = 293764/114921" in out


# --- the plan, the measurements and the estimates (Spark) ---------------------------------


def histogram_rows(blocks: dict[str, list[int]]) -> list[tuple]:
    return [(g, [c for c, n in enumerate(h) if n], [n for n in h if n]) for g, h in blocks.items()]


def estimate_all(spark, config, noisy) -> dict[tuple[str, str], list[int]]:
    """Every level's estimates, as the job runs them (without Delta)."""
    invariants = spark.createDataFrame([], "geocode string, inv_total bigint")
    parent, out = None, {}
    levels = config.hierarchy.levels
    for i, level in enumerate(levels):
        rows = estimate_level(
            level_plan(config, level.name),
            level_measurements(noisy, config.hierarchy, level.name, config.bypass_single_child),
            invariants,
            parent,
            levels[i - 1].digits if i else 0,
        ).toPandas()
        for r in rows.itertuples():
            dense = np.zeros(config.schema.n_cells, dtype=np.int64)
            dense[np.asarray(r.cells, dtype=int)] = r.counts
            out[(level.name, r.geocode)] = dense.tolist()
        parent = spark.createDataFrame(
            rows[["geocode", "cells", "counts"]],
            "geocode string, cells array<int>, counts array<bigint>",
        )
    return out


@pytest.fixture(scope="module")
def run(spark):
    config = load_topdown_config(config_doc())
    blocks = spark.createDataFrame(
        histogram_rows(BLOCKS), "geocode string, cells array<int>, counts array<bigint>"
    )
    nodes = node_histograms(blocks, config.hierarchy).cache()
    plan = measurement_plan(nodes, config.hierarchy)
    summary = plan_summary(plan, config.budget, config.hierarchy)
    noisy = measure(nodes, config, SECRET, plan).cache()
    frame = noisy.toPandas()
    estimates = estimate_all(spark, config, noisy)
    # The one-node run on the very same noisy numbers: the state's rows as the root's.
    alone = load_topdown_config(without_nation())
    relabelled = noisy.selectExpr(
        "level",
        "CASE WHEN level = 'state' THEN '' ELSE geocode END AS geocode",
        "query",
        "noisy",
        "sigma2",
        "filter(budget_levels, l -> l != 'nation') AS budget_levels",
    )
    return {
        "config": config,
        "plan": plan.toPandas(),
        "summary": summary,
        "noisy": noisy,
        "frame": frame,
        "estimates": estimates,
        "alone": estimate_all(spark, alone, relabelled),
        "alone_config": alone,
    }


def test_the_plan_bypasses_exactly_the_single_child_parents(run):
    plan = run["plan"]
    spent = {(r.level, r.geocode): r.budget_levels for r in plan.itertuples() if r.measured}
    assert sorted((r.level, r.geocode) for r in plan.itertuples() if not r.measured) == [
        ("county", "44003"),
        ("nation", ""),
        ("tract", "4400102"),
    ]
    assert list(spent[("state", "44")]) == ["nation", "state"]
    assert list(spent[("tract", "4400301")]) == ["county", "tract"]
    assert list(spent[("block", "440010201")]) == ["tract", "block"]
    assert list(spent[("block", "440010101")]) == ["block"]
    summary = run["summary"]
    assert summary.bypassed["county"] == ["44003"]
    assert {tuple(map(tuple, c)): n for c, n, _ in summary.paths} == {
        (("nation", "state"), ("county",), ("tract",), ("block",)): 2,
        (("nation", "state"), ("county",), ("tract", "block")): 1,
        (("nation", "state"), ("county", "tract"), ("block",)): 3,
    }
    assert {rho for _, _, rho in summary.paths} == {Fraction(1)}
    manifest = summary.manifest()
    assert manifest["bypassed_nodes"] == {
        "nation": 1,
        "state": 0,
        "county": 1,
        "tract": 1,
        "block": 0,
    }
    chain = next(b for b in manifest["node_budgets"] if b["level"] == "state")
    assert chain["rho"] == "3/8" and chain["budget_levels"] == ["nation", "state"]


def test_bypassed_parents_are_not_measured_and_every_row_has_its_nodes_exact_variance(run):
    frame, budget = run["frame"], run["config"].budget
    measured = set(zip(frame["level"], frame["geocode"], strict=True))
    assert ("nation", "") not in measured and ("county", "44003") not in measured
    assert ("tract", "4400102") not in measured
    for r in frame.itertuples():
        wanted = {e.query: e.sigma2 for e in budget.node_budget(tuple(r.budget_levels))}
        assert Fraction(r.sigma2) == wanted[r.query]
    state = frame[frame["level"] == "state"].set_index("query")["sigma2"]
    alone = run["alone_config"].budget
    assert {q: Fraction(s) for q, s in state.items()} == {
        q: alone.sigma2_for("state", q) for q in ("total", "age")
    }
    paths = [cut for cut, _, _ in run["summary"].paths]
    assert check_measurements(run["noisy"], budget, paths) == {
        "noise_variances_not_from_budget": 0,
        "paths_not_spending_rho": 0,
    }


def test_a_chain_is_released_as_one_node_with_the_chains_budget(run):
    """nation -> state is one node: with bypassing the state's (and the nation's) release is
    the state's as the root of a run where it spends both shares, from the same noisy values;
    so is every node below, whose families mix bypassed and measured children."""
    got, alone = run["estimates"], run["alone"]
    assert got[("nation", "")] == got[("state", "44")] == alone[("state", "")]
    below = {key: value for key, value in got.items() if key[0] not in ("nation", "state")}
    assert below == {key: value for key, value in alone.items() if key[0] != "state"}


def test_bypassed_parents_equal_their_only_child_and_children_sum_to_parents(run):
    got = run["estimates"]
    assert got[("county", "44003")] == got[("tract", "4400301")]
    assert got[("tract", "4400102")] == got[("block", "440010201")]
    for (level, geocode), hist in got.items():
        i = LEVELS.index(level)
        if i + 1 < len(LEVELS):
            kids = [
                h
                for (lv, g), h in got.items()
                if lv == LEVELS[i + 1] and g[: len(geocode)] == geocode
            ]
            assert np.sum(kids, axis=0).tolist() == hist
