"""The TopDown release job, shared by ``censusdp topdown`` and ``spark-submit jobs/topdown.py``.

Stages (each a Spark job; nothing per node is collected to the driver):
1. read and validate the input (nothing is written if it fails);
2. node histograms for every level (confidential, in memory only);
3. measurement: one noise pass over every node (with ``[budget] bypass_single_child``, every
   node the public bypass plan measures), written once to ``noisy_measurements``;
4. estimation level by level from the noisy table, each level written to ``estimates`` before
   the next level reads it;
5. guarantees checked; ``microdata`` regenerated from the block estimates; with
   ``[output.pl94_tables]``, the P.L. 94-171 tables of every node from the estimates
   (``pl94_tables`` and its CSV copies);
6. with ``evaluate``: error against the truth in ``<output>.evaluation/``, beside the release
   and never inside it (internal, not for release);
7. the manifest, last.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.families import level_shapes
from censusdp_spark.engine.hierarchy import node_histograms, node_totals
from censusdp_spark.engine.progress import reporting_progress
from censusdp_spark.engine.session import local_mode
from censusdp_spark.io import delta
from censusdp_spark.model.errors import GuaranteeViolation
from censusdp_spark.privacy.unit import PrivacyUnit
from censusdp_spark.release.runner import (
    ReleaseContents,
    ReleaseRun,
    input_fingerprint,
    log,
    release_contents,
    with_command_line,
)
from censusdp_spark.topdown.bottom_up import (
    BOTTOM_UP,
    TOTAL_VARIANCES,
    config_layout,
    leaves_fit_their_answers,
    total_variances,
    write_bottom_up,
)
from censusdp_spark.topdown.bypass import measurement_plan, plan_summary
from censusdp_spark.topdown.capacity import check_disk, check_memory
from censusdp_spark.topdown.census_tables import PL94_TABLES, write_census_tables
from censusdp_spark.topdown.checks import check_estimates, check_measurements
from censusdp_spark.topdown.config import RunConfig, privacy_unit
from censusdp_spark.topdown.estimate import estimate_level, level_measurements, level_plan
from censusdp_spark.topdown.evaluate import EVALUATION_SCHEMA, evaluation_table, plot_errors
from censusdp_spark.topdown.full_information import estimate_level_from_bottom_up
from censusdp_spark.topdown.manifest import budget_rows, privacy_summary
from censusdp_spark.topdown.measure import measure
from censusdp_spark.topdown.microdata import microdata
from censusdp_spark.topdown.occupancy import (
    bounds_broken,
    cells_outside_occupancy,
    group_cells,
    node_constraints,
    node_occupancy,
)
from censusdp_spark.topdown.readers import read_blocks
from censusdp_spark.topdown.resume import redo_unfinished_steps, remove_uncommitted_files

TOPDOWN = "topdown"


@dataclass(frozen=True)
class TopDownOptions:
    input: Path | None = None
    output: Path | None = None
    secret_file: Path | None = None
    evaluate: bool = False
    overwrite: bool = False
    resume: bool = False
    reuse_secret: bool = False
    variances: bool = False  # write total_variances (full_information only)
    evaluation_output: Path | None = None  # None: <output>.evaluation


@dataclass
class RunSummary:
    output: Path
    levels: list[str]
    nodes: dict[str, int]
    rho: str
    epsilon: float
    delta: float
    elapsed_s: float
    timings: dict[str, float] = field(default_factory=dict)
    evaluation: list[dict[str, Any]] = field(default_factory=list)
    for_release: bool = True
    evaluation_dir: Path | None = None
    method: str = "topdown"
    method_fallback: str = ""
    bypass: str = ""  # the bypassed single-child parents per level, with bypassing
    tables: list[str] = field(default_factory=list)  # the Delta tables written
    privacy_unit: PrivacyUnit | None = None

    def text(self) -> str:
        lines = [
            f"TopDown release written to {self.output}"
            + ("" if self.for_release else " (NOT FOR RELEASE: --reuse-secret)"),
            "  levels: " + ", ".join(f"{lv} ({self.nodes[lv]} nodes)" for lv in self.levels),
            f"  estimation: {self.method}"
            + (f" (fallback: {self.method_fallback})" if self.method_fallback else ""),
            *([self.bypass] if self.bypass else []),
            f"  privacy: rho = {self.rho} (~{float(Fraction(self.rho)):.4f}) zCDP,"
            f" epsilon = {self.epsilon:.2f} at delta = {self.delta:g}",
            *(self.privacy_unit.lines("  ") if self.privacy_unit else []),
            f"  elapsed: {self.elapsed_s:.1f} s ("
            + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items())
            + ")",
            f"  tables: {', '.join(delta.table_path(self.output, t) for t in self.tables)}",
            f"  manifest: {self.output / 'manifest.json'}",
        ]
        if self.evaluation_dir is not None:
            lines.append(f"  evaluation (internal, not for release): {self.evaluation_dir}")
            lines += _headline(self.evaluation, self.levels)
        return "\n".join(lines)


def _headline(rows: list[dict[str, Any]], levels: list[str]) -> list[str]:
    """Total-population MAE per level: each method's, the baseline's drawn and expected."""
    mae = {(r["method"], r["level"], r["metric"]): r["value"] for r in rows}
    methods = sorted({r["method"] for r in rows} - {"block_by_block"})
    out = []
    for level in levels:
        here = [f"{m} {mae[(m, level, 'mae_total')]:.2f}" for m in methods]
        base = ("block_by_block", level)
        if (*base, "mae_total") in mae:
            here.append(
                f"block_by_block {mae[(*base, 'mae_total')]:.2f}"
                f" (expected {mae[(*base, 'expected_mae_total')]:.2f})"
            )
        out.append(f"    {level:<12} total-population MAE: " + ", ".join(here))
    return out


def _apply_options(config: RunConfig, options: TopDownOptions) -> RunConfig:
    run = with_command_line(config.run, options.output, options.secret_file)
    spec = config.input
    if spec is None:
        raise ValueError(f"{config.source}: [input] missing: the TopDown job needs an input table")
    if options.input is None:
        return replace(config, run=run)
    spec = replace(spec, path=options.input)
    spine = config.spine.for_input(spec.path) if config.spine else None
    return replace(config, run=run, input=spec, spine=spine)


ESTIMATION_KEYS = (
    ("estimation", "method"),
    ("estimation", "passes"),
    ("estimation", "fallback"),
    ("estimation", "occupancy"),
    ("estimation", "dwellings"),
)
"""Config keys that change only the estimation from the noisy measurements, not the noise."""
OUTPUT_KEYS = (("output", "pl94_tables"),)
"""Config keys that change only what is computed from the estimates."""
DWELLINGS_TABLE = "estimation.dwellings table"
"""The estimation key of the dwelling counts' content (read to estimate, never measured)."""


def release_tables(config: RunConfig, variances: bool) -> list[str]:
    """The Delta tables of a TopDown release of ``config``, as its manifest lists them."""
    return (
        [delta.NOISY_MEASUREMENTS, delta.ESTIMATES, delta.MICRODATA]
        + ([BOTTOM_UP] if config.estimation_method == "full_information" else [])
        + ([TOTAL_VARIANCES] if variances else [])
        + ([PL94_TABLES] if config.pl94_tables else [])
    )


def topdown_contents(config: RunConfig, variances: bool) -> ReleaseContents:
    """What a TopDown release of ``config`` is made of (``release_contents``)."""
    assert config.input is not None
    spine = [config.spine.path] if config.spine else []
    dwellings = config.dwellings
    return release_contents(
        TOPDOWN,
        config.document.doc,
        input_fingerprint([*config.input.files(), *spine]),
        tables=release_tables(config, variances),
        estimation_keys=ESTIMATION_KEYS,
        output_keys=OUTPUT_KEYS,
        estimation={DWELLINGS_TABLE: input_fingerprint([dwellings.path])} if dwellings else {},
    )


def release_run(config: RunConfig, options: TopDownOptions) -> ReleaseRun:
    """The runner of a TopDown run of ``config`` (options applied)."""
    assert config.input is not None
    contents = topdown_contents(config, options.variances)
    spine = [config.spine.path] if config.spine else []
    dwellings = [config.dwellings.path] if config.dwellings else []
    inputs = [config.input.path, *spine, *dwellings]
    return ReleaseRun.of(TOPDOWN, config.run, contents, options, inputs)


def _driver_fault(after_level: str) -> None:
    """Test hook: ``CENSUSDP_TEST_FAULT=driver_after_level:<level>`` kills the driver abruptly."""
    if os.environ.get("CENSUSDP_TEST_FAULT") == f"driver_after_level:{after_level}":
        os._exit(17)


def invariant_levels(config: RunConfig) -> list[str]:
    """Levels whose node totals are held exact: each configured level and every level above."""
    if not config.invariant_levels:
        return []
    deepest = max(config.hierarchy.index(lv) for lv in config.invariant_levels)
    return list(config.hierarchy.names[: deepest + 1])


def check_occupancy(released: DataFrame, occupancy: DataFrame, config: RunConfig) -> dict[str, int]:
    """``persons_outside_occupancy``: released counts where ``[[estimation.occupancy]]``
    allows none, and ``group_sums_outside_bounds``: released node and group sums outside their
    ``at_least`` and ``at_most`` (each 0, or ``GuaranteeViolation``)."""
    groups = group_cells(config.occupancy, config.schema.n_cells)
    outside = cells_outside_occupancy(released, occupancy, groups)
    if outside:
        raise GuaranteeViolation(
            f"released estimates break guarantees: {outside} counts outside the occupancy"
        )
    broken = bounds_broken(released, occupancy, groups)
    if broken:
        raise GuaranteeViolation(
            f"released estimates break guarantees: {broken} group sums outside their bounds"
        )
    return {"persons_outside_occupancy": outside, "group_sums_outside_bounds": broken}


def run_topdown(spark: SparkSession, config: RunConfig, options: TopDownOptions) -> RunSummary:
    config = _apply_options(config, options)
    with release_run(config, options) as run, reporting_progress(spark):
        return _run_topdown(spark, config, options, run)


def _run_topdown(
    spark: SparkSession, config: RunConfig, options: TopDownOptions, run: ReleaseRun
) -> RunSummary:
    assert config.input is not None
    output = config.run.output
    hierarchy = config.hierarchy
    clock = run.clock
    blocks = read_blocks(
        spark,
        config.input,
        config.schema,
        hierarchy.leaf.digits,
        config.spine,
        config.occupancy,
        config.dwellings,
    ).persist(StorageLevel.MEMORY_AND_DISK)
    nodes = node_histograms(blocks, hierarchy).persist(StorageLevel.MEMORY_AND_DISK)
    shapes = level_shapes(nodes, hierarchy)  # the public geography's: no count is read
    node_counts = {s.name: s.nodes for s in shapes}
    plan, bypass = None, None
    if config.bypass_single_child:  # from the geocodes alone: public, fixed before any noise
        plan = measurement_plan(nodes, hierarchy)
        bypass = plan_summary(plan, config.budget, hierarchy)
    disk = check_disk(config, node_counts, output)  # before any secret, noise or write
    memory = check_memory(config, shapes, local_mode(spark))
    log.info("disk estimate: %s", disk.text())
    log.info("memory estimate: %s", memory.text() if memory else "not made (not local mode)")
    clock.lap("read_and_validate")

    secret = run.secret()  # only once the input has passed validation
    run.prepare_output()
    if options.resume:
        remove_uncommitted_files(spark, output)
        redo_unfinished_steps(spark, config, run)
        clock.lap("resume_checks")
    if not run.done("measure"):
        shutil.rmtree(output / delta.NOISY_MEASUREMENTS, ignore_errors=True)  # never committed
        delta.write_table(
            measure(nodes, config, secret, plan),
            output,
            delta.NOISY_MEASUREMENTS,
            partition_by="level",
        )
        run.commit("measure")
        clock.lap("measure")

    inv_levels = invariant_levels(config)
    invariants = (
        node_totals(nodes)
        .filter(F.col("level").isin(inv_levels))
        .withColumnRenamed("total", "inv_total")
    ).persist(StorageLevel.MEMORY_AND_DISK)
    occupancy = (
        node_occupancy(blocks, hierarchy, config.occupancy).persist() if config.occupancy else None
    )
    noisy = delta.read_table(spark, output, delta.NOISY_MEASUREMENTS)
    fault_marker = os.environ.get("CENSUSDP_TEST_FAULT", "")
    full_information = config.estimation_method == "full_information"
    if full_information:

        def committed(level: str) -> None:
            run.commit(f"bottom_up_{level}")
            clock.lap(f"bottom_up_{level}", f"{node_counts.get(level, 0)} nodes")
            _driver_fault(f"bottom_up_{level}")

        done = [lv for lv in hierarchy.names if run.done(f"bottom_up_{lv}")]
        write_bottom_up(spark, config, noisy, invariants, occupancy, output, done, committed)
    parent_estimates = None
    for i, level in enumerate(hierarchy.levels):
        if not run.done(level.name):
            parent_digits = hierarchy.levels[i - 1].digits if i else 0
            constraints = node_constraints(invariants, occupancy, level.name)
            leaf = i == len(hierarchy.levels) - 1
            if full_information and not (leaf and leaves_fit_their_answers(config)):
                estimates = estimate_level_from_bottom_up(
                    level_plan(config, level.name),
                    leaf,
                    delta.read_table(spark, output, BOTTOM_UP).filter(F.col("level") == level.name),
                    constraints,
                    parent_estimates,
                    parent_digits,
                    fault_marker,
                    config_layout(config),
                )
            else:
                estimates = estimate_level(
                    level_plan(config, level.name),
                    level_measurements(noisy, hierarchy, level.name, config.bypass_single_child),
                    constraints,
                    parent_estimates,
                    parent_digits,
                    fault_marker,
                )
            delta.write_level(delta.long_cells(estimates), output, delta.ESTIMATES, level.name)
            run.commit(level.name)
            clock.lap(f"estimate_{level.name}", f"{node_counts.get(level.name, 0)} nodes")
            _driver_fault(level.name)
        parent_estimates = delta.sparse_nodes(
            delta.read_table(spark, output, delta.ESTIMATES).filter(F.col("level") == level.name)
        ).select("geocode", "cells", "counts")

    released = delta.read_table(spark, output, delta.ESTIMATES)
    checks = check_estimates(released, hierarchy, invariants, inv_levels)
    if occupancy is not None:
        checks.update(check_occupancy(released, occupancy, config))
    paths = [cut for cut, _, _ in bypass.paths] if bypass else None
    checks.update(check_measurements(noisy, config.budget, paths))
    clock.lap("check_guarantees")
    shutil.rmtree(
        output / delta.MICRODATA, ignore_errors=True
    )  # only an uncommitted leftover can be here
    delta.write_table(
        microdata(released.filter(F.col("level") == hierarchy.leaf.name), config.schema),
        output,
        delta.MICRODATA,
    )
    clock.lap("microdata")
    if options.variances:
        shutil.rmtree(output / TOTAL_VARIANCES, ignore_errors=True)  # an uncommitted leftover
        bottom_up = delta.read_table(spark, output, BOTTOM_UP)
        delta.write_table(total_variances(bottom_up, config, occupancy), output, TOTAL_VARIANCES)
        clock.lap("total_variances")
    csv_files: list[str] = []
    if config.pl94_tables is not None:  # post-processing of the released estimates only
        geography = nodes.select("level", "geocode")  # the node list: from the spine alone
        csv_files = write_census_tables(spark, released, geography, config)
        clock.lap("pl94_tables")

    evaluation_rows: list[dict[str, Any]] = []
    eval_dir: Path | None = None
    if options.evaluate:
        truth = delta.long_cells(nodes)
        table = evaluation_table(
            truth, released, blocks, node_counts, config, secret, config.estimation_method
        )
        eval_dir = run.evaluation_folder()
        evaluation = spark.createDataFrame(table, EVALUATION_SCHEMA).coalesce(1)
        delta.write_table(evaluation, eval_dir, delta.EVALUATION_TABLE)
        table.to_csv(eval_dir / delta.EVALUATION_CSV, index=False)
        plot_errors(
            table,
            hierarchy.names,
            str(eval_dir / "error_by_level.png"),
            f"{config.run.name}: rho = {float(config.budget.total_rho):.3g}",
        )
        evaluation_rows = table.to_dict("records")
        clock.lap("evaluate")

    privacy = privacy_summary(config)
    summary = RunSummary(
        output=output,
        levels=list(hierarchy.names),
        nodes={lv: int(node_counts.get(lv, 0)) for lv in hierarchy.names},
        rho=privacy["rho"],
        epsilon=privacy["epsilon_tight"],
        delta=config.run.delta,
        elapsed_s=clock.elapsed(),
        timings=clock.timings,
        evaluation=evaluation_rows,
        for_release=run.for_release,
        evaluation_dir=eval_dir,
        method=config.estimation_method,
        method_fallback=config.method_fallback,
        bypass=bypass.text() if bypass else "",
        tables=run.contents.tables,
        privacy_unit=privacy_unit(config),
    )
    run.write_manifest(
        {
            "run": config.run.name,
            "config_file": config.source,
            "config_text": config.document.text,
            "input": str(config.input.path),
            "spine": str(config.spine.path) if config.spine else None,
            "privacy": privacy,
            "budget": budget_rows(config),
            "estimation": {
                "method": config.estimation_method,
                "fallback_reason": config.method_fallback or None,
            },
            "bypass": bypass.manifest() if bypass else {"bypass_single_child": False},
            "nodes": summary.nodes,
            "guarantee_checks": checks,
            **(
                {"pl94_tables": {"tables": list(config.pl94_tables.tables), "csv": csv_files}}
                if config.pl94_tables
                else {}
            ),
        },
    )
    blocks.unpersist()
    nodes.unpersist()
    invariants.unpersist()
    if occupancy is not None:
        occupancy.unpersist()
    if plan is not None:
        plan.unpersist()
    return summary
