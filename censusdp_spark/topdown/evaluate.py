"""Accuracy against the confidential truth: for internal evaluation only, never released.

Per level: the mean absolute error of node totals (total population), and for each query of the
level the mean over nodes of the L1 error of its marginal. The block-by-block baseline spends the
whole rho on the blocks' detailed histograms (discrete Gaussian, sigma^2 = 1/rho per cell) and
sums the noisy blocks up the hierarchy; its error is reported beside TopDown's at the same rho,
with its *expected* error (``expected_mae_total``: sigma is known exactly, so the expectation
over the noise is computed, not drawn). The baseline is a separate, evaluation-only mechanism
(its own keyed stream) and is not released.

Each method costs one Spark job: every (level, query) error of the estimates comes out of one
aggregation over the cell differences joined to a small ``level, cell -> query, marginal``
table, and every level of the baseline out of one aggregation over the blocks' noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from functools import cache

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.privacy import discrete_gaussian, keyed_rng
from censusdp_spark.topdown.config import RunConfig

EVALUATION_SCHEMA = (
    "method string, level string, metric string, query string, nodes long, value double"
)
MARGINALS_SCHEMA = "level string, cell long, metric string, query string, m int"


def _marginals(spark: SparkSession, config: RunConfig) -> DataFrame:
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


def topdown_errors(
    truth: DataFrame,
    estimates: DataFrame,
    node_counts: dict[str, int],
    config: RunConfig,
    method: str = "topdown",
) -> DataFrame:
    """The estimates' error rows (``method``); ``truth``/``estimates`` are long ``level,
    geocode, cell, count``. A node absent from both has error 0 (it counts in ``nodes``)."""
    spark = truth.sparkSession
    diff = (
        truth.withColumnRenamed("count", "true")
        .join(
            estimates.withColumnRenamed("count", "est"), ["level", "geocode", "cell"], "full_outer"
        )
        .select(
            "level",
            "geocode",
            "cell",
            (F.coalesce("est", F.lit(0)) - F.coalesce("true", F.lit(0))).alias("diff"),
        )
    )
    keys = ["level", "metric", "query"]
    sums = (
        diff.join(F.broadcast(_marginals(spark, config)), ["level", "cell"])
        .groupBy(*keys, "geocode", "m")
        .agg(F.sum("diff").alias("d"))
        .groupBy(*keys)
        .agg(F.sum(F.abs("d")).alias("s"))
        .collect()
    )
    found = {(r["level"], r["metric"], r["query"]): float(r["s"]) for r in sums}
    out = []
    for level in config.hierarchy.names:
        n = node_counts.get(level, 0)
        wanted = [("mae_total", "total")] + [("mean_l1", q.name) for q in config.queries[level]]
        out += [
            (method, level, metric, query, n, found.get((level, metric, query), 0.0) / max(n, 1))
            for metric, query in wanted
        ]
    return spark.createDataFrame(out, EVALUATION_SCHEMA)


def _baseline_noise(secret: bytes, sigma2: Fraction, n_cells: int):
    def noise(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            sums = [
                int(
                    discrete_gaussian(
                        sigma2, n_cells, keyed_rng(secret, "baseline", "block", g, "detailed")
                    ).sum()
                )
                for g in batch["geocode"]
            ]
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


def baseline_errors(blocks: DataFrame, config: RunConfig, secret: bytes) -> DataFrame:
    """Block-by-block baseline: all rho on block detail, summed up; MAE of totals per level,
    drawn and expected.

    The error of a summed noisy total is the sum of its blocks' noise, so only noise is drawn.
    """
    sigma2 = 1 / config.budget.total_rho
    n_cells = config.schema.n_cells
    noise = blocks.select("geocode").mapInPandas(
        _baseline_noise(secret, sigma2, n_cells), "geocode string, noise_total long"
    )
    levels = config.hierarchy.levels
    nodes = F.explode(
        F.array(
            *[F.struct(F.lit(lv.name).alias("level"), geocode_prefix(lv.digits).alias("node"))
              for lv in levels]
        )
    )  # fmt: skip
    per_size = (
        noise.select(nodes.alias("n"), "noise_total")
        .groupBy("n.level", "n.node")
        .agg(F.abs(F.sum("noise_total")).alias("e"), F.count("*").alias("blocks"))
        .groupBy("level", "blocks")
        .agg(F.count("*").alias("n"), F.sum("e").alias("s"))
        .collect()
    )
    rows = []
    for level in levels:
        mine = [r for r in per_size if r["level"] == level.name]
        n = sum(int(r["n"]) for r in mine)
        drawn = sum(float(r["s"]) for r in mine) / n
        expected = sum(
            int(r["n"]) * expected_abs_sum(float(sigma2), int(r["blocks"]) * n_cells) for r in mine
        )
        rows += [
            ("block_by_block", level.name, "mae_total", "total", n, drawn),
            ("block_by_block", level.name, "expected_mae_total", "total", n, expected / n),
        ]
    return blocks.sparkSession.createDataFrame(rows, EVALUATION_SCHEMA)


def plot_errors(evaluation: pd.DataFrame, levels: tuple[str, ...], path: str, title: str) -> None:
    """PNG of total-population MAE per level: each estimation method's line, the block-by-block
    baseline's drawn error (one noise draw: at a few nodes it can be far from its mean) and its
    expected error (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))

    def line(method: str, metric: str, label: str, **style: object) -> None:
        rows = evaluation[(evaluation["method"] == method) & (evaluation["metric"] == metric)]
        values = rows.set_index("level").reindex(list(levels))["value"].to_numpy()
        ax.plot(list(levels), values, label=label, **style)  # type: ignore[arg-type]

    methods = sorted(set(evaluation["method"]) - {"block_by_block"})
    for method in methods:
        line(method, "mae_total", method, marker="o")
    line("block_by_block", "mae_total", "block_by_block (drawn)", marker="s", linestyle="none")
    line("block_by_block", "expected_mae_total", "block_by_block (expected)", linestyle="--")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("mean absolute error of total population")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
