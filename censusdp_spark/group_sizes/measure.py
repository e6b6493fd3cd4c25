"""The group-size release's noise pass: every cell of every node, two-sided geometric noise.

Privacy claim
-------------
Neighbouring datasets differ by one individual joining or leaving an existing group (the
geography is public and the groups stay, as in Kuo et al.), which moves one group of every
ancestor node from size j to j +/- 1 (or leaves it in the top-coded bucket). Per node that
changes the size histogram by at most 2 in L1 and the cumulative histogram ``H_1..H_N`` by
at most 1 (only ``H_j`` moves; ``H_N = G^r`` does not). Under level faithfulness (the
paper's) only the root's G is published: ``H_N`` is measured like the others and no ``G^r``
is written or read; under node faithfulness every ``G^r`` is published, and ``H_N`` is not
measured. Level ``l`` adds
two-sided geometric noise of scale ``Delta / epsilon_l`` to every cell of every node (every
size, zeros included), so each level is ``epsilon_l``-DP; nodes of a level are disjoint
(parallel composition) and levels compose to ``sum_l epsilon_l = epsilon`` (checked exactly by
``split_epsilon``). With the paper's even split: scale ``2L/epsilon`` (histograms) and
``L/epsilon`` (cumulative). The noise is drawn by *noise group*, as TopDown's
(``privacy.noise_groups``): the nodes of level ``l`` sharing their ancestor ``a``
``NOISE_GROUP_DEPTH`` levels up (``engine.families.noise_group``), sorted by geocode, take their
cells node after node from one keyed stream ``keyed_rng(secret, "pgsr", measurement, l, a)``, in
one ``discrete_laplace`` call per group. A group's members and their order depend only on the
public geography, so a retried or speculative task redraws identical noise; distinct keys get
independent streams and every draw is a fresh exact discrete Laplace, so the noise of every
(node, cell) is independent of every other and of the data. ``exact`` (``dp``) and ``relaxed``
share the histogram measurement, so with one secret they post-process the *same* noisy table.
Everything after ``measure`` reads only the ``noisy_measurements`` table (noisy values and the
public ``G^r``), so it is post-processing.

Data shapes: node histograms ``level, geocode, cells, counts`` (confidential, memory only) ->
``noisy_measurements`` ``level, geocode, measurement, groups, noisy`` (``NOISY_SCHEMA``: dense,
every size of every node; written once; ``groups`` null below the root under level
faithfulness).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from censusdp_spark.engine.families import FamilySolver, map_families, noise_group
from censusdp_spark.group_sizes.config import GroupSizesConfig, Mechanism
from censusdp_spark.group_sizes.solvers.cumulative import to_cumulative
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy import discrete_laplace, noisy_measurements

NOISE_STREAM = "pgsr"
"""The first key of every noise stream of the release (``keyed_rng``): a different name would
draw different noise from the same secret, so it stays the release's first name."""
NOISY_SCHEMA = (
    "level string, geocode string, measurement string, groups bigint, noisy array<bigint>"
)


@dataclass(frozen=True)
class NoisePlan:
    """What the noise pass needs (picklable, small)."""

    measurement: str  # "histogram" (dp, relaxed) or "cumulative"
    sizes: int
    scales: Mapping[str, Fraction]  # geometric scale per level
    faithfulness: str = "level"
    root: str = ""  # the root level: the only node whose number of groups (G) is written


def noise_plan(config: GroupSizesConfig, mechanism: Mechanism) -> NoisePlan:
    measurement = "cumulative" if mechanism == Mechanism.CUMULATIVE else "histogram"
    sensitivity = 1 if measurement == "cumulative" else 2
    scales = {lv: config.budget.scale(lv, sensitivity) for lv in config.hierarchy.names}
    return NoisePlan(
        measurement,
        config.groups.max_size,
        scales,
        config.faithfulness,
        config.hierarchy.root.name,
    )


def exact_measurements(plan: NoisePlan, histograms: np.ndarray) -> np.ndarray:
    """What is measured of ``(k, N)`` dense histograms (confidential): the histograms, or the
    cumulative counts ``H_1..H_N`` under level faithfulness (``H_N = G^r`` is not public),
    ``H_1..H_{N-1}`` under node."""
    if plan.measurement == "histogram":
        return histograms
    if plan.faithfulness == "level":
        return np.cumsum(histograms, axis=-1)
    return to_cumulative(histograms)


def noisy_group(
    secret: bytes, plan: NoisePlan, level: str, group: str, histograms: np.ndarray
) -> np.ndarray:
    """Noisy measurements of one noise group's nodes (``(k, N)`` histograms sorted by geocode):
    every cell of every node from the group's keyed stream, node after node, one sampler call."""
    exact = exact_measurements(plan, histograms)
    if exact.size == 0:
        return exact
    key = (NOISE_STREAM, plan.measurement, level, group)
    (noisy,) = noisy_measurements(secret, key, [(exact, plan.scales[level])], discrete_laplace)
    return noisy


def _dense(cells: Sequence[Any], counts: Sequence[Any], n: int) -> np.ndarray:
    """``(k, n)`` dense histograms of ``k`` sparse ones (cells and counts per node)."""
    lengths = np.fromiter((len(c) for c in cells), dtype=np.int64, count=len(cells))
    out = np.zeros((len(cells), n), dtype=np.int64)
    if lengths.sum():
        rows = np.repeat(np.arange(len(cells)), lengths)
        out[rows, np.concatenate(cells).astype(np.int64)] = np.concatenate(counts)
    return out


def noise_solver(secret: bytes, plan: NoisePlan) -> FamilySolver:
    """What one Python call of the noise pass runs on one noise group's rows."""

    def noise(nodes: pd.DataFrame) -> pd.DataFrame:
        level, group = nodes["level"].iat[0], nodes["group"].iat[0]
        histograms = _dense(list(nodes["cells"]), list(nodes["counts"]), plan.sizes)
        public = plan.faithfulness == "node" or level == plan.root
        groups = histograms.sum(axis=1) if public else [None] * len(nodes)
        return pd.DataFrame(
            {
                "level": level,
                "geocode": nodes["geocode"].to_numpy(),
                "measurement": plan.measurement,
                "groups": pd.array(groups, dtype="Int64"),
                "noisy": list(noisy_group(secret, plan, level, group, histograms)),
            }
        )

    return noise


def measure(nodes: DataFrame, plan: NoisePlan, secret: bytes, hierarchy: Hierarchy) -> DataFrame:
    """Noisy measurements of every node (lazy; the caller writes them once), one noise group at a
    time. ``groups`` holds the public number of groups: every node's under node faithfulness,
    only the root's (G) under level faithfulness (null elsewhere), so no later stage can read a
    ``G^r``."""
    return map_families(
        nodes.withColumn("group", noise_group(hierarchy)),
        family=["level", "group"],
        order=["geocode"],
        solve=noise_solver(secret, plan),
        schema=NOISY_SCHEMA,
    )
