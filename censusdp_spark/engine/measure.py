"""Measurement: one partitioned pass that noises every queried marginal cell of every node.

For node ``g`` at level ``l`` and query ``q`` the released value is ``Q_q h_g + Z`` with
``Z ~ N_Z(0, sigma2(l, q))``, every coordinate independent. The noise is drawn family by family:
the children of parent ``p`` at level ``l``, sorted by geocode, take their noise for query after
query (in the config's query order) from the keyed stream
``keyed_rng(secret, "topdown", l, p)``, child after child, one ``discrete_gaussian`` call per
(family, query). A family's members and their order depend only on the data's geography, so a
retried or speculative task redraws exactly the same noise, and distinct (level, parent) keys get
independent streams; every draw is a fresh exact discrete Gaussian, so the noise of every
(node, query, cell) is independent of every other and of the data. One stream per family rather
than per node makes the pass one sampler call per (family, query): at national scale that is
~40 times fewer calls.

Every marginal cell is noised, zeros included. The output table holds only noisy values, never
true counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from censusdp_spark.engine.families import map_families
from censusdp_spark.model.config import RunConfig
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy import discrete_gaussian, keyed_rng

MECHANISM = "topdown"
NOISY_SCHEMA = "level string, geocode string, query string, noisy array<bigint>"


@dataclass(frozen=True)
class QueryNoise:
    """What a task needs to noise one query at one level (picklable, small)."""

    name: str
    cell_to_marginal: np.ndarray
    size: int
    sigma2: Fraction


def noise_plan(config: RunConfig) -> dict[str, tuple[QueryNoise, ...]]:
    return {
        level: tuple(
            QueryNoise(q.name, q.cell_to_marginal, q.size, config.budget.sigma2_for(level, q.name))
            for q in config.queries[level]
        )
        for level in config.hierarchy.names
    }


def exact_marginals(
    cells: list[np.ndarray], counts: list[np.ndarray], query: QueryNoise
) -> np.ndarray:
    """``(k, query.size)`` true answers of ``k >= 1`` sparse histograms (confidential)."""
    lengths = np.fromiter((len(c) for c in cells), dtype=np.int64, count=len(cells))
    rows = np.repeat(np.arange(len(cells), dtype=np.int64), lengths)
    flat_cells = np.concatenate([np.asarray(c, dtype=np.int64) for c in cells])
    flat_counts = np.concatenate([np.asarray(c, dtype=np.int64) for c in counts])
    index = rows * query.size + query.cell_to_marginal[flat_cells]
    answers = np.bincount(index, weights=flat_counts, minlength=len(cells) * query.size)
    return answers.astype(np.int64).reshape(len(cells), query.size)


def noisy_family(
    secret: bytes,
    level: str,
    parent: str,
    cells: list[np.ndarray],
    counts: list[np.ndarray],
    queries: tuple[QueryNoise, ...],
) -> list[np.ndarray]:
    """Noisy answers of one family (children sorted by geocode), one ``(k, size)`` array per query."""
    rng = keyed_rng(secret, MECHANISM, level, parent)
    k = len(cells)
    return [
        exact_marginals(cells, counts, q)
        + discrete_gaussian(q.sigma2, k * q.size, rng).reshape(k, q.size)
        for q in queries
    ]


def parent_geocode(hierarchy: Hierarchy) -> Column:
    """The parent's geocode of a ``level, geocode`` row ("" for the root and its children)."""
    parent = F.lit("")
    for upper, lower in zip(hierarchy.levels, hierarchy.levels[1:], strict=False):
        prefix = F.substring("geocode", 1, upper.digits) if upper.digits else F.lit("")
        parent = F.when(F.col("level") == lower.name, prefix).otherwise(parent)
    return parent


def _noise_families(
    secret: bytes, plan: dict[str, tuple[QueryNoise, ...]]
) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def noise(family: pd.DataFrame) -> pd.DataFrame:
        level, parent = family["level"].iat[0], family["parent"].iat[0]
        queries = plan[level]
        geocodes = family["geocode"].to_numpy()
        answers = noisy_family(
            secret, level, parent, list(family["cells"]), list(family["counts"]), queries
        )
        return pd.DataFrame(
            {
                "level": level,
                "geocode": np.repeat(geocodes, len(queries)),
                "query": np.tile([q.name for q in queries], len(geocodes)),
                "noisy": [row for rows in zip(*answers, strict=True) for row in rows],
            }
        )

    return noise


def measure(nodes: DataFrame, config: RunConfig, secret: bytes) -> DataFrame:
    """Noisy measurements for every node of every level (lazy; the caller writes them once)."""
    with_parent = nodes.withColumn("parent", parent_geocode(config.hierarchy))
    return map_families(
        with_parent,
        family=["level", "parent"],
        order=["geocode"],
        solve=_noise_families(secret, noise_plan(config)),
        schema=NOISY_SCHEMA,
    )
