"""Full-information estimation on Spark: the bottom-up pass (the top-down pass is
``full_information``).

Bottom-up (``write_bottom_up``), level by level from the leaves, each level written to the
``bottom_up`` Delta table before the level above reads it: a leaf's estimate is the GLS of its
own noisy measurements; a parent's combines the sum of its children's estimates with its own
measurements (``gaussian_estimates``), one parent's children per task (``map_children``, the
parent's measurements travelling in the same shuffle as its children's rows). The leaves and
their parents are one pass (``bottom_up_leaves_and_parents``): a task fits one parent's leaves
to their measurements and goes on to the parent, both levels written in one commit, so the 8 M
leaf rows of a national run are not read back and shuffled again. Invariant totals are exact
constraints, and so are the cells ``[[estimation.occupancy]]`` holds at 0 in a leaf
(``gaussian_estimates.hold_zeros``; a compact covariance holds them when they are whole core
cells, ``held_zeros``), which its parents then know are 0 wherever all their leaves' are.
Nothing is random, so a level recomputed after a crash is identical, whether by the pair pass
or one level at a time (a run killed between the two levels' commits).

Table ``bottom_up``: ``level, geocode, mean, covariance, exact_total``, partitioned by level.
``mean`` is over the non-structural-zero cells of the schema, in cell order (null at the
leaves when the top-down pass fits them to their own answers: nothing reads it); ``covariance`` is
the packed covariance: for a dense covariance the upper triangle (row by row) of its ``n x n``
matrix; for a compact one (``config_layout``: the config's schema, queries and structural
zeros decide, as in ``solvers.symmetric_covariance``) the upper triangles of its ``2^k`` blocks
``B_c`` over the ``n_N`` core cells, block ``c = 0`` (the one that carries the total) first:
``2^k n_N (n_N + 1) / 2`` numbers, 480 for the 2,016-cell production schema. The table's schema
is the same either way; a reader recomputes the layout from the config and refuses a length that
does not match it. The column is null at the leaves measured with their level's own budget:
their covariance depends only on the level's queries, weights and whether its totals are
invariant, which ``gaussian_estimates.leaf_covariance`` recomputes from the config, so 8 M blocks
do not store 8 M copies; a leaf that spends a bypassed parent's budget too (``topdown.bypass``)
stores its own. A leaf's cells held at 0 are recomputed from its occupancy bits, which are
not stored here either (the job's node constraints carry them). ``exact_total`` marks nodes
whose total is invariant (the mean meets it exactly and the covariance is singular along
all-ones).

Every node is weighted by the exact ``sigma2`` of its own rows of ``noisy_measurements``. A
bypassed node (not measured) combines its one child's estimate with nothing: its bottom-up
estimate is its child's (conditioned on its invariant total, if it has one), and the top-down
pass below fits it among its siblings by that estimate's precision, then passes it down the
chain.

``total_variances`` turns the table into the variance of every node's bottom-up total (the
``--variances`` table).

``leaves_fit_their_answers`` says whether the top-down pass (``full_information``) fits the
leaves to their own answers, in which case the leaves' ``mean`` is not written.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from fractions import Fraction
from functools import reduce
from operator import add
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.families import PARENT, family_starts, map_children, map_families
from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.io import delta
from censusdp_spark.topdown.config import TopDownConfig
from censusdp_spark.topdown.estimate import (
    LevelPlan,
    child_bits,
    family_arrays,
    level_plan,
)
from censusdp_spark.topdown.occupancy import (
    allowed_entries,
    node_constraints,
    with_bits,
)
from censusdp_spark.topdown.readers import OCCUPIED
from censusdp_spark.topdown.solvers.gaussian_estimates import (
    Covariance,
    Gaussian,
    LevelDesign,
    held_core,
    hold_zeros,
    leaf_covariance,
    leaf_estimates,
    node_estimate,
    total_variance,
)
from censusdp_spark.topdown.solvers.symmetric_covariance import (
    SymmetricLayout,
    SymmetricMatrix,
    covariance_layout,
)

BOTTOM_UP = "bottom_up"
TOTAL_VARIANCES = "total_variances"
BOTTOM_UP_SCHEMA = (
    "level string, geocode string, mean array<double>, covariance array<double>,"
    " exact_total boolean"
)


def config_layout(config: TopDownConfig) -> SymmetricLayout | None:
    """The covariance layout of the run (None: dense), from its schema, every level's queries
    and its structural zeros (``solvers.symmetric_covariance.covariance_layout``)."""
    return covariance_layout(
        config.schema.shape,
        config.schema.names,
        config.structural_zero_cells,
        [q.cell_to_marginal for level in config.hierarchy.names for q in config.queries[level]],
    )


def level_design(plan: LevelPlan, layout: SymmetricLayout | None = None) -> LevelDesign:
    """A level's queries restricted to the non-structural-zero cells, with the run's covariance
    ``layout``."""
    active = ~plan.structural_zero
    return LevelDesign(
        level=plan.level,
        marginals=tuple(c2m[active] for c2m in plan.cell_to_marginal),
        marginal_sizes=plan.marginal_sizes,
        weights=plan.weights,
        rule=f"budget.levels.{plan.level}.queries",
        layout=layout,
    )


def pack(covariance: Covariance) -> np.ndarray:
    """The upper triangle of a symmetric matrix, row by row; a compact one's blocks'."""
    if isinstance(covariance, SymmetricMatrix):
        return covariance.pack()
    return covariance[np.triu_indices(covariance.shape[0])]


def unpack_covariance(packed: np.ndarray, design: LevelDesign) -> Covariance:
    """Inverse of ``pack`` under ``design``'s layout; ``ValueError`` on a length that does not
    match it."""
    if design.layout is not None:
        return SymmetricMatrix.unpack(design.layout, packed)
    n = design.n_cells
    if packed.shape != (n * (n + 1) // 2,):
        raise ValueError(
            f"a dense {n}-cell covariance has {n * (n + 1) // 2} packed entries, got"
            f" {packed.shape[0]}: the bottom_up table was written under another config"
        )
    return unpack(packed, n)


def unpack(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of ``pack`` for a dense matrix."""
    out = np.zeros((n, n))
    out[np.triu_indices(n)] = packed
    return out + np.triu(out, 1).T


class ChildEstimates:
    """Reads a family's child rows of ``bottom_up`` back into ``Gaussian`` estimates; the
    shared leaf covariance and its precision are computed once per task (per exactness of the
    totals and cells held at 0). ``plan``: the children's level's; their rows' ``OCCUPIED``
    bits, where present, give each child's cells held at 0 (``held_zeros``)."""

    def __init__(self, design: LevelDesign, is_leaf: bool, plan: LevelPlan) -> None:
        self.design = design
        self.is_leaf = is_leaf
        self.plan = plan
        self._leaf: dict[tuple[bool, str], Covariance] = {}
        self._leaf_precision: dict[tuple[bool, str], Covariance] = {}

    def precisions(self, rows: pd.DataFrame, estimates: list[Gaussian]) -> list[Covariance]:
        """Each child's ``Gaussian.precision``."""
        if not self.is_leaf:
            return [e.precision() for e in estimates]
        out = []
        for exact, packed, estimate in zip(
            rows["exact_total"], rows["covariance"], estimates, strict=True
        ):
            if packed is not None:  # a leaf with its own budget (bypassing)
                out.append(estimate.precision())
                continue
            key = (bool(exact), _key(estimate.zeros))
            if key not in self._leaf_precision:
                self._leaf_precision[key] = estimate.precision()
            out.append(self._leaf_precision[key])
        return out

    def estimates(self, rows: pd.DataFrame) -> list[Gaussian]:
        out = []
        for mean, packed, exact, zeros in zip(
            rows["mean"],
            rows["covariance"],
            rows["exact_total"],
            held_zeros(self.plan, self.design, rows),
            strict=True,
        ):
            mean = np.asarray(mean, dtype=np.float64)
            covariance: Covariance
            if self.is_leaf and packed is None:
                key = (bool(exact), _key(zeros))
                if key not in self._leaf:
                    shared = leaf_covariance(self.design, bool(exact))
                    self._leaf[key] = (
                        shared if zeros is None else hold_zeros(mean[None, :], shared, zeros)[1]
                    )
                covariance = self._leaf[key]
            else:
                covariance = unpack_covariance(np.asarray(packed, dtype=np.float64), self.design)
            total = float(np.round(mean.sum())) if exact else None
            out.append(Gaussian(mean, covariance, total, zeros))
        return out


def _key(zeros: np.ndarray | None) -> str:
    """A node's zero pattern as a hashable key. Hex text, not bytes: numpy compares an object
    array with bytes as ``np.bytes_``, which drops trailing zero bytes, so a pattern whose
    last cells are free matched nothing."""
    return "" if zeros is None else np.packbits(zeros).tobytes().hex()


def held_zeros(plan: LevelPlan, design: LevelDesign, rows: pd.DataFrame) -> list[np.ndarray | None]:
    """Per node (``rows`` one per node, or per node and query, sorted by geocode), the cells
    of ``design`` (the level's non-structural-zero cells) that its occupancy bits hold at 0, or
    None where there are none: always None without occupancy groups or without the
    ``OCCUPIED`` column. With a compact covariance only zeros that are whole core cells are
    held (an occupancy group over the attributes not held symmetric); a node whose zeros are
    not is not conditioned on them (its top-down fit still holds them)."""
    bits = child_bits(rows)
    k = int((~rows["geocode"].duplicated()).sum())
    allowed = allowed_entries(plan.occupancy, bits, ~plan.structural_zero)
    if allowed is None:
        return [None] * k
    layout = design.layout
    out: list[np.ndarray | None] = []
    for row in allowed:
        zeros = ~row
        whole = layout is None or held_core(layout, zeros) is not None
        out.append(zeros if zeros.any() and whole else None)
    return out


def _leaf_fits(
    plan: LevelPlan, design: LevelDesign, family: pd.DataFrame
) -> tuple[np.ndarray, list[Gaussian], list[np.ndarray | None]]:
    """One family of leaves' geocodes, their bottom-up estimates (the GLS of their own
    measurements, with their cells held at 0 by occupancy) and their ``covariance`` column:
    None for a leaf measured with its level's own budget (the shared covariance the config
    recomputes), packed for one that spends a bypassed parent's budget too."""
    geocodes, noisy, weights, totals = family_arrays(plan, family)
    k = len(geocodes)
    by_leaf = np.broadcast_to(weights, (k, len(noisy)))
    zeros = held_zeros(plan, design, family)
    means = np.zeros((k, design.n_cells))
    shared: dict[int, Covariance] = {}
    stored: list[np.ndarray | None] = [None] * k
    for row in np.unique(by_leaf, axis=0):
        members = np.flatnonzero((by_leaf == row).all(axis=1))
        own = np.array_equal(row, design.weights)
        here = design if own else replace(design, weights=row)
        means[members], covariance = leaf_estimates(
            here,
            tuple(a[members] for a in noisy),
            None if totals is None else totals[members],
        )
        patterns = np.array([_key(zeros[i]) for i in members], dtype=object)
        for pattern in dict.fromkeys(patterns.tolist()):
            group = members[patterns == pattern]
            held = zeros[group[0]]
            covariance_here: Covariance
            if held is not None:
                means[group], covariance_here = hold_zeros(means[group], covariance, held)
            else:
                covariance_here = covariance
            for i in group.tolist():
                shared[i] = covariance_here
                if not own:
                    stored[i] = pack(covariance_here)
    estimates = [
        Gaussian(means[i], shared[i], None if totals is None else float(totals[i]), zeros[i])
        for i in range(k)
    ]
    return geocodes, estimates, stored


def _bottom_up_rows(
    level: str,
    geocodes: Sequence[str] | np.ndarray,
    estimates: Sequence[Gaussian],
    covariances: Sequence[np.ndarray | None],
    exact: Sequence[bool],
    means: bool = True,
) -> pd.DataFrame:
    """The table's rows of ``estimates``; ``means`` false leaves ``mean`` null."""
    return pd.DataFrame(
        {
            "level": level,
            "geocode": list(geocodes),
            "mean": [e.mean for e in estimates] if means else None,
            "covariance": list(covariances),
            "exact_total": list(exact),
        }
    )


def _leaf_task(plan: LevelPlan, design: LevelDesign) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """Leaves' rows, for any batch of whole families of leaves."""

    def task(batch: pd.DataFrame) -> pd.DataFrame:
        geocodes, estimates, stored = _leaf_fits(plan, design, batch)
        exact = [e.total is not None for e in estimates]
        return _bottom_up_rows(plan.level, geocodes, estimates, stored, exact)

    return task


def _leaves_and_parents_task(
    leaf_plan: LevelPlan,
    leaf_design: LevelDesign,
    plan: LevelPlan,
    design: LevelDesign,
    leaf_means: bool,
) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """A batch of whole families of leaves (``map_children``'s rows) -> the leaves' rows and
    their parents': the leaves are fitted all at once, and their estimates go straight into
    their parents', without being written and read back first (the leaves' ``mean`` null
    unless ``leaf_means``)."""

    def task(batch: pd.DataFrame) -> pd.DataFrame:
        geocodes, estimates, stored = _leaf_fits(leaf_plan, leaf_design, batch)
        leaf_rows = family_starts(batch, ["geocode"])
        if len(leaf_rows) != len(geocodes):
            raise RuntimeError("bottom_up: a batch's leaves are not sorted by parent, geocode")
        family_rows = family_starts(batch, [PARENT])
        bounds = np.append(np.searchsorted(leaf_rows, family_rows), len(leaf_rows))
        fits = [
            _parent_fit(plan, design, batch, int(row), estimates[start:stop])
            for row, start, stop in zip(family_rows, bounds[:-1], bounds[1:], strict=True)
        ]
        leaves = [e.total is not None for e in estimates]
        return pd.concat(
            [
                _bottom_up_rows(leaf_plan.level, geocodes, estimates, stored, leaves, leaf_means),
                _parents_rows(plan.level, batch[PARENT].to_numpy()[family_rows], fits),
            ],
            ignore_index=True,
        )

    return task


def _node_task(
    plan: LevelPlan, design: LevelDesign, below: ChildEstimates
) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """A batch of whole families of inner nodes (``map_children``'s rows) -> their parents'
    rows."""

    def task(batch: pd.DataFrame) -> pd.DataFrame:
        family_rows = family_starts(batch, [PARENT])
        bounds = np.append(family_rows, len(batch))
        fits = [
            _parent_fit(plan, design, batch, int(start), below.estimates(batch.iloc[start:stop]))
            for start, stop in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return _parents_rows(plan.level, batch[PARENT].to_numpy()[family_rows], fits)

    return task


def _parents_rows(
    level: str, geocodes: np.ndarray, fits: Sequence[tuple[Gaussian, bool]]
) -> pd.DataFrame:
    return _bottom_up_rows(
        level,
        geocodes,
        [estimate for estimate, _ in fits],
        [pack(estimate.covariance) for estimate, _ in fits],
        [exact for _, exact in fits],
    )


def _parent_fit(
    plan: LevelPlan, design: LevelDesign, rows: pd.DataFrame, at: int, children: list[Gaussian]
) -> tuple[Gaussian, bool]:
    """A parent's bottom-up estimate from its children's and its own measurements (its
    ``parent_*`` columns from ``map_children``, read at row ``at``), and whether its total is
    invariant."""
    queries = rows["parent_queries"].iat[at]
    # A bypassed node has nothing of its own: no row (NaN here) unless its total is
    # invariant (then a row with null measurements).
    if not isinstance(queries, np.ndarray | list) or len(queries) == 0:
        answers = [np.zeros(size) for size in plan.marginal_sizes]
        here = replace(design, weights=np.zeros(len(plan.query_names)))
    else:
        measured = dict(
            zip(
                queries,
                zip(rows["parent_answers"].iat[at], rows["parent_sigma2"].iat[at], strict=True),
                strict=True,
            )
        )
        answers = [np.asarray(measured[n][0], dtype=np.float64) for n in plan.query_names]
        weights = np.array([1.0 / float(Fraction(measured[n][1])) for n in plan.query_names])
        here = design if np.array_equal(weights, design.weights) else replace(
            design, weights=weights
        )  # fmt: skip
    total = rows["parent_inv_total"].iat[at]
    exact = not pd.isna(total)
    return node_estimate(children, here, answers, float(total) if exact else None), exact


def bottom_up_level(
    plan: LevelPlan,
    noisy: DataFrame,
    invariant_totals: DataFrame,
    below: DataFrame | None,
    child_plan: LevelPlan | None,
    child_is_leaf: bool,
    parent_digits: int,
    digits: int,
    layout: SymmetricLayout | None = None,
) -> DataFrame:
    """One level's bottom-up rows (lazy).

    ``noisy`` and ``invariant_totals`` (``geocode, inv_total``) are this level's; ``below`` is
    the level below's ``bottom_up`` rows and ``child_plan`` its plan (both None at the leaves);
    ``child_is_leaf`` says whether the level below is the leaf level.
    Leaves are grouped by their parent (``parent_digits``), parents by their own geocode
    (``digits``). ``layout``: the run's covariance layout (``config_layout``).
    """
    if below is None or child_plan is None:
        return map_families(
            _leaf_measurements(noisy, invariant_totals).withColumn(
                "parent", geocode_prefix(parent_digits)
            ),
            family=["parent"],
            order=["geocode", "query"],
            solve=_leaf_task(plan, level_design(plan, layout)),
            schema=BOTTOM_UP_SCHEMA,
            batched=True,
        )
    return map_children(
        children_columns(below),
        _parent_measurements(noisy, invariant_totals),
        geocode_prefix(digits),
        order=["geocode"],
        solve=_node_task(
            plan,
            level_design(plan, layout),
            ChildEstimates(level_design(child_plan, layout), child_is_leaf, child_plan),
        ),
        schema=BOTTOM_UP_SCHEMA,
        batched=True,
    )


def bottom_up_leaves_and_parents(
    leaf_plan: LevelPlan,
    plan: LevelPlan,
    leaf_noisy: DataFrame,
    leaf_totals: DataFrame,
    noisy: DataFrame,
    invariant_totals: DataFrame,
    digits: int,
    layout: SymmetricLayout | None = None,
    leaf_means: bool = True,
) -> DataFrame:
    """The leaf level's and its parent level's bottom-up rows (lazy) in one pass: each task
    takes one parent's leaves' measurements and the parent's own, and returns the leaves'
    rows and the parent's. The same rows as ``bottom_up_level`` twice, without writing the
    leaves' rows and shuffling them again before their parents read them. Arguments as in
    ``bottom_up_level``: ``leaf_*`` the leaf level's, the others the parent level's;
    ``leaf_means`` false writes the leaves' ``mean`` null (nothing reads it)."""
    return map_children(
        _leaf_measurements(leaf_noisy, leaf_totals),
        _parent_measurements(noisy, invariant_totals),
        geocode_prefix(digits),
        order=["geocode", "query"],
        solve=_leaves_and_parents_task(
            leaf_plan, level_design(leaf_plan, layout), plan, level_design(plan, layout), leaf_means
        ),
        schema=BOTTOM_UP_SCHEMA,
        batched=True,
    )


def _leaf_measurements(noisy: DataFrame, invariant_totals: DataFrame) -> DataFrame:
    """A leaf's rows of ``noisy_measurements``, each with its invariant total (or null)."""
    own = noisy.select("geocode", "query", "noisy", "sigma2")
    return own.join(invariant_totals, "geocode", "left")


def _parent_measurements(noisy: DataFrame, invariant_totals: DataFrame) -> DataFrame:
    """One row per node: its measurements as ``queries, answers, sigma2`` (sorted by query)
    and ``inv_total``. Full outer: a bypassed node has no measurement but keeps its invariant
    total."""
    measured = (
        noisy.select("geocode", "query", "noisy", "sigma2")
        .groupBy("geocode")
        .agg(F.sort_array(F.collect_list(F.struct("query", "noisy", "sigma2"))).alias("m"))
    )
    return measured.select(
        "geocode",
        F.col("m.query").alias("queries"),
        F.col("m.noisy").alias("answers"),
        F.col("m.sigma2").alias("sigma2"),
    ).join(invariant_totals, "geocode", "full_outer")


def children_columns(below: DataFrame) -> DataFrame:
    bits = [OCCUPIED] if OCCUPIED in below.columns else []
    return below.select("geocode", "mean", "covariance", "exact_total", *bits)


def write_bottom_up(
    spark: SparkSession,
    config: TopDownConfig,
    noisy: DataFrame,
    invariant_totals: DataFrame,
    occupancy: DataFrame | None,
    output: Path,
    done: Collection[str],
    committed: Callable[[str], None],
) -> None:
    """The bottom-up pass, leaves first: each level not in ``done`` is computed from the
    ``bottom_up`` rows of the level below and written to its partition of ``bottom_up``, then
    ``committed(level)`` is called; the leaves and their parents, while the parents are not
    done, in one pass and one write (then ``committed`` for the leaves, then for their
    parents). When the top-down pass fits the leaves to their own answers
    (``leaves_fit_their_answers``) nothing reads the leaves' ``mean`` after that pass: it is
    written null (a dense mean per leaf would be most of the release's bytes).
    ``invariant_totals`` is ``level, geocode, inv_total``; ``occupancy`` every node's
    ``OCCUPIED`` bits (``occupancy.node_occupancy``), or None without occupancy groups.
    Raises ``ValueError`` naming the level and the config key when the leaf level's queries do
    not identify every cell."""
    levels = config.hierarchy.levels
    layout = config_layout(config)
    leaf_plan = level_plan(config, config.hierarchy.leaf.name)
    # Fail on the driver, before any Spark job, when the leaves are not identified.
    leaf_covariance(level_design(leaf_plan, layout), with_totals=False)

    def measured(level: str) -> tuple[DataFrame, DataFrame]:
        constraints = node_constraints(invariant_totals, occupancy, level)
        return noisy.filter(F.col("level") == level), constraints

    todo = [i for i in reversed(range(len(levels))) if levels[i].name not in done]
    leaf = len(levels) - 1
    if len(levels) > 1 and leaf - 1 in todo:
        parent = levels[leaf - 1]
        rows = bottom_up_leaves_and_parents(
            leaf_plan,
            level_plan(config, parent.name),
            *measured(levels[leaf].name),
            *measured(parent.name),
            parent.digits,
            layout,
            leaf_means=not leaves_fit_their_answers(config),
        )
        delta.write_levels(rows, output, BOTTOM_UP, [levels[leaf].name, parent.name])
        committed(levels[leaf].name)
        committed(parent.name)
        todo = [i for i in todo if i < leaf - 1]
    for i in todo:
        level = levels[i]
        is_leaf = i == leaf
        below = None
        child_plan = None
        if not is_leaf:
            below = with_bits(
                delta.read_table(spark, output, BOTTOM_UP).filter(
                    F.col("level") == levels[i + 1].name
                ),
                occupancy,
                levels[i + 1].name,
            )
            child_plan = level_plan(config, levels[i + 1].name)
        rows = bottom_up_level(
            level_plan(config, level.name),
            *measured(level.name),
            below,
            child_plan,
            i + 1 == leaf,
            levels[i - 1].digits if i else 0,
            level.digits,
            layout,
        )
        delta.write_level(rows, output, BOTTOM_UP, level.name)
        committed(level.name)


def leaves_fit_their_answers(config: TopDownConfig) -> bool:
    """Whether the top-down pass fits the leaves to their own noisy answers (``topdown``'s
    path, which does not read their rows of ``bottom_up``) rather than to their bottom-up
    estimates. It gives the same fit: a leaf's bottom-up estimate ``b`` is the GLS of its own
    measurements alone, so ``(x - b)^T P (x - b)`` is its answers' weighted squared error up
    to a constant, on every set of cells and under every constraint the fit holds. Not with a
    total-first pass at the leaves (its totals are fitted to the noisy ``total`` instead of
    the bottom-up total), nor with bypassing (the rounder would weigh each leaf by its own
    rows rather than by the level's budget)."""
    leaf = config.hierarchy.names[-1]
    return "total" not in config.passes_at(leaf) and not config.bypass_single_child


def total_variances(
    bottom_up: DataFrame, config: TopDownConfig, occupancy: DataFrame | None = None
) -> DataFrame:
    """``level, geocode, variance`` (lazy): the variance ``1^T C 1`` of every node's bottom-up
    total, 0 where the total is invariant; a leaf's with its cells held at 0 by its
    ``occupancy`` bits (``occupancy.node_occupancy``; None without occupancy groups).

    It is the uncertainty of the BLUE of the node's total from everything measured at and
    below the node, computed from the noise variances alone (no data): a reference for the
    released total, which the top-down pass then fits to its parent and rounds, not that
    released value's own variance."""
    leaf = config.hierarchy.leaf.name
    layout = config_layout(config)
    plan = level_plan(config, leaf)
    design = level_design(plan, layout)
    shared = leaf_covariance(design, with_totals=False)
    leaf_variance: Column = F.lit(total_variance(shared))
    if occupancy is not None:
        leaves = occupancy.filter(F.col("level") == leaf)
        bottom_up = bottom_up.join(leaves, ["level", "geocode"], "left")
        for (bits,) in leaves.select(OCCUPIED).distinct().collect():
            zeros = held_zeros(plan, design, pd.DataFrame({"geocode": [""], OCCUPIED: [bits]}))[0]
            if zeros is not None:
                held = hold_zeros(np.zeros((1, design.n_cells)), shared, zeros)[1]
                leaf_variance = F.when(F.col(OCCUPIED) == bits, total_variance(held)).otherwise(
                    leaf_variance
                )
    # Dense: 1^T C 1 from C's packed upper triangle. Compact: M 1_N^T B_0 1_N, B_0 the first
    # packed block (the other blocks are orthogonal to all-ones).
    n, factor = (design.n_cells, 1.0) if layout is None else (layout.core_cells, layout.spread)
    # Row i of the packed upper triangle starts, with its diagonal entry, at i n - i (i - 1) / 2.
    diagonal = [F.element_at("covariance", i * n - i * (i - 1) // 2 + 1) for i in range(n)]
    first = F.slice("covariance", 1, n * (n + 1) // 2)
    packed = F.aggregate(first, F.lit(0.0), lambda a, b: a + b)
    variance = (
        F.when(F.col("exact_total"), F.lit(0.0))
        .when(F.col("covariance").isNull(), leaf_variance)
        .otherwise(factor * (2.0 * packed - reduce(add, diagonal)))
    )
    return bottom_up.select("level", "geocode", variance.alias("variance"))
