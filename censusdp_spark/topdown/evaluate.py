"""Accuracy against the confidential truth: for internal evaluation only, never released.

Per level: the mean absolute error of node totals (total population), and for each query of the
level the mean over nodes of the L1 error of its marginal. The block-by-block baseline spends the
whole rho on the blocks' detailed histograms (discrete Gaussian, sigma^2 = 1/rho per cell) and
sums the noisy blocks up the hierarchy; its error is reported beside TopDown's at the same rho.
The baseline is a separate, evaluation-only mechanism (its own keyed stream) and is not released.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.privacy import discrete_gaussian, keyed_rng
from censusdp_spark.topdown.config import RunConfig

EVALUATION_SCHEMA = (
    "method string, level string, metric string, query string, nodes long, value double"
)


def _per_node_error(diff: DataFrame, level: str, query: str, c2m: np.ndarray) -> DataFrame:
    marginal = F.element_at(F.array(*[F.lit(int(v)) for v in c2m]), (F.col("cell") + 1).cast("int"))
    return (
        diff.filter(F.col("level") == level)
        .groupBy("geocode", marginal.alias("m"))
        .agg(F.sum("diff").alias("d"))
        .groupBy("geocode")
        .agg(F.sum(F.abs("d")).alias("l1"))
    )


def topdown_errors(
    truth: DataFrame, estimates: DataFrame, node_counts: dict[str, int], config: RunConfig
) -> DataFrame:
    """TopDown's error rows; ``truth``/``estimates`` are long ``level, geocode, cell, count``."""
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
    totals = diff.groupBy("level", "geocode").agg(F.abs(F.sum("diff")).alias("abs_err"))
    rows = totals.groupBy("level").agg(F.sum("abs_err").alias("s")).collect()
    out = [
        (
            "topdown",
            r["level"],
            "mae_total",
            "total",
            node_counts[r["level"]],
            r["s"] / node_counts[r["level"]],
        )
        for r in rows
    ]
    seen = {r["level"] for r in rows}
    out += [
        ("topdown", lv, "mae_total", "total", n, 0.0)
        for lv, n in node_counts.items()
        if lv not in seen
    ]
    for level in config.hierarchy.names:
        for q in config.queries[level]:
            row = _per_node_error(diff, level, q.name, q.cell_to_marginal).agg(F.sum("l1")).first()
            s = (row[0] if row is not None else None) or 0
            out.append(
                (
                    "topdown",
                    level,
                    "mean_l1",
                    q.name,
                    node_counts[level],
                    float(s) / node_counts[level],
                )
            )
    return diff.sparkSession.createDataFrame(out, EVALUATION_SCHEMA)


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


def baseline_errors(blocks: DataFrame, config: RunConfig, secret: bytes) -> DataFrame:
    """Block-by-block baseline: all rho on block detail, summed up; MAE of totals per level.

    The error of a summed noisy total is the sum of its blocks' noise, so only noise is drawn.
    """
    sigma2 = 1 / config.budget.total_rho
    noise = blocks.select("geocode").mapInPandas(
        _baseline_noise(secret, sigma2, config.schema.n_cells), "geocode string, noise_total long"
    )
    rows = []
    for level in config.hierarchy.levels:
        key = geocode_prefix(level.digits)
        agg = (
            noise.groupBy(key.alias("node"))
            .agg(F.abs(F.sum("noise_total")).alias("e"))
            .agg(F.count("*").alias("n"), F.sum("e").alias("s"))
            .first()
        )
        assert agg is not None
        rows.append(
            ("block_by_block", level.name, "mae_total", "total", agg["n"], agg["s"] / agg["n"])
        )
    return blocks.sparkSession.createDataFrame(rows, EVALUATION_SCHEMA)


def plot_errors(evaluation: pd.DataFrame, levels: tuple[str, ...], path: str, title: str) -> None:
    """PNG of total-population MAE per level, TopDown against the baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    mae = evaluation[evaluation["metric"] == "mae_total"]
    for method, marker in (("topdown", "o"), ("block_by_block", "s")):
        rows = mae[mae["method"] == method].set_index("level").reindex(list(levels))
        ax.plot(list(levels), rows["value"].to_numpy(), marker=marker, label=method)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("mean absolute error of total population")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
