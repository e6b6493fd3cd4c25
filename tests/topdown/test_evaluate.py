"""The evaluation against truth: one Spark job for every row, checked against plain pandas and
numpy recomputations (the baseline against one plain sampler call per block), and the
baseline's expected error against brute-force convolution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.privacy import discrete_gaussian, keyed_rng
from censusdp_spark.topdown import evaluate
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.evaluate import (
    BASELINE_BLOCKS_PER_TASK,
    EVALUATION_COLUMNS,
    EXACT_VARIANCE,
    evaluation_table,
    expected_abs_sum,
)

ROOT = Path(__file__).resolve().parents[2]
SECRET = bytes(range(32))


@pytest.fixture(scope="module")
def config():
    return load_topdown_config(ROOT / "conf" / "ri_2010_demo.toml")


def random_blocks(rng: np.random.Generator, n_cells: int) -> tuple[pd.DataFrame, list[str]]:
    """Blocks (15 digits) in 2 counties, 3 tracts, a few block groups; sparse histograms."""
    geocodes = sorted(
        {
            f"44{c:03d}{t:06d}{g:01d}{b:03d}"
            for c, t, g, b in zip(
                rng.choice([1, 7], 40),
                rng.choice([100, 200, 300], 40),
                rng.integers(1, 3, 40),
                rng.integers(1000, 1010, 40),
                strict=True,
            )
        }
    )
    counts = rng.integers(0, 4, size=(len(geocodes), n_cells)) * (
        rng.random((len(geocodes), 1)) < 0.8
    )
    rows = [
        (g, c, int(counts[i, c]))
        for i, g in enumerate(geocodes)
        for c in range(n_cells)
        if counts[i, c]
    ]
    return pd.DataFrame(rows, columns=["geocode", "cell", "count"]), geocodes


def up_the_hierarchy(blocks: pd.DataFrame, config) -> pd.DataFrame:
    return pd.concat(
        [
            blocks.assign(level=lv.name, geocode=blocks["geocode"].str[: lv.digits])
            .groupby(["level", "geocode", "cell"], as_index=False)["count"]
            .sum()
            for lv in config.hierarchy.levels
        ]
    )


@pytest.fixture(scope="module")
def small_run(config):
    """Random blocks, their truth at every level and estimates off by a little (with cells the
    truth does not have), as pandas frames; every block is a node, populated or not."""
    rng = np.random.default_rng(3)
    n_cells = config.schema.n_cells
    blocks, geocodes = random_blocks(rng, n_cells)
    truth = up_the_hierarchy(blocks, config)
    estimates = truth.assign(count=truth["count"] + rng.integers(-2, 3, len(truth)))
    estimates = estimates[estimates["count"] > 0]
    extra = truth.sample(5, random_state=1).assign(cell=n_cells - 1, count=7)  # truth has none
    estimates = pd.concat([estimates, extra]).groupby(["level", "geocode", "cell"]).sum()
    node_counts = {
        lv.name: len({g[: lv.digits] for g in geocodes}) for lv in config.hierarchy.levels
    }
    return truth, estimates.reset_index(), geocodes, node_counts


@pytest.fixture(
    scope="module", params=[BASELINE_BLOCKS_PER_TASK, 7], ids=["one task", "tasks of 7"]
)
def table(request, spark, config, small_run):
    """The evaluation of the small run, in one job (the baseline's blocks drawn in one task, or
    spread over tasks of 7 blocks: the numbers may not depend on it)."""
    truth, estimates, geocodes, node_counts = small_run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "BASELINE_BLOCKS_PER_TASK", request.param)
        return evaluation_table(
            spark.createDataFrame(truth),
            spark.createDataFrame(estimates),
            spark.createDataFrame([(g,) for g in geocodes], "geocode string"),
            node_counts,
            config,
            SECRET,
        )


def test_the_table_has_every_row_once_in_order(table, config):
    wanted = [
        ("topdown", level, metric, query)
        for level in config.hierarchy.names
        for metric, query in [("mae_total", "total")]
        + [("mean_l1", q.name) for q in config.queries[level]]
    ] + [
        ("block_by_block", level, metric, "total")
        for level in config.hierarchy.names
        for metric in ["mae_total", "expected_mae_total"]
    ]
    assert list(table.columns) == EVALUATION_COLUMNS
    assert list(table[["method", "level", "metric", "query"]].itertuples(index=False)) == wanted


def test_every_level_and_query_error_equals_a_pandas_recomputation(table, config, small_run):
    truth, estimates, _, node_counts = small_run
    n_cells = config.schema.n_cells
    merged = truth.merge(estimates, on=["level", "geocode", "cell"], how="outer").fillna(0)
    merged["diff"] = merged["count_y"] - merged["count_x"]
    got = table[table["method"] == "topdown"]
    for level in config.hierarchy.names:
        wanted = {("mae_total", "total"): np.zeros(n_cells, dtype=np.int64)}
        wanted |= {("mean_l1", q.name): q.cell_to_marginal for q in config.queries[level]}
        here = merged[merged["level"] == level]
        for (metric, query), c2m in wanted.items():
            per_marginal = here.assign(m=c2m[here["cell"].to_numpy()]).groupby(["geocode", "m"])
            expected = per_marginal["diff"].sum().abs().sum() / node_counts[level]
            row = got[(got["level"] == level) & (got["metric"] == metric) & (got["query"] == query)]
            assert len(row) == 1, (level, metric, query)
            assert row["value"].iat[0] == pytest.approx(expected, rel=1e-15), (level, metric, query)
            assert row["nodes"].iat[0] == node_counts[level]


def test_the_baseline_draws_the_blocks_keyed_noise_and_sums_it_up_each_level(
    table, config, small_run
):
    """Against one plain sampler call per block, from the block's own keyed stream."""
    geocodes = small_run[2]
    sigma2 = 1 / config.budget.total_rho
    noise = {
        g: int(
            discrete_gaussian(
                sigma2,
                config.schema.n_cells,
                keyed_rng(SECRET, "baseline", "block", g, "detailed"),
            ).sum()
        )
        for g in geocodes
    }
    got = table[table["method"] == "block_by_block"]
    for level in config.hierarchy.levels:
        nodes: dict[str, list[int]] = {}
        for g, e in noise.items():
            nodes.setdefault(g[: level.digits], []).append(e)
        drawn = np.mean([abs(sum(v)) for v in nodes.values()])
        expected = np.mean(
            [
                expected_abs_sum(float(sigma2), len(v) * config.schema.n_cells)
                for v in nodes.values()
            ]
        )
        mine = got[got["level"] == level.name].set_index("metric")
        assert mine.loc["mae_total", "value"] == pytest.approx(drawn, rel=1e-15)
        assert mine.loc["expected_mae_total", "value"] == pytest.approx(expected, rel=1e-12)
        assert mine.loc["mae_total", "nodes"] == len(nodes)


@pytest.mark.parametrize("sigma2", [0.1, 1 / 2.556, 2.0])
@pytest.mark.parametrize("terms", [1, 16, 37])
def test_expected_abs_sum_is_the_brute_force_convolution(sigma2, terms):
    k = int(np.ceil(12 * np.sqrt(sigma2))) + 2
    x = np.arange(-k, k + 1)
    pmf = np.exp(-(x**2) / (2 * sigma2))
    pmf /= pmf.sum()
    total = np.array([1.0])
    for _ in range(terms):
        total = np.convolve(total, pmf)
    support = np.arange(total.size) - (total.size - 1) // 2
    assert expected_abs_sum(sigma2, terms) == pytest.approx(float((abs(support) * total).sum()))


@pytest.mark.parametrize("sigma2", [0.1, 1 / 2.556, 2.0])
def test_expected_abs_sum_is_continuous_where_it_switches_to_the_normal_value(sigma2):
    """Just past ``EXACT_VARIANCE`` the normal value meets the exact one of the last exact
    term count, scaled by the square root of the variance."""
    pmf = np.exp(-(np.arange(-40, 41) ** 2) / (2 * sigma2))
    pmf /= pmf.sum()
    per_term = float((np.arange(-40, 41) ** 2 * pmf).sum())
    last = int(EXACT_VARIANCE / per_term)
    exact, normal = expected_abs_sum(sigma2, last), expected_abs_sum(sigma2, last + 1)
    assert normal == pytest.approx(exact * np.sqrt((last + 1) / last), rel=5e-5)
