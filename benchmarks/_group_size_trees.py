"""The trees the group-size benchmarks release, their noise and their errors, without Spark:
the real CALM tree, the SYNTHETIC national blocks, full synthetic trees and the heavy-tailed
tree; one trial's noisy measurements from the project's own keyed geometric noise; mean L1 and
EMD per level. ``bench_pgsr.py``, ``bench_cumulative_scaling.py`` and ``bench_pgsr_large_n.py``
draw their instances here.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
from _common import ROOT

from censusdp_spark.group_sizes.measure import NoisePlan, noisy_group
from censusdp_spark.group_sizes.solvers.tree import GroupTree

CALM = ROOT / "data" / "calm" / "calm_taz_household_sizes.csv"
# Household sizes of the unique ACS 2006-2010 PUMS households of PUMA 600 (Oregon), sizes 1..8+
# (data README §6): the size law of the synthetic trees.
PUMS_SIZES = np.array([1103, 1687, 624, 489, 188, 80, 25, 17], dtype=np.float64)
NATIONAL_SIZES = [f"hh_size_{j}" for j in range(1, 7)] + ["hh_size_7plus"]


@dataclass(frozen=True)
class Dataset:
    name: str
    parent: np.ndarray
    depth: np.ndarray
    truth: np.ndarray  # (n, N)

    @property
    def levels(self) -> int:
        return int(self.depth.max()) + 1


def from_leaves(name: str, geocodes: pd.Series, counts: np.ndarray, digits: list[int]) -> Dataset:
    """A hierarchy from leaf geocodes (levels = geocode prefixes of ``digits`` characters) and
    the leaves' size histograms; nodes ordered by depth, then geocode."""
    codes, truths, parents, depths = [], [], [], []
    previous: pd.Index | None = None
    offset = 0
    for depth, d in enumerate(digits):
        sums = pd.DataFrame(counts).groupby(geocodes.str[:d].to_numpy()).sum().sort_index()
        codes.append(sums.index)
        truths.append(sums.to_numpy(dtype=np.int64))
        if previous is None:
            parents.append(np.full(len(sums), -1))
        else:
            up = digits[depth - 1]
            parents.append(offset - len(previous) + previous.get_indexer(sums.index.str[:up]))
        depths.append(np.full(len(sums), depth))
        offset += len(sums)
        previous = sums.index
    return Dataset(name, np.concatenate(parents), np.concatenate(depths), np.vstack(truths))


def calm() -> Dataset:
    frame = pd.read_csv(CALM, dtype=str)
    geocodes = frame["county"] + frame["tract"] + frame["block_group"] + frame["taz"]
    counts = frame[[f"HHSIZE{j}" for j in range(1, 5)]].to_numpy(dtype=np.int64)
    return from_leaves("CALM (real)", geocodes, counts, [0, 3, 9, 12, 16])


def national(blocks: Path) -> Dataset:
    """The SYNTHETIC national blocks (``censusdp generate national``), sizes 1..7+."""
    frame = pd.concat(pd.read_parquet(f) for f in sorted(blocks.glob("*.parquet")))
    counts = frame[NATIONAL_SIZES].to_numpy(dtype=np.int64)
    return from_leaves(
        f"SYNTHETIC national ({len(frame):,} blocks)", frame["GEOID"], counts, [0, 2, 5, 11, 12, 15]
    )


def full_tree(fanouts: list[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """A full tree with the given fan-outs, breadth first: each node's parent (-1 for the
    root), its depth, and the leaves."""
    parent, depth, frontier = [-1], [0], [0]
    for level, fanout in enumerate(fanouts, start=1):
        nxt = []
        for p in frontier:
            for _ in range(fanout):
                parent.append(p)
                depth.append(level)
                nxt.append(len(parent) - 1)
        frontier = nxt
    return np.array(parent), np.array(depth), frontier


def sum_up(parents: np.ndarray, truth: np.ndarray) -> None:
    """Fill every internal node's histogram, in place, with the sum of its leaves'."""
    for r in range(parents.size - 1, 0, -1):
        truth[parents[r]] += truth[r]


def synthetic(fanouts: list[int], households: int, seed: int) -> Dataset:
    """A full tree with the given fan-outs; each leaf holds Poisson(households) households."""
    rng = np.random.default_rng(seed)
    parents, depth, frontier = full_tree(fanouts)
    truth = np.zeros((parents.size, PUMS_SIZES.size), dtype=np.int64)
    leaves = np.array(frontier)
    law = PUMS_SIZES / PUMS_SIZES.sum()
    truth[leaves] = np.stack(
        [rng.multinomial(int(g), law) for g in rng.poisson(households, leaves.size)]
    )
    sum_up(parents, truth)
    name = f"synthetic {'x'.join(map(str, fanouts))} ({parents.size:,} nodes, N=8)"
    return Dataset(name, parents, depth, truth)


def spine(fanouts: list[int], households: int, seed: int = 3) -> Dataset:
    """A full tree with the given fan-outs, PUMS size law folded to sizes 1..7+ (national's)."""
    rng = np.random.default_rng(seed)
    parents, depth, frontier = full_tree(fanouts)
    law = np.concatenate([PUMS_SIZES[:6], [PUMS_SIZES[6:].sum()]])
    truth = np.zeros((parents.size, law.size), dtype=np.int64)
    for leaf, g in zip(frontier, rng.poisson(households, len(frontier)), strict=True):
        truth[leaf] = rng.multinomial(g, law / law.sum())
    sum_up(parents, truth)
    shape = "x".join(map(str, fanouts))
    return Dataset(f"synthetic {shape} ({parents.size:,} nodes), N=7", parents, depth, truth)


def heavy_tailed(sizes: int, groups: int, seed: int = 1) -> Dataset:
    """root -> 4 -> 28 leaves; leaf sizes 1..N with probability ~ 1/size^2."""
    rng = np.random.default_rng(seed)
    parent = np.array([-1] + [0] * 4 + [1 + i // 7 for i in range(28)])
    depth = np.array([0] + [1] * 4 + [2] * 28)
    law = np.arange(1, sizes + 1, dtype=np.float64) ** -2.0
    truth = np.zeros((parent.size, sizes), dtype=np.int64)
    for leaf, g in zip(range(5, 33), rng.poisson(groups / 28, 28), strict=True):
        truth[leaf] = rng.multinomial(g, law / law.sum())
    sum_up(parent, truth)
    return Dataset(f"heavy-tailed 1-4-28, N={sizes:,}", parent, depth, truth)


def noisy(
    data: Dataset, measurement: str, epsilon: Fraction, trial: int, faithfulness: str
) -> GroupTree:
    """Trial ``trial``'s noisy measurement (``histogram`` or ``cumulative``) of every node at
    ``epsilon`` over the tree's levels, from one keyed stream."""
    sensitivity = 1 if measurement == "cumulative" else 2
    scale = Fraction(sensitivity * data.levels) / epsilon
    plan = NoisePlan(measurement, data.truth.shape[1], {"all": scale}, faithfulness, "root")
    secret = bytes([trial + 1]) * 32  # one noise group: every node from one keyed stream
    rows = noisy_group(secret, plan, "all", "", data.truth)
    return GroupTree(data.parent, rows, data.truth.sum(1))


def per_level(data: Dataset, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean L1 and mean EMD per level (index = depth)."""
    diff = counts - data.truth
    l1 = np.abs(diff).sum(1)
    emd = np.abs(np.cumsum(diff, axis=1)).sum(1)
    nodes = np.bincount(data.depth)
    return np.bincount(data.depth, l1) / nodes, np.bincount(data.depth, emd) / nodes
