"""The other group-size post-processings on Spark: ``relaxed`` (the paper's M_H, the baseline
the docs and benchmarks compare ``exact`` with), ``relaxed_families`` and ``cumulative`` (M_c).

* ``relaxed``: the noisy histograms collected on the driver, the convex relaxation of the whole
  tree in one QP (Clarabel, solved as a scaled step so large counts do not swamp the noise),
  checked independently (equality residual and a weak-duality lower bound: the manifest's
  ``relaxed`` says ``reliable`` or not), then rounded cell by cell. Refused in one line beyond
  ``RELAXED_MAX_CELLS`` (node, size) cells, before any noise is drawn (``group_sizes.memory``).
* ``relaxed_families``: the relaxation solved per family top-down on Spark (the parent's
  real-valued solution fixed), then rounded: a scalable variant, not the paper's, and no better
  than ``relaxed``. For both, rounding may break consistency and faithfulness: the violations
  are counted and reported, not raised.
* ``cumulative``: cumulative noise (its own measurement), per-family exact integer programs
  top-down (``group_sizes.solvers.cumulative``).

Each reads only ``noisy_measurements`` (noisy values and the public ``G`` or ``G^r``): it is
post-processing. Data shapes: real-valued solutions ``level, geocode, solution``
(``SOLUTION_SCHEMA``, relaxed) -> released rows ``geocode, level, size, count``
(``RELEASE_SCHEMA``, every size of every node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.families import FamilySolver
from censusdp_spark.group_sizes.config import GroupSizesConfig
from censusdp_spark.group_sizes.rows import (
    RELEASE_SCHEMA,
    ints,
    level_families,
    parent_value,
    release_rows,
    released_histograms,
    root_release,
    root_row,
    settle,
    stacked,
)
from censusdp_spark.group_sizes.solvers.cumulative import cumulative_family, cumulative_root
from censusdp_spark.group_sizes.solvers.relaxed import RelaxedSolution, relaxed_qp, solve_relaxed
from censusdp_spark.group_sizes.solvers.tree import GroupTree
from censusdp_spark.model.geography import Hierarchy, Level
from censusdp_spark.release.runner import Clock

SOLUTION_SCHEMA = "level string, geocode string, solution array<double>"


# --- relaxed: the whole-tree QP on the driver, rounded ----------------------------------------


def collected_tree(
    noisy: DataFrame, hierarchy: Hierarchy, faithfulness: str
) -> tuple[pd.DataFrame, GroupTree]:
    """Every node's noisy measurements on the driver, as a ``GroupTree`` (nodes by level, then
    geocode) with their ``level, geocode`` rows. Under level faithfulness only the root's G is
    public; the other nodes' ``groups`` are filled along one path so the tree is well formed
    (the whole-tree QP reads only the root's)."""
    pdf = pd.DataFrame(noisy.select("level", "geocode", "groups", "noisy").toPandas())
    depth = pdf["level"].map({name: i for i, name in enumerate(hierarchy.names)})
    pdf = pdf.assign(depth=depth).sort_values(["depth", "geocode"]).reset_index(drop=True)
    index = {(d, g): i for i, (d, g) in enumerate(zip(pdf["depth"], pdf["geocode"], strict=True))}
    digits = [lv.digits for lv in hierarchy.levels]
    parent = np.array(
        [
            -1 if d == 0 else index[(d - 1, g[: digits[d - 1]])]
            for d, g in zip(pdf["depth"], pdf["geocode"], strict=True)
        ],
        dtype=np.int64,
    )
    values = np.vstack([ints(v) for v in pdf["noisy"]])
    if faithfulness == "node":
        groups = pdf["groups"].to_numpy(dtype=np.int64)
    else:
        groups = np.zeros(len(pdf), dtype=np.int64)
        node = len(pdf) - 1  # the last node is a leaf: G along its path to the root
        while node >= 0:
            groups[node] = int(pdf["groups"].iat[0])
            node = int(parent[node])
    return pdf[["level", "geocode"]], GroupTree(parent, values, groups)


def relaxed_tree(
    spark: SparkSession, noisy: DataFrame, hierarchy: Hierarchy, faithfulness: str
) -> tuple[DataFrame, RelaxedSolution]:
    """The paper's M_H relaxation over the whole tree in one QP on the driver (the caller has
    checked ``RELAXED_MAX_CELLS``), with its independent check; rows as ``SOLUTION_SCHEMA``."""
    rows, tree = collected_tree(noisy, hierarchy, faithfulness)
    solved = solve_relaxed(tree, faithfulness)
    frame = rows.assign(solution=list(solved.x))
    return spark.createDataFrame(frame, SOLUTION_SCHEMA), solved


def post_process_relaxed(
    spark: SparkSession, config: GroupSizesConfig, noisy: DataFrame, clock: Clock
) -> tuple[list[DataFrame], dict[str, Any]]:
    solution, solved = relaxed_tree(spark, noisy, config.hierarchy, config.faithfulness)
    clock.lap("relaxed_qp")
    return [rounded_release(solution)], solved.report()


# --- relaxed_families: per-family QPs top-down, rounded at the end -----------------------------


def relaxed_family_solver(faithfulness: str) -> FamilySolver:
    """One family's relaxed (real-valued) solution below its parent's fixed one."""

    def family(children: pd.DataFrame) -> pd.DataFrame:
        fixed = np.asarray(parent_value(children, "solution"), dtype=np.float64)
        k = len(children)
        noisy = np.vstack([np.zeros(fixed.size, dtype=np.int64), *map(ints, children["noisy"])])
        groups = (
            children["groups"].to_numpy(dtype=np.int64)
            if faithfulness == "node"
            else np.zeros(k, dtype=np.int64)  # not read: level faithfulness is the root's
        )
        tree = GroupTree(np.array([-1] + [0] * k), noisy, np.concatenate([[groups.sum()], groups]))
        solution = relaxed_qp(tree, faithfulness, fixed_root=fixed)[1:]
        return pd.DataFrame(
            {
                "level": children["level"].to_numpy(),
                "geocode": children["geocode"].to_numpy(),
                "solution": list(solution),
            }
        )

    return family


def relaxed_families(
    noisy_level: DataFrame, parent_solution: DataFrame, parent_digits: int, faithfulness: str
) -> DataFrame:
    """One level's relaxed (real-valued) solution, family by family below the fixed parents."""
    return level_families(
        noisy_level.select("level", "geocode", "groups", "noisy"),
        parent_solution.select("geocode", "solution"),
        parent_digits,
        ["geocode"],
        relaxed_family_solver(faithfulness),
        SOLUTION_SCHEMA,
    )


def relaxed_root(noisy: np.ndarray, groups: int, faithfulness: str) -> np.ndarray:
    tree = GroupTree(np.array([-1]), noisy[None, :], np.array([groups]))
    return relaxed_qp(tree, faithfulness)[0]


def rounded_release(solution: DataFrame) -> DataFrame:
    """The relaxed solution rounded cell by cell to the nearest integer, ties to even (as numpy)."""
    return solution.select(
        "geocode", "level", F.posexplode("solution").alias("pos", "value")
    ).select(
        "geocode",
        "level",
        (F.col("pos") + 1).cast("int").alias("size"),
        F.bround("value").cast("long").alias("count"),
    )


LevelBelow = Callable[[DataFrame, DataFrame, Level, Level], DataFrame]
"""A level's rows from its noisy rows and the level above's: ``(noisy_level, above, parent,
level)``."""


def top_down(
    hierarchy: Hierarchy,
    noisy: DataFrame,
    root: DataFrame,
    below: LevelBelow,
    clock: Clock,
    lap: str,
) -> list[DataFrame]:
    """``root``, then every level's rows by ``below`` from the level above's, each settled
    before the next reads it and timed as ``{lap}_{level}``."""
    levels = hierarchy.levels
    done = [root]
    for parent, level in zip(levels, levels[1:], strict=False):
        noisy_level = noisy.filter(F.col("level") == level.name)
        done.append(settle(below(noisy_level, done[-1], parent, level)))
        clock.lap(f"{lap}_{level.name}")
    return done


def post_process_relaxed_families(
    spark: SparkSession, config: GroupSizesConfig, noisy: DataFrame, clock: Clock
) -> list[DataFrame]:
    geocode, groups, root_noisy = root_row(noisy, config.hierarchy)
    solution = relaxed_root(root_noisy, groups, config.faithfulness)
    root = [(config.hierarchy.root.name, geocode, solution.tolist())]

    def below(noisy_level: DataFrame, above: DataFrame, parent: Level, level: Level) -> DataFrame:
        return relaxed_families(noisy_level, above, parent.digits, config.faithfulness)

    solved = top_down(
        config.hierarchy,
        noisy,
        spark.createDataFrame(root, SOLUTION_SCHEMA),
        below,
        clock,
        "relaxed",
    )
    return [rounded_release(s) for s in solved]


# --- cumulative: per-family integer programs top-down ------------------------------------------


def cumulative_solver(level: str, faithfulness: str, total: int) -> FamilySolver:
    """One family's released rows below its parent's released histogram (``parent_counts``)."""

    def family(children: pd.DataFrame) -> pd.DataFrame:
        noisy = stacked(children["noisy"])
        caps = (
            children["groups"].to_numpy(dtype=np.int64)
            if faithfulness == "node"
            else np.full(len(children), total, dtype=np.int64)
        )
        parent = ints(parent_value(children, "counts"))
        counts = cumulative_family(noisy, parent, faithfulness, caps)
        return release_rows(level, list(children["geocode"]), counts)

    return family


def cumulative_families(
    level: str,
    noisy_level: DataFrame,
    parent_release: DataFrame,
    parent_digits: int,
    faithfulness: str,
    total: int,
) -> DataFrame:
    """One level's released histograms: monotone, consistent, valid cumulative counts."""
    return level_families(
        noisy_level.select("geocode", "groups", "noisy"),
        parent_release,
        parent_digits,
        ["geocode"],
        cumulative_solver(level, faithfulness, total),
        RELEASE_SCHEMA,
    )


def post_process_cumulative(
    spark: SparkSession, config: GroupSizesConfig, noisy: DataFrame, clock: Clock
) -> list[DataFrame]:
    geocode, groups, root_noisy = root_row(noisy, config.hierarchy)
    root = cumulative_root(root_noisy, groups, config.faithfulness)

    def below(noisy_level: DataFrame, above: DataFrame, parent: Level, level: Level) -> DataFrame:
        parents = released_histograms(above)
        return cumulative_families(
            level.name, noisy_level, parents, parent.digits, config.faithfulness, groups
        )

    released = root_release(spark, config.hierarchy.root.name, geocode, root)
    return top_down(config.hierarchy, noisy, released, below, clock, "release")
