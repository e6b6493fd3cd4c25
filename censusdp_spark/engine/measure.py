"""Measurement: one partitioned pass that noises every queried marginal cell of every node.

For node ``g`` at level ``l`` and query ``q`` the released value is ``Q_q h_g + Z`` with
``Z ~ N_Z(0, sigma2(l, q))`` drawn from the keyed stream
``keyed_rng(secret, "topdown", l, g, q)``: a retried or speculative task redraws exactly the
same noise, and distinct (level, node, query) keys get independent streams. Every marginal cell
is noised, zeros included. The output table holds only noisy values, never true counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from censusdp_spark.model.config import RunConfig
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


def noisy_answers(
    secret: bytes,
    mechanism: str,
    level: str,
    geocode: str,
    cells: np.ndarray,
    counts: np.ndarray,
    query: QueryNoise,
) -> np.ndarray:
    """Noisy marginal answer of one node for one query (pure numpy; the privacy core's draw)."""
    exact = np.bincount(query.cell_to_marginal[cells], weights=counts, minlength=query.size).astype(
        np.int64
    )
    rng = keyed_rng(secret, mechanism, level, geocode, query.name)
    return exact + discrete_gaussian(query.sigma2, query.size, rng)


def _noise_batches(secret: bytes, plan: dict[str, tuple[QueryNoise, ...]]):
    def noise(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            levels, geocodes, names, values = [], [], [], []
            for level, geocode, cells, counts in batch[
                ["level", "geocode", "cells", "counts"]
            ].itertuples(index=False):
                cells_a = np.asarray(cells, dtype=np.int64)
                counts_a = np.asarray(counts, dtype=np.int64)
                for query in plan[level]:
                    levels.append(level)
                    geocodes.append(geocode)
                    names.append(query.name)
                    values.append(
                        noisy_answers(secret, MECHANISM, level, geocode, cells_a, counts_a, query)
                    )
            yield pd.DataFrame(
                {"level": levels, "geocode": geocodes, "query": names, "noisy": values}
            )

    return noise


def measure(nodes: DataFrame, config: RunConfig, secret: bytes) -> DataFrame:
    """Noisy measurements for every node of every level (lazy; the caller writes them once)."""
    return nodes.mapInPandas(_noise_batches(secret, noise_plan(config)), NOISY_SCHEMA)
