"""The nation assembled from state-by-state runs, as BlueDown assembles it (its passes 1-4).

A state-by-state run (``--states``) estimates each state as the root of its own tree; its
``bottom_up`` state row is the state's estimate from its own subtree's measurements alone
(BlueDown's first, per-state pass). The nation takes two more steps, each a run of its own:

* **the nation** (``--assemble-nation PART ...``, ``read_state_runs``): the file's root folders
  alone (the nation's measurements and total) and, from each state run, its state-level rows:
  measurements, held totals and ``bottom_up`` row. The nation's bottom-up estimate combines the
  states' with the nation's measurements; TopDown then estimates the nation and the states
  under it (BlueDown's root passes), and the release holds those two levels;
* **each state again** (``--states S --state-estimates NATION``, ``held_states``): the state
  is held to the nation run's estimate of it instead of being estimated as a root; below it
  TopDown runs as usual (BlueDown's last, per-state pass), from the bottom-up rows the first
  state runs wrote (not computed again, while those runs are there).

The nation run's estimates and the second state runs' levels below the state are, together,
the release a national run of the whole file makes, row for row.

Every part is checked before anything is written (one-line ``ValueError`` naming the folder and
the rule): a censusdp TopDown release made state by state, with the config's estimation
method; no state in two parts; every state the file has in some part.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.io import delta
from censusdp_spark.release.runner import log
from censusdp_spark.topdown.bottom_up import BOTTOM_UP
from censusdp_spark.topdown.config import TopDownConfig, invariant_levels
from censusdp_spark.topdown.given import GivenMeasurements
from censusdp_spark.topdown.nmf_layout import STATE_LEVEL

STATE_RUNS = "state_runs"
"""The manifest key (under ``post_processing``) of a nation assembled from state runs."""


@dataclass(frozen=True)
class StateRuns:
    """The state level of the state runs a nation is assembled from (lazy Spark frames).

    * ``states``: every state, in code order; ``parts``: the runs' folders, as given;
    * ``noisy``: the states' rows of the runs' ``noisy_measurements``;
    * ``invariants``: ``level, geocode, inv_total`` of the states, where the config holds them
      (from the runs' estimates, which hold them exactly);
    * ``bottom_up``: the states' ``bottom_up`` rows (None unless ``full_information``)."""

    parts: tuple[Path, ...]
    states: tuple[str, ...]
    noisy: DataFrame
    invariants: DataFrame
    bottom_up: DataFrame | None

    @property
    def geography(self) -> DataFrame:
        return self.noisy.select("level", "geocode").distinct()


def read_state_runs(
    spark: SparkSession, parts: tuple[Path, ...], config: TopDownConfig, known: list[str]
) -> StateRuns:
    """The state rows of the state runs at ``parts``, checked: each a finished state-by-state
    TopDown release with the config's estimation method, no state in two of them, and together
    every state of ``known`` (the file's)."""
    owner: dict[str, Path] = {}
    for part in parts:
        for state in _states_of(part, config):
            if state in owner:
                raise ValueError(
                    f"{part}: state {state} is also in {owner[state]}; each state comes from"
                    " one run"
                )
            owner[state] = part
    missing = [s for s in known if s not in owner]
    if missing:
        raise ValueError(
            f"{', '.join(str(p) for p in parts)}: no run of state {missing[0]} (the nation"
            f" needs every state: {len(missing)} of {len(known)} missing)"
        )
    unknown = sorted(set(owner) - set(known))
    if unknown:
        raise ValueError(f"{owner[unknown[0]]}: state {unknown[0]} is not one of the file's states")
    state = config.hierarchy.levels[STATE_LEVEL].name
    ours = F.col("level") == state

    def union(table: str) -> DataFrame:
        frames = [delta.read_table(spark, p, table).filter(ours) for p in parts]
        return reduce(DataFrame.unionByName, frames)

    noisy = union(delta.NOISY_MEASUREMENTS)
    totals = (
        union(delta.ESTIMATES).groupBy("level", "geocode").agg(F.sum("count").alias("inv_total"))
    )
    held = state in invariant_levels(config)
    invariants = (
        noisy.select("level", "geocode")
        .distinct()
        .join(totals, ["level", "geocode"], "left")
        .select(
            "level", "geocode", F.coalesce("inv_total", F.lit(0)).cast("long").alias("inv_total")
        )
        .filter(F.lit(held))
    )
    full_information = config.estimation_method == "full_information"
    bottom_up = union(BOTTOM_UP) if full_information else None
    return StateRuns(tuple(parts), tuple(sorted(owner)), noisy, invariants, bottom_up)


def with_state_runs(root: GivenMeasurements, runs: StateRuns) -> GivenMeasurements:
    """The root's measurements (``root``: the file's root alone) and the state runs' state
    rows, as one file's."""
    return replace(
        root,
        noisy=root.noisy.unionByName(runs.noisy),
        invariants=root.invariants.unionByName(runs.invariants),
        geography=root.geography.unionByName(runs.geography),
    )


def _states_of(part: Path, config: TopDownConfig) -> list[str]:
    """The states of the state run at ``part`` (its manifest), refused in one line if it is not
    a finished state-by-state TopDown release with the config's estimation method."""
    manifest = _manifest(part, config)
    states = (manifest.get("post_processing") or {}).get("state_by_state") or {}
    if not states.get("states"):
        raise ValueError(
            f"{part / 'manifest.json'}: not a state-by-state run (made without --states)"
        )
    tables = [delta.NOISY_MEASUREMENTS, delta.ESTIMATES]
    if config.estimation_method == "full_information":
        tables.append(BOTTOM_UP)
    for table in tables:
        if not delta.is_table(part, table):
            raise ValueError(f"{part}: no {table} table; the state run is incomplete")
    return list(states["states"])


def _manifest(release: Path, config: TopDownConfig) -> dict[str, Any]:
    """The manifest (written last) of a finished TopDown release estimated by the config's
    method, or a one-line refusal."""
    path = release / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{release}: not a finished censusdp release (no manifest.json)")
    manifest: dict[str, Any] = json.loads(path.read_text())
    if manifest.get("release_kind") != "topdown":
        raise ValueError(f"{path}: a {manifest.get('release_kind')} release, not a TopDown one")
    method = (manifest.get("estimation") or {}).get("method")
    if method != config.estimation_method:
        raise ValueError(
            f"{path}: estimated with {method}; {config.source} estimates with"
            f" {config.estimation_method} (every run of a nation uses one method)"
        )
    return manifest


@dataclass(frozen=True)
class HeldStates:
    """What a state run held to an assembled nation (``--state-estimates``) takes from it:

    * ``estimates``: the states' rows of the nation's estimates (long format);
    * ``bottom_up``: the ``bottom_up`` rows of the states' subtrees, from the state runs the
      nation was assembled from (the same rows the run would compute: the bottom-up pass is
      not run twice); None without ``full_information`` or when one of those runs is gone
      (the run then computes them);
    * ``runs``: the state runs read."""

    estimates: DataFrame
    bottom_up: DataFrame | None
    runs: tuple[Path, ...]


def held_states(
    spark: SparkSession, nation: Path, config: TopDownConfig, states: tuple[str, ...]
) -> HeldStates:
    """What ``states`` take from the nation assembled at ``nation`` (``--assemble-nation``),
    refused in one line if it is not one or lacks a state."""
    manifest = _manifest(nation, config)
    assembled = (manifest.get("post_processing") or {}).get(STATE_RUNS)
    if not assembled:
        raise ValueError(
            f"{nation / 'manifest.json'}: not a nation assembled from state runs (made"
            " without --assemble-nation)"
        )
    level = config.hierarchy.levels[STATE_LEVEL].name
    ours = (F.col("level") == level) & F.col("geocode").isin(list(states))
    measured = delta.read_table(spark, nation, delta.NOISY_MEASUREMENTS).filter(ours)
    found = {r["geocode"] for r in measured.select("geocode").distinct().collect()}
    absent = [s for s in states if s not in found]
    if absent:
        raise ValueError(f"{nation}: state {absent[0]} is not in the nation's release")
    estimates = delta.read_table(spark, nation, delta.ESTIMATES).filter(ours)
    runs = [Path(p) for p in assembled["runs"]]
    bottom_up = None
    if config.estimation_method == "full_information" and all(_finished(p) for p in runs):
        bottom_up = _subtrees_bottom_up(spark, runs, config, states)
    else:
        runs = []
    return HeldStates(estimates, bottom_up, tuple(runs))


def _finished(part: Path) -> bool:
    """Whether the state run at ``part`` is still there, finished (else logged)."""
    if (part / "manifest.json").is_file() and delta.is_table(part, BOTTOM_UP):
        return True
    log.info("%s: the state run is gone; its states' bottom-up pass is computed again", part)
    return False


def _subtrees_bottom_up(
    spark: SparkSession, parts: list[Path], config: TopDownConfig, states: tuple[str, ...]
) -> DataFrame:
    """The ``bottom_up`` rows of the subtrees of ``states`` (state level down), from the state
    runs at ``parts`` that hold them."""
    digits = config.hierarchy.levels[STATE_LEVEL].digits
    below_root = F.col("level") != config.hierarchy.root.name
    frames = []
    for part in parts:
        theirs = [s for s in _states_of(part, config) if s in states]
        if theirs:
            rows = delta.read_table(spark, part, BOTTOM_UP)
            frames.append(rows.filter(below_root & F.col("geocode").substr(1, digits).isin(theirs)))
    return reduce(DataFrame.unionByName, frames)
