"""The Spark rows the group-size post-processings share: the release's schemas, a level's
families handed to a solver, released rows, the root's row, and a level computed and cut.

Everything here is post-processing plumbing: it moves rows of ``noisy_measurements`` (and rows
derived from them) between Spark and the pure-numpy solvers of ``group_sizes.solvers``, and
reads no true count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.families import FamilySolver, family_starts, map_children
from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.model.geography import Hierarchy

RELEASE_SCHEMA = "geocode string, level string, size int, count bigint"
"""The released rows: every size 1..N of every node, as the ``group_sizes`` table holds them."""
DP_RELEASE_SCHEMA = RELEASE_SCHEMA + ", noisy bigint"
"""The dp release's rows carry each cell's noisy value, so that the objective and the window
certificate are sums and filters over the released rows, not joins with the measurements."""


def ints(values: object) -> np.ndarray:
    """``values`` (a list or an array cell of a row) as an int64 array."""
    return np.asarray(values, dtype=np.int64)


def stacked(arrays: pd.Series) -> np.ndarray:
    """An array column of equal-length arrays as one (rows x length) int64 matrix."""
    return np.stack(arrays.to_numpy()).astype(np.int64, copy=False)


def release_rows(
    level: str, geocodes: list[str], counts: np.ndarray, noisy: np.ndarray | None = None
) -> pd.DataFrame:
    """Long rows (``RELEASE_SCHEMA``, or ``DP_RELEASE_SCHEMA`` with the nodes' ``noisy``) of
    ``(k, N)`` released histograms."""
    k, n = counts.shape
    rows = pd.DataFrame(
        {
            "geocode": np.repeat(np.asarray(geocodes, dtype=object), n),
            "level": level,
            "size": np.tile(np.arange(1, n + 1, dtype=np.int32), k),
            "count": counts.ravel().astype(np.int64),
        }
    )
    if noisy is not None:
        rows["noisy"] = noisy.ravel().astype(np.int64)
    return rows


def released_histograms(released: DataFrame) -> DataFrame:
    """Long ``geocode, size, count`` -> ``geocode, counts`` (dense, by size)."""
    nested = released.groupBy("geocode").agg(
        F.sort_array(F.collect_list(F.struct("size", "count"))).alias("h")
    )
    return nested.select("geocode", F.col("h.count").alias("counts"))


def level_families(
    children: DataFrame,
    parents: DataFrame,
    parent_digits: int,
    order: Sequence[str],
    solve: FamilySolver,
    schema: str,
    batched: bool = False,
) -> DataFrame:
    """``solve`` applied to every family of a level (lazily): one parent's children rows sorted
    by ``order``, each carrying its parent's geocode in ``parent`` and its columns as
    ``parent_<name>`` (``map_children``: one shuffle, many families per Python call; with
    ``batched``, all of a batch's whole families in one call)."""
    key = geocode_prefix(parent_digits)
    return map_children(children, parents, key, order, solve, schema, batched)


def parent_value(family: pd.DataFrame, column: str) -> Any:
    """The parent's ``column`` of a single family (the same on every row)."""
    return parent_rows(family, column)[1].iat[0]


def parent_rows(batch: pd.DataFrame, column: str) -> tuple[np.ndarray, pd.Series]:
    """Each family's first row in a batch and its parent's ``column`` (a family whose parent
    has no row is an error, not a silent zero)."""
    starts = family_starts(batch, ["parent"])
    values = batch[f"parent_{column}"].iloc[starts]
    if values.isna().any():
        missing = batch["parent"].iat[int(starts[np.flatnonzero(values.isna().to_numpy())[0]])]
        raise RuntimeError(f"no parent row for the family of {missing}")
    return starts, values


def root_row(noisy: DataFrame, hierarchy: Hierarchy) -> tuple[str, int, np.ndarray]:
    """The root's ``geocode, groups, noisy`` (one row: noisy values and the public G)."""
    row = (
        noisy.filter(F.col("level") == hierarchy.root.name)
        .select("geocode", "groups", "noisy")
        .collect()
    )
    if len(row) != 1:
        raise RuntimeError(f"expected one root node, found {len(row)}")
    return row[0]["geocode"], int(row[0]["groups"]), ints(row[0]["noisy"])


def root_release(
    spark: SparkSession, root: str, geocode: str, counts: Any, noisy: Any = None
) -> DataFrame:
    """The root's released rows (``RELEASE_SCHEMA``; ``DP_RELEASE_SCHEMA``, with its noisy
    values, if given); ``root`` names the root level."""
    if noisy is None:
        rows = [(geocode, root, j + 1, int(c)) for j, c in enumerate(counts)]
        return spark.createDataFrame(rows, RELEASE_SCHEMA)
    cells = zip(counts, noisy, strict=True)
    with_noisy = [(geocode, root, j + 1, int(c), int(v)) for j, (c, v) in enumerate(cells)]
    return spark.createDataFrame(with_noisy, DP_RELEASE_SCHEMA)


def settle(df: DataFrame) -> DataFrame:
    """Compute a level now and cut its lineage (kept by the executors, not written: if one is
    lost, post-processing restarts from ``noisy_measurements``, which costs no budget)."""
    return df.localCheckpoint(eager=True)


def union(levels: list[DataFrame]) -> DataFrame:
    """The rows of every level, in order, as one frame."""
    out = levels[0]
    for df in levels[1:]:
        out = out.unionByName(df)
    return out
