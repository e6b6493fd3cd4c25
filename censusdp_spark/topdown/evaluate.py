"""Accuracy against the confidential truth: for internal evaluation only, never released.

Per level: the mean absolute error of node totals (total population), and for each query of the
level the mean over nodes of the L1 error of its marginal. The block-by-block baseline spends the
whole rho on the blocks' detailed histograms (discrete Gaussian, sigma^2 = 1/rho per cell) and
sums the noisy blocks up the hierarchy; its error is reported beside TopDown's at the same rho,
with its *expected* error (``expected_mae_total``: sigma is known exactly, so the expectation
over the noise is computed, not drawn). The baseline is a separate, evaluation-only mechanism
(its own keyed stream) and is not released.

The whole evaluation is one Spark job: every (level, query) error of the estimates comes out of
one aggregation over the cell differences (truth and estimates stacked with opposite signs)
joined to a small ``level, cell -> query, marginal`` table, and every level of the baseline out
of one aggregation over the blocks' noise; both are collected together, so their stages share
the cores. The baseline's blocks are drawn a batch at a time (``discrete_gaussian_rows``, the
same values as one sampler call per block) in tasks of ``BASELINE_BLOCKS_PER_TASK`` blocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from functools import cache

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.privacy import discrete_gaussian_rows, keyed_rng
from censusdp_spark.release.error_plot import ErrorLine, plot_error_by_level
from censusdp_spark.topdown.config import TopDownConfig

EVALUATION_SCHEMA = (
    "method string, level string, metric string, query string, nodes long, value double"
)
EVALUATION_COLUMNS = ["method", "level", "metric", "query", "nodes", "value"]
MARGINALS_SCHEMA = "level string, cell long, metric string, query string, m int"
BASELINE = "block_by_block"
BASELINE_BLOCKS_PER_TASK = 8192
"""Blocks per task of the baseline's draws (about a second of sampling each), so that they
spread over the cores even when the block table is one partition; smaller tasks cost more JVM
and Python overhead than they gain."""


def evaluation_table(
    truth: DataFrame,
    estimates: DataFrame,
    blocks: DataFrame,
    node_counts: dict[str, int],
    config: TopDownConfig,
    secret: bytes,
    method: str = "topdown",
) -> pd.DataFrame:
    """Every evaluation row (``EVALUATION_COLUMNS``) from one Spark job: the estimates' errors
    (``method``, as :func:`estimate_error_sums`) and the baseline's (as
    :func:`baseline_error_sums`), aggregated side by side and collected together."""
    sums = (
        estimate_error_sums(truth, estimates, config, method)
        .unionByName(baseline_error_sums(blocks, node_counts, config, secret))
        .collect()
    )
    rows = estimate_rows([r for r in sums if r["method"] == method], node_counts, config, method)
    rows += baseline_rows([r for r in sums if r["method"] == BASELINE], config)
    return pd.DataFrame(rows, columns=EVALUATION_COLUMNS)


def _marginals(spark: SparkSession, config: TopDownConfig) -> DataFrame:
    """``level, cell -> metric, query, m``: the marginal cell ``m`` of each query of the level
    that a histogram cell falls in; ``mae_total`` is the query putting every cell in one."""
    n = config.schema.n_cells
    rows = [
        (level, cell, metric, name, int(m))
        for level in config.hierarchy.names
        for metric, name, c2m in [
            ("mae_total", "total", np.zeros(n, dtype=np.int64)),
            *(("mean_l1", q.name, q.cell_to_marginal) for q in config.queries[level]),
        ]
        for cell, m in enumerate(c2m)
    ]
    return spark.createDataFrame(rows, MARGINALS_SCHEMA)


def estimate_error_sums(
    truth: DataFrame, estimates: DataFrame, config: TopDownConfig, method: str = "topdown"
) -> DataFrame:
    """Per (level, metric, query), ``s``: the sum over nodes and marginal cells of |estimate -
    truth|; ``truth``/``estimates`` are long ``level, geocode, cell, count``, one row per
    (level, geocode, cell) each. A marginal cell's error is the sum of its cells' differences,
    so the two tables are stacked with opposite signs and summed, not joined: a cell absent from
    one counts 0 there."""
    signed = truth.select("level", "geocode", "cell", (-F.col("count")).alias("diff")).unionByName(
        estimates.select("level", "geocode", "cell", F.col("count").alias("diff"))
    )
    keys = ["level", "metric", "query"]
    return (
        signed.join(F.broadcast(_marginals(truth.sparkSession, config)), ["level", "cell"])
        .groupBy(*keys, "geocode", "m")
        .agg(F.sum("diff").alias("d"))
        .groupBy(*keys)
        .agg(F.sum(F.abs("d")).alias("s"))
        .select(
            F.lit(method).alias("method"),
            *keys,
            F.lit(None).cast("long").alias("blocks"),
            F.lit(None).cast("long").alias("nodes"),
            "s",
        )
    )


def estimate_rows(
    sums: list[Row], node_counts: dict[str, int], config: TopDownConfig, method: str
) -> list[tuple[str, str, str, str, int, float]]:
    """The estimates' rows: per level, ``mae_total`` and each query's ``mean_l1``, the sums over
    all the level's nodes (a node absent from both tables has error 0 and counts)."""
    found = {(r["level"], r["metric"], r["query"]): float(r["s"]) for r in sums}
    out = []
    for level in config.hierarchy.names:
        n = node_counts.get(level, 0)
        wanted = [("mae_total", "total")] + [("mean_l1", q.name) for q in config.queries[level]]
        out += [
            (method, level, metric, query, n, found.get((level, metric, query), 0.0) / max(n, 1))
            for metric, query in wanted
        ]
    return out


def _baseline_noise(secret: bytes, sigma2: Fraction, n_cells: int):
    """Each block's summed detailed noise, from its own keyed stream; the blocks of a batch are
    drawn together (``discrete_gaussian_rows``: the same values as one call per block)."""

    def noise(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rngs = [keyed_rng(secret, "baseline", "block", g, "detailed") for g in batch["geocode"]]
            sums = discrete_gaussian_rows(sigma2, n_cells, rngs).sum(axis=1)
            yield pd.DataFrame({"geocode": batch["geocode"], "noise_total": sums})

    return noise


EXACT_VARIANCE = 1000
"""``expected_abs_sum`` convolves exactly while the sum's variance is at most this; beyond, the
normal value with its lattice correction ``1 - 1/(12 V)`` (Euler-Maclaurin at the kink of
``|s|``) is within 4e-5 of the exact one (measured at the switch for sigma^2 in 0.1..2)."""
EXACT_SUPPORT = 1 << 21
"""... and while the sum's support fits this many points (very small sigma^2 only)."""


def _discrete_gaussian_pmf(sigma2: float) -> tuple[np.ndarray, int]:
    """The pmf of the discrete Gaussian of parameter ``sigma2`` on ``-K..K`` (mass beyond is
    below float precision), and ``K``."""
    k = int(np.ceil(12 * np.sqrt(sigma2))) + 2
    x = np.arange(-k, k + 1)
    w = np.exp(-(x.astype(np.float64) ** 2) / (2 * sigma2))
    return w / w.sum(), k


@cache
def expected_abs_sum(sigma2: float, terms: int) -> float:
    """``E|S|`` for ``S`` the sum of ``terms`` independent discrete Gaussians of parameter
    ``sigma2``: exact by FFT convolution up to ``EXACT_VARIANCE``, normal (with the discrete
    Gaussian's exact variance and the lattice correction) beyond."""
    pmf, k = _discrete_gaussian_pmf(sigma2)
    x = np.arange(-k, k + 1)
    variance = terms * float((x**2 * pmf).sum())
    support = terms * 2 * k + 1
    if variance > EXACT_VARIANCE or support > EXACT_SUPPORT:
        return float(np.sqrt(2 / np.pi * variance) * (1 - 1 / (12 * variance)))
    size = 1 << int(np.ceil(np.log2(support)))
    total = np.fft.irfft(np.fft.rfft(pmf, size) ** terms, size)[:support]
    return float((np.abs(np.arange(support) - terms * k) * np.clip(total, 0, None)).sum())


def baseline_error_sums(
    blocks: DataFrame, node_counts: dict[str, int], config: TopDownConfig, secret: bytes
) -> DataFrame:
    """Block-by-block baseline: all rho on block detail, summed up. Per level and node size (in
    blocks), the number of nodes and ``s``, the sum of their totals' absolute errors.

    The error of a summed noisy total is the sum of its blocks' noise, so only noise is drawn.
    """
    sigma2 = 1 / config.budget.total_rho
    n_cells = config.schema.n_cells
    tasks = -(-node_counts.get(config.hierarchy.leaf.name, 0) // BASELINE_BLOCKS_PER_TASK)
    noise = (
        blocks.select("geocode")
        .repartition(max(tasks, 1))
        .mapInPandas(_baseline_noise(secret, sigma2, n_cells), "geocode string, noise_total long")
    )
    nodes = F.explode(
        F.array(
            *[F.struct(F.lit(lv.name).alias("level"), geocode_prefix(lv.digits).alias("node"))
              for lv in config.hierarchy.levels]
        )
    )  # fmt: skip
    return (
        noise.select(nodes.alias("n"), "noise_total")
        .groupBy("n.level", "n.node")
        .agg(F.abs(F.sum("noise_total")).alias("e"), F.count("*").alias("blocks"))
        .groupBy("level", "blocks")
        .agg(F.count("*").alias("nodes"), F.sum("e").alias("s"))
        .select(
            F.lit(BASELINE).alias("method"),
            "level",
            F.lit("mae_total").alias("metric"),
            F.lit("total").alias("query"),
            "blocks",
            "nodes",
            "s",
        )
    )


def baseline_rows(
    sums: list[Row], config: TopDownConfig
) -> list[tuple[str, str, str, str, int, float]]:
    """The baseline's rows per level: its drawn ``mae_total`` and its ``expected_mae_total``
    (from each node's number of blocks and sigma, exactly). Sums are correctly rounded
    (``math.fsum``), so they do not depend on the order the aggregation returns its rows in."""
    sigma2 = float(1 / config.budget.total_rho)
    n_cells = config.schema.n_cells
    rows = []
    for level in config.hierarchy.levels:
        mine = [r for r in sums if r["level"] == level.name]
        n = sum(int(r["nodes"]) for r in mine)
        drawn = math.fsum(float(r["s"]) for r in mine) / n
        expected = math.fsum(
            int(r["nodes"]) * expected_abs_sum(sigma2, int(r["blocks"]) * n_cells) for r in mine
        )
        rows += [
            (BASELINE, level.name, "mae_total", "total", n, drawn),
            (BASELINE, level.name, "expected_mae_total", "total", n, expected / n),
        ]
    return rows


def plot_errors(evaluation: pd.DataFrame, levels: tuple[str, ...], path: str, title: str) -> None:
    """PNG of total-population MAE per level: each estimation method's line, the block-by-block
    baseline's drawn error (one noise draw: at a few nodes it can be far from its mean) and its
    expected error (dashed)."""

    def line(method: str, metric: str, label: str, **style: object) -> ErrorLine:
        rows = evaluation[(evaluation["method"] == method) & (evaluation["metric"] == metric)]
        values = rows.set_index("level").reindex(list(levels))["value"].to_numpy()
        return ErrorLine(values, label, style)

    methods = sorted(set(evaluation["method"]) - {"block_by_block"})
    lines = [line(method, "mae_total", method, marker="o") for method in methods]
    lines += [
        line("block_by_block", "mae_total", "block_by_block (drawn)", marker="s", linestyle="none"),
        line("block_by_block", "expected_mae_total", "block_by_block (expected)", linestyle="--"),
    ]
    plot_error_by_level(levels, lines, "mean absolute error of total population", title, path)
