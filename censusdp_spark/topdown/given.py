"""Noisy measurements given, not drawn: TopDown's estimation of measurements made elsewhere.

``censusdp topdown --noisy-measurements PATH --noisy-format FORMAT`` estimates from a file of
noisy measurements someone already released: the Census Bureau's Noisy Measurement File
(``census_nmf``, ``topdown.nmf``) or a TopDown release of this project (``censusdp``: its
folder, whose ``noisy_measurements`` table is read). Post-processing spends no privacy budget
and draws no noise, so no secret is read or made.

What the estimation takes from the file, and from the config:

* the measurements, each with the variance it was drawn with (the file's, never the config's
  budget: a ``[budget]`` that disagrees is reported in the summary and the manifest, not used);
* the geography: every node is a prefix of a leaf geocode the file holds, at the config's
  ``[geography] levels`` digits;
* the values held exact: the node totals at the config's invariant levels (``invariants``
  and every level above), from the file (an NMF's constraints; a ``censusdp`` release's
  estimates, which hold them exactly);
* from the config: the schema, the queries' definitions, structural zeros and the estimation
  settings.

State by state (``states``): only those states' subtrees are read, below the root; the run
estimates each state as the root of its own tree (``topdown.job``) and releases no root row.

Not yet: ``[budget] bypass_single_child`` (a node's chain of levels is not in an NMF) and
``[[estimation.occupancy]]`` / ``[estimation] dwellings`` (their bounds come from an input
table): each is refused in one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.hierarchy import geocode_prefix
from censusdp_spark.io import delta
from censusdp_spark.model.geography import EVERY_LEVEL, Hierarchy, LevelSpan
from censusdp_spark.privacy.accounting import allocate_per_query_rho
from censusdp_spark.topdown.config import TopDownConfig, invariant_levels
from censusdp_spark.topdown.nmf import file_states, read_nmf, write_nmf
from censusdp_spark.topdown.nmf_layout import STATE_LEVEL


class NoisyFormat(StrEnum):
    """The layouts ``--noisy-format`` reads."""

    CENSUS_NMF = "census_nmf"
    """The Census Bureau's Noisy Measurement File (``topdown.nmf``)."""
    CENSUSDP = "censusdp"
    """A TopDown release folder of censusdp: its ``noisy_measurements`` and ``estimates``."""


@dataclass(frozen=True)
class GivenMeasurements:
    """Noisy measurements read from ``source`` (lazy Spark frames):

    * ``noisy``: the ``noisy_measurements`` schema (``topdown.measure.NOISY_SCHEMA``);
    * ``invariants``: ``level, geocode, inv_total`` of every node at the invariant levels;
    * ``geography``: ``level, geocode`` of every node of every level."""

    source: Path
    format: NoisyFormat
    noisy: DataFrame
    invariants: DataFrame
    geography: DataFrame

    def only(self, nodes: Column) -> GivenMeasurements:
        """The rows of the nodes where ``nodes`` (over ``level`` and ``geocode``) holds."""
        return replace(
            self,
            noisy=self.noisy.filter(nodes),
            invariants=self.invariants.filter(nodes),
            geography=self.geography.filter(nodes),
        )


@dataclass(frozen=True)
class GivenBudget:
    """The config with the file's variances as its budget (``config``: the queries the file
    measured, in the config's order, each at ``rho = 1 / sigma2``) and the ways the config's
    own ``[budget]`` disagrees with the file (``disagreements``, one line each)."""

    config: TopDownConfig
    disagreements: tuple[str, ...]
    exact: dict[tuple[str, str], Fraction]
    """``(level, query)`` -> the config's exact ``sigma2`` where the file's is its float
    (``FLOAT_ROUNDING``): the noisy rows' ``sigma2`` to write instead of the float's value."""

    def with_exact_variances(self, noisy: DataFrame) -> DataFrame:
        """``noisy`` with the exact ``sigma2`` of every query whose file variance was a float
        of the config's."""
        if not self.exact:
            return noisy
        pairs = [
            x for (lv, q), v in self.exact.items() for x in (F.lit(f"{lv}|{q}"), F.lit(str(v)))
        ]
        key = F.concat_ws("|", "level", "query")
        return noisy.withColumn("sigma2", F.coalesce(F.create_map(*pairs)[key], F.col("sigma2")))


FLOAT_ROUNDING = 1e-12
"""A file's variance within this relative distance of the config's exact ``sigma2`` is that
value stored as a float (the Census's file holds floats): the exact fraction is used."""


def refuse_unsupported(config: TopDownConfig, source: Path) -> None:
    """What post-processing cannot take yet, in one line each."""
    if config.bypass_single_child:
        raise ValueError(
            f"{config.source}: [budget] bypass_single_child: post-processing {source} needs"
            " every node measured at its own level; set it to false"
        )
    if config.occupancy or config.dwellings:
        raise ValueError(
            f"{config.source}: [[estimation.occupancy]] and [estimation] dwellings come from an"
            f" input table, which post-processing {source} does not read; remove them"
        )


def read_given(
    spark: SparkSession,
    source: Path,
    fmt: NoisyFormat,
    config: TopDownConfig,
    states: tuple[str, ...] = (),
    root_only: bool = False,
) -> GivenMeasurements:
    """The noisy measurements at ``source`` in layout ``fmt``, checked against ``config``
    (one-line ``ValueError`` naming the file, the row and the rule). With ``states`` (a
    state-by-state run), only those states' nodes: the levels below the root, each state's
    subtree (an NMF's other ``State=`` folders and its root folder are not opened). With
    ``root_only``, the root's alone (an NMF's root folders; assembling the nation from state
    runs)."""
    refuse_unsupported(config, source)
    if fmt is NoisyFormat.CENSUS_NMF:
        measured = read_nmf(spark, source, config, states, root_only)
        given = GivenMeasurements(
            source, fmt, measured.noisy, measured.invariants, measured.geography
        )
    else:
        given = read_censusdp_release(spark, source, config)
        if states:
            given = _only_states(given, config, states)
        if root_only:
            given = given.only(F.col("level") == config.hierarchy.root.name)
    return _held_where_the_config_says(given, config)


def given_states(
    spark: SparkSession, source: Path, fmt: NoisyFormat, config: TopDownConfig
) -> list[str]:
    """The codes of the states at ``source``, sorted: an NMF's State ``State=`` folders (names
    only), a release's state-level geocodes."""
    if fmt is NoisyFormat.CENSUS_NMF:
        return file_states(source.absolute(), config)
    state = config.hierarchy.levels[STATE_LEVEL].name
    noisy = delta.read_table(spark, source, delta.NOISY_MEASUREMENTS)
    rows = noisy.filter(F.col("level") == state).select("geocode").distinct().collect()
    return sorted(r["geocode"] for r in rows)


def _only_states(
    given: GivenMeasurements, config: TopDownConfig, states: tuple[str, ...]
) -> GivenMeasurements:
    """``given`` cut to the subtrees of ``states`` (a state's code unknown to it is refused)."""
    state = config.hierarchy.levels[STATE_LEVEL]
    known = {
        r["geocode"]
        for r in given.geography.filter(F.col("level") == state.name).select("geocode").collect()
    }
    unknown = [s for s in states if s not in known]
    if unknown:
        raise ValueError(
            f"{given.source}: state {unknown[0]!r}: unknown (level {state.name} has"
            f" {len(known)} nodes: {', '.join(sorted(known)[:10])})"
        )
    below_root = F.col("level") != config.hierarchy.root.name
    return given.only(below_root & F.col("geocode").substr(1, state.digits).isin(list(states)))


def _held_where_the_config_says(
    given: GivenMeasurements, config: TopDownConfig
) -> GivenMeasurements:
    """The file's node totals at the config's invariant levels, every node's there: a node
    without its total is refused (the config holds it exact); totals at other levels are not
    held."""
    held = invariant_levels(config)
    invariants = given.invariants.filter(F.col("level").isin(held))
    missing = (
        given.geography.filter(F.col("level").isin(held))
        .join(invariants, ["level", "geocode"], "left_anti")
        .orderBy("level", "geocode")
        .limit(1)
        .collect()
        if held
        else []
    )
    if missing:
        level, geocode = missing[0]["level"], missing[0]["geocode"]
        raise ValueError(
            f"{given.source}: level {level}, geocode {geocode!r}: no node total in the file,"
            f" but {config.source} holds the {level} totals exact ([estimation] invariants)"
        )
    return replace(given, invariants=invariants)


def read_censusdp_release(
    spark: SparkSession, source: Path, config: TopDownConfig
) -> GivenMeasurements:
    """A censusdp TopDown release's noisy measurements; its invariant node totals are its
    estimates' (which hold them exactly), zero for a node without a non-zero cell."""
    manifest = source / "manifest.json"
    if not manifest.is_file():
        raise ValueError(f"{source}: not a censusdp release (no manifest.json)")
    kind = json.loads(manifest.read_text()).get("release_kind")
    if kind != "topdown":
        raise ValueError(
            f"{manifest}: a {kind} release; --noisy-format censusdp needs a TopDown one"
        )
    for table in (delta.NOISY_MEASUREMENTS, delta.ESTIMATES):
        if not delta.is_table(source, table):
            raise ValueError(f"{source}: no {table} table; the release is incomplete")
    noisy = delta.read_table(spark, source, delta.NOISY_MEASUREMENTS)
    geography = geography_of(noisy, config.hierarchy)
    held = invariant_levels(config)
    totals = (
        delta.read_table(spark, source, delta.ESTIMATES)
        .filter(F.col("level").isin(held))
        .groupBy("level", "geocode")
        .agg(F.sum("count").alias("inv_total"))
    )
    invariants = (
        geography.filter(F.col("level").isin(held))
        .join(totals, ["level", "geocode"], "left")
        .select(
            "level", "geocode", F.coalesce("inv_total", F.lit(0)).cast("long").alias("inv_total")
        )
    )
    return GivenMeasurements(source, NoisyFormat.CENSUSDP, noisy, invariants, geography)


def export_nmf(spark: SparkSession, release: Path, config: TopDownConfig, out: Path) -> None:
    """Write the TopDown release at ``release`` (made with ``config``) in the Census NMF layout
    at ``out`` (``topdown.nmf``): its noisy measurements and its invariant node totals, for
    BlueDown or any tool that reads the Census's file, and back (``--noisy-format
    census_nmf``)."""
    given = read_censusdp_release(spark, release, config)
    write_nmf(spark, given.noisy, given.invariants, config, out)


def geography_of(noisy: DataFrame, hierarchy: Hierarchy) -> DataFrame:
    """``level, geocode`` of every node: each level's prefixes of the measured leaves."""
    leaves = noisy.filter(F.col("level") == hierarchy.leaf.name).select("geocode").distinct()
    return reduce(
        DataFrame.unionByName,
        [
            leaves.select(
                F.lit(lv.name).alias("level"), geocode_prefix(lv.digits).alias("geocode")
            ).distinct()
            for lv in hierarchy.levels
        ],
    )


def given_budget(
    noisy: DataFrame, config: TopDownConfig, source: Path, span: LevelSpan = EVERY_LEVEL
) -> GivenBudget:
    """The budget the file's variances spend (``rho = 1 / sigma2`` per query: a marginal's
    squared sensitivity is 2) as the config's, and how the config's own disagrees. Every
    level of ``span`` must be measured, every query once per level with one variance; the
    other levels (the root, in a state's run, which does not read it; below the states, in
    the nation's assembly) take the config's ``[budget]``."""
    classes = (
        noisy.groupBy("level", "query")
        .agg(F.countDistinct("sigma2").alias("variances"), F.min("sigma2").alias("sigma2"))
        .collect()
    )
    found: dict[str, dict[str, Fraction]] = {}
    for row in classes:
        if row["variances"] != 1:
            raise ValueError(
                f"{source}: level {row['level']}, query {row['query']!r}: {row['variances']}"
                " different variances; a query of a level has one"
            )
        found.setdefault(row["level"], {})[row["query"]] = Fraction(row["sigma2"])
    exact = _floats_of_the_config(found, config)
    for (level, query), value in exact.items():
        found[level][query] = value
    levels = config.hierarchy.names
    read = span.names(config.hierarchy)
    for level in (lv for lv in levels if lv not in read):
        found[level] = {
            q.name: config.budget.sigma2_for(level, q.name) for q in config.queries[level]
        }
    for level in levels:
        if level not in found:
            raise ValueError(f"{source}: no measurement of level {level!r}")
        unknown = sorted(set(found[level]) - {q.name for q in config.queries[level]})
        if unknown:
            raise ValueError(
                f"{source}: level {level!r}: query {unknown[0]!r} is not one of the config's"
                f" queries there ({config.source})"
            )
    queries = {lv: tuple(q for q in config.queries[lv] if q.name in found[lv]) for lv in levels}
    budget = allocate_per_query_rho(
        {lv: {q.name: 1 / found[lv][q.name] for q in queries[lv]} for lv in levels}, levels
    )
    return GivenBudget(
        replace(config, budget=budget, queries=queries),
        tuple(_disagreements(config, found)),
        exact,
    )


def _floats_of_the_config(
    found: dict[str, dict[str, Fraction]], config: TopDownConfig
) -> dict[tuple[str, str], Fraction]:
    """The file's variances that are the config's exact ``sigma2`` stored as a float."""
    exact = {}
    for level, queries in found.items():
        known = {q.name for q in config.queries.get(level, ())}
        for query, given in queries.items():
            if query not in known:
                continue
            wanted = config.budget.sigma2_for(level, query)
            if given != wanted and math.isclose(given, wanted, rel_tol=FLOAT_ROUNDING):
                exact[(level, query)] = wanted
    return exact


def _disagreements(config: TopDownConfig, found: dict[str, dict[str, Fraction]]) -> list[str]:
    lines = []
    for level in config.hierarchy.names:
        for query in config.queries[level]:
            given = found[level].get(query.name)
            wanted = config.budget.sigma2_for(level, query.name)
            if given is None:
                lines.append(f"{level} {query.name}: in [budget], not measured in the file")
            elif given != wanted:
                lines.append(
                    f"{level} {query.name}: sigma2 {float(wanted):.6g} in [budget],"
                    f" {float(given):.6g} in the file (the file's is used)"
                )
    return lines
