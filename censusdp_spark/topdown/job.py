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

import shutil
from collections.abc import Sequence
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
from censusdp_spark.model.geography import EVERY_LEVEL, LevelSpan
from censusdp_spark.release.runner import (
    ReleaseContents,
    ReleaseRun,
    input_fingerprint,
    log,
    release_contents,
    with_command_line,
)
from censusdp_spark.release.summary import ReleaseSummary
from censusdp_spark.topdown.assembly import (
    STATE_RUNS,
    StateRuns,
    held_states,
    read_state_runs,
    with_state_runs,
)
from censusdp_spark.topdown.bottom_up import (
    BOTTOM_UP,
    TOTAL_VARIANCES,
    config_layout,
    leaves_fit_their_answers,
    total_variances,
    write_bottom_up,
)
from censusdp_spark.topdown.bypass import BypassSummary, measurement_plan, plan_summary
from censusdp_spark.topdown.capacity import check_disk, check_memory
from censusdp_spark.topdown.census_tables import PL94_TABLES, write_census_tables
from censusdp_spark.topdown.checks import check_estimates, check_measurements
from censusdp_spark.topdown.config import (
    EstimationMethod,
    TopDownConfig,
    invariant_levels,
    privacy_unit,
)
from censusdp_spark.topdown.estimate import estimate_level, level_measurements, level_plan
from censusdp_spark.topdown.evaluate import EVALUATION_SCHEMA, evaluation_table, plot_errors
from censusdp_spark.topdown.full_information import estimate_level_from_bottom_up
from censusdp_spark.topdown.given import (
    GivenMeasurements,
    NoisyFormat,
    given_budget,
    given_states,
    read_given,
)
from censusdp_spark.topdown.manifest import budget_rows, privacy_summary
from censusdp_spark.topdown.measure import measure
from censusdp_spark.topdown.microdata import microdata
from censusdp_spark.topdown.nmf_layout import STATE_LEVEL, root_folders, state_folders
from censusdp_spark.topdown.observer import QUIET, RunObserver
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


@dataclass(frozen=True, kw_only=True)
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
    noisy_measurements: Path | None = None  # post-process these instead of measuring
    noisy_format: NoisyFormat = NoisyFormat.CENSUS_NMF
    states: tuple[str, ...] = ()  # with noisy_measurements: only these states' subtrees
    # with noisy_measurements: the nation and the states, from these state runs' state rows
    assemble_nation: tuple[Path, ...] = ()
    state_estimates: Path | None = None  # with states: each held to this assembled nation's


@dataclass(kw_only=True)
class TopDownSummary(ReleaseSummary):
    levels: list[str]
    nodes: dict[str, int]
    rho: str
    epsilon: float
    delta: float
    method: EstimationMethod = "topdown"
    method_fallback: str = ""
    bypass: str = ""  # the bypassed single-child parents per level, with bypassing
    tables: list[str] = field(default_factory=list)  # the Delta tables written
    post_processed: str = ""  # the noisy measurements estimated, when given rather than drawn
    budget_disagreements: tuple[str, ...] = ()  # the config's [budget] against the file's

    def text(self) -> str:
        lines = [
            self.written_line("TopDown release"),
            "  levels: " + ", ".join(f"{lv} ({self.nodes[lv]} nodes)" for lv in self.levels),
            f"  estimation: {self.method}"
            + (f" (fallback: {self.method_fallback})" if self.method_fallback else ""),
            *([self.bypass] if self.bypass else []),
            *self._privacy_lines(),
            self.elapsed_line(),
            f"  tables: {', '.join(delta.table_path(self.output, t) for t in self.tables)}",
            f"  manifest: {self.output / 'manifest.json'}",
        ]
        if self.evaluation_dir is not None:
            lines += self.evaluation_dir_lines()
            lines += _headline(self.evaluation, self.levels)
        return "\n".join(lines)

    def _privacy_lines(self) -> list[str]:
        spent = (
            f"rho = {self.rho} (~{float(Fraction(self.rho)):.4f}) zCDP,"
            f" epsilon = {self.epsilon:.2f} at delta = {self.delta:g}"
        )
        if not self.post_processed:
            return [
                f"  privacy: {spent}",
                *self.unit_lines(),
            ]
        return [
            f"  privacy: no budget spent: post-processing of {self.post_processed}",
            f"    the file's variances spent {spent} when it was measured",
            *(f"    config [budget] not used: {line}" for line in self.budget_disagreements),
        ]


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


def _apply_options(config: TopDownConfig, options: TopDownOptions) -> TopDownConfig:
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


def release_tables(config: TopDownConfig, variances: bool, leaves: bool = True) -> list[str]:
    """The Delta tables of a TopDown release of ``config``, as its manifest lists them
    (``leaves``: whether it releases the leaf level, whose estimates ``microdata`` holds)."""
    return (
        [delta.NOISY_MEASUREMENTS, delta.ESTIMATES]
        + ([delta.MICRODATA] if leaves else [])
        + ([BOTTOM_UP] if config.estimation_method == "full_information" else [])
        + ([TOTAL_VARIANCES] if variances else [])
        + ([PL94_TABLES] if config.pl94_tables else [])
    )


def topdown_contents(config: TopDownConfig, variances: bool) -> ReleaseContents:
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


def release_run(config: TopDownConfig, options: TopDownOptions) -> ReleaseRun:
    """The runner of a TopDown run of ``config`` (options applied)."""
    assert config.input is not None
    contents = topdown_contents(config, options.variances)
    spine = [config.spine.path] if config.spine else []
    dwellings = [config.dwellings.path] if config.dwellings else []
    inputs = [config.input.path, *spine, *dwellings]
    return ReleaseRun.of(TOPDOWN, config.run, contents, options, inputs)


def check_occupancy(
    released: DataFrame, occupancy: DataFrame, config: TopDownConfig
) -> dict[str, int]:
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


def run_topdown(
    spark: SparkSession,
    config: TopDownConfig,
    options: TopDownOptions,
    observer: RunObserver = QUIET,
) -> TopDownSummary:
    """Run the TopDown release of ``config`` with ``options``; ``observer`` is told of each
    committed step and each estimation task (tests pass one in to inject faults)."""
    _refuse_mixed_options(options)
    if options.noisy_measurements is not None:
        return _post_process(spark, config, options, options.noisy_measurements, observer)
    config = _apply_options(config, options)
    with release_run(config, options) as run, reporting_progress(spark):
        return _run_topdown(spark, config, options, run, observer)


@dataclass(frozen=True)
class ReadInput:
    """The validated input: the blocks and every node's histogram (confidential, in memory
    only) and, from the geocodes alone, the node counts and the bypass plan."""

    blocks: DataFrame
    nodes: DataFrame
    node_counts: dict[str, int]
    plan: DataFrame | None
    bypass: BypassSummary | None

    def unpersist(self) -> None:
        for frame in (self.blocks, self.nodes, self.plan):
            if frame is not None:
                frame.unpersist()


@dataclass(frozen=True)
class HeldExact:
    """What the estimation holds besides the noisy measurements: the invariant node totals
    (``level, geocode, inv_total``) and, with ``[[estimation.occupancy]]``, each node's
    occupancy bits and bounds."""

    invariants: DataFrame
    occupancy: DataFrame | None

    def unpersist(self) -> None:
        self.invariants.unpersist()
        if self.occupancy is not None:
            self.occupancy.unpersist()


def _run_topdown(
    spark: SparkSession,
    config: TopDownConfig,
    options: TopDownOptions,
    run: ReleaseRun,
    observer: RunObserver,
) -> TopDownSummary:
    data = _read_and_validate(spark, config)
    run.clock.lap("read_and_validate")
    secret = run.secret()  # only once the input has passed validation
    _start_writing(spark, config, options, run)
    if not run.done("measure"):
        _write_measurements(measure(data.nodes, config, secret, data.plan), config.run.output)
        run.commit("measure")
        run.clock.lap("measure")
    held = _held_exact(data, config)
    noisy = delta.read_table(spark, config.run.output, delta.NOISY_MEASUREMENTS)
    _estimate_levels(spark, config, run, noisy, held, data.node_counts, observer)
    released = delta.read_table(spark, config.run.output, delta.ESTIMATES)
    checks = _check_guarantees(config, released, noisy, held, data.bypass)
    run.clock.lap("check_guarantees")
    csv_files = _write_products(spark, config, options, released, held, data.nodes, run)
    evaluation_rows, eval_dir = (
        _evaluate(spark, config, run, released, data, secret) if options.evaluate else ([], None)
    )
    summary = replace(
        _summary(config, run, data.node_counts),
        evaluation=evaluation_rows,
        evaluation_dir=eval_dir,
        bypass=data.bypass.text() if data.bypass else "",
    )
    read = {
        "input": str(config.input.path) if config.input else None,
        "spine": str(config.spine.path) if config.spine else None,
    }
    bypass = data.bypass.manifest() if data.bypass else {"bypass_single_child": False}
    run.write_manifest(_manifest(config, summary, checks, csv_files, read, bypass))
    data.unpersist()
    held.unpersist()
    return summary


def _read_and_validate(spark: SparkSession, config: TopDownConfig) -> ReadInput:
    """Read and validate the input, then check the disk and memory the run needs: all before
    any secret, noise or write."""
    assert config.input is not None
    hierarchy = config.hierarchy
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
    disk = check_disk(config, node_counts, config.run.output)
    memory = check_memory(config, shapes, local_mode(spark))
    log.info("disk estimate: %s", disk.text())
    log.info("memory estimate: %s", memory.text() if memory else "not made (not local mode)")
    return ReadInput(blocks, nodes, node_counts, plan, bypass)


def _start_writing(
    spark: SparkSession,
    config: TopDownConfig,
    options: TopDownOptions,
    run: ReleaseRun,
    span: LevelSpan = EVERY_LEVEL,
) -> None:
    """Empty the output for a fresh run; resuming, drop the uncommitted files and redo the
    steps whose tables (of the levels of ``span``) are missing or incomplete."""
    run.prepare_output()
    if options.resume:
        remove_uncommitted_files(spark, config.run.output)
        redo_unfinished_steps(spark, config, run, span)
        run.clock.lap("resume_checks")


def _write_measurements(noisy: DataFrame, output: Path) -> None:
    """``noisy`` written once as the ``noisy_measurements`` table, by level."""
    shutil.rmtree(output / delta.NOISY_MEASUREMENTS, ignore_errors=True)  # never committed
    delta.write_table(noisy, output, delta.NOISY_MEASUREMENTS, partition_by="level")


def _held_exact(data: ReadInput, config: TopDownConfig) -> HeldExact:
    invariants = (
        node_totals(data.nodes)
        .filter(F.col("level").isin(invariant_levels(config)))
        .withColumnRenamed("total", "inv_total")
    ).persist(StorageLevel.MEMORY_AND_DISK)
    occupancy = (
        node_occupancy(data.blocks, config.hierarchy, config.occupancy).persist()
        if config.occupancy
        else None
    )
    return HeldExact(invariants, occupancy)


def _copy_bottom_up(
    config: TopDownConfig, run: ReleaseRun, rows: DataFrame, levels: Sequence[str]
) -> None:
    """State runs' ``bottom_up`` rows of ``levels``, as this run's, in one write (each level
    committed as its bottom-up step: the pass then computes only the levels above)."""
    if not all(run.done(f"bottom_up_{lv}") for lv in levels):
        delta.write_levels(rows, config.run.output, BOTTOM_UP, levels)
        for level in levels:
            run.commit(f"bottom_up_{level}")
        run.clock.lap("copy_bottom_up", f"{', '.join(levels)} from the state runs")


def _estimate_levels(
    spark: SparkSession,
    config: TopDownConfig,
    run: ReleaseRun,
    noisy: DataFrame,
    held: HeldExact,
    node_counts: dict[str, int],
    observer: RunObserver,
    span: LevelSpan = EVERY_LEVEL,
    roots: DataFrame | None = None,
) -> None:
    """Estimate level after level from ``noisy`` (with ``full_information``, after the
    bottom-up pass), each level committed to ``estimates`` before the next reads it; a step a
    resumed run finds committed is not done again. Only the levels of ``span`` are estimated;
    its top level's nodes are the roots, each estimated as the root of its own tree (each state
    in a state-by-state run, as BlueDown's state passes treat it), or given (``roots``: their
    estimates, long format, as ``--state-estimates`` holds them)."""
    output = config.run.output
    hierarchy = config.hierarchy
    clock = run.clock
    full_information = config.estimation_method == "full_information"
    if full_information:

        def committed(level: str) -> None:
            run.commit(f"bottom_up_{level}")
            clock.lap(f"bottom_up_{level}", f"{node_counts.get(level, 0)} nodes")
            observer.step_committed(f"bottom_up_{level}")

        skipped = set(hierarchy.names) - set(span.names(hierarchy))
        done = [lv for lv in hierarchy.names if lv in skipped or run.done(f"bottom_up_{lv}")]
        write_bottom_up(
            spark, config, noisy, held.invariants, held.occupancy, output, done, committed
        )
    parent_estimates = None
    top = span.top
    for i, level in enumerate(span.of(hierarchy), start=top):
        if not run.done(level.name) and i == top and roots is not None:
            delta.write_level(roots, output, delta.ESTIMATES, level.name)
            run.commit(level.name)
            observer.step_committed(level.name)
        elif not run.done(level.name):
            parent_digits = hierarchy.levels[i - 1].digits if i else 0
            plan = level_plan(config, level.name)
            if i == top:  # each node its own family, solved as a root
                parent_digits = level.digits
                plan = replace(plan, is_root=True)
            constraints = node_constraints(held.invariants, held.occupancy, level.name)
            leaf = i == len(hierarchy.levels) - 1
            if full_information and not (leaf and leaves_fit_their_answers(config)):
                estimates = estimate_level_from_bottom_up(
                    plan,
                    leaf,
                    delta.read_table(spark, output, BOTTOM_UP).filter(F.col("level") == level.name),
                    constraints,
                    parent_estimates,
                    parent_digits,
                    observer,
                    config_layout(config),
                )
            else:
                estimates = estimate_level(
                    plan,
                    level_measurements(noisy, hierarchy, level.name, config.bypass_single_child),
                    constraints,
                    parent_estimates,
                    parent_digits,
                    observer,
                )
            delta.write_level(delta.long_cells(estimates), output, delta.ESTIMATES, level.name)
            run.commit(level.name)
            clock.lap(f"estimate_{level.name}", f"{node_counts.get(level.name, 0)} nodes")
            observer.step_committed(level.name)
        parent_estimates = delta.sparse_nodes(
            delta.read_table(spark, output, delta.ESTIMATES).filter(F.col("level") == level.name)
        ).select("geocode", "cells", "counts")


def _check_guarantees(
    config: TopDownConfig,
    released: DataFrame,
    noisy: DataFrame,
    held: HeldExact,
    bypass: BypassSummary | None,
    span: LevelSpan = EVERY_LEVEL,
) -> dict[str, int]:
    """Every guarantee of the released estimates (of the levels of ``span``) and the noisy
    table, each a count that is 0 (else ``GuaranteeViolation``)."""
    checks = check_estimates(
        released, config.hierarchy, held.invariants, invariant_levels(config), span
    )
    if held.occupancy is not None:
        checks.update(check_occupancy(released, held.occupancy, config))
    paths = [cut for cut, _, _ in bypass.paths] if bypass else None
    checks.update(check_measurements(noisy, config.budget, paths))
    return checks


def _write_products(
    spark: SparkSession,
    config: TopDownConfig,
    options: TopDownOptions,
    released: DataFrame,
    held: HeldExact,
    nodes: DataFrame,
    run: ReleaseRun,
    span: LevelSpan = EVERY_LEVEL,
) -> list[str]:
    """What is computed from the released estimates alone: ``microdata`` (when ``span`` holds
    the leaves), with ``--variances`` ``total_variances``, with ``[output.pl94_tables]`` the
    P.L. 94-171 tables of the levels of ``span`` (their CSV files returned)."""
    output = config.run.output
    if span.has_leaves:
        shutil.rmtree(output / delta.MICRODATA, ignore_errors=True)  # an uncommitted leftover
        leaves = released.filter(F.col("level") == config.hierarchy.leaf.name)
        delta.write_table(microdata(leaves, config.schema), output, delta.MICRODATA)
        run.clock.lap("microdata")
    if options.variances:
        shutil.rmtree(output / TOTAL_VARIANCES, ignore_errors=True)  # an uncommitted leftover
        bottom_up = delta.read_table(spark, output, BOTTOM_UP)
        delta.write_table(
            total_variances(bottom_up, config, held.occupancy), output, TOTAL_VARIANCES
        )
        run.clock.lap("total_variances")
    if config.pl94_tables is None:
        return []
    geography = nodes.select("level", "geocode")  # the node list: from the spine alone
    csv_files = write_census_tables(spark, released, geography, config, span)
    run.clock.lap("pl94_tables")
    return csv_files


def _evaluate(
    spark: SparkSession,
    config: TopDownConfig,
    run: ReleaseRun,
    released: DataFrame,
    data: ReadInput,
    secret: bytes,
) -> tuple[list[dict[str, Any]], Path]:
    """The error against the truth, in the evaluation folder beside the release (internal,
    not for release): its rows and the folder."""
    table = evaluation_table(
        delta.long_cells(data.nodes),
        released,
        data.blocks,
        data.node_counts,
        config,
        secret,
        config.estimation_method,
    )
    eval_dir = run.evaluation_folder()
    evaluation = spark.createDataFrame(table, EVALUATION_SCHEMA).coalesce(1)
    delta.write_table(evaluation, eval_dir, delta.EVALUATION_TABLE)
    table.to_csv(eval_dir / delta.EVALUATION_CSV, index=False)
    plot_errors(
        table,
        config.hierarchy.names,
        str(eval_dir / "error_by_level.png"),
        f"{config.run.name}: rho = {float(config.budget.total_rho):.3g}",
    )
    run.clock.lap("evaluate")
    return table.to_dict("records"), eval_dir


def _summary(
    config: TopDownConfig,
    run: ReleaseRun,
    node_counts: dict[str, int],
    span: LevelSpan = EVERY_LEVEL,
) -> TopDownSummary:
    """The run's summary of the levels released (``span``)."""
    privacy = privacy_summary(config)
    levels = list(span.names(config.hierarchy))
    return TopDownSummary(
        output=config.run.output,
        levels=levels,
        nodes={lv: int(node_counts.get(lv, 0)) for lv in levels},
        rho=privacy["rho"],
        epsilon=privacy["epsilon_tight"],
        delta=config.run.delta,
        elapsed_s=run.clock.elapsed(),
        timings=run.clock.timings,
        for_release=run.for_release,
        method=config.estimation_method,
        method_fallback=config.method_fallback,
        tables=run.contents.tables,
        privacy_unit=privacy_unit(config),
    )


def _manifest(
    config: TopDownConfig,
    summary: TopDownSummary,
    checks: dict[str, int],
    csv_files: list[str],
    read: dict[str, Any],
    bypass: dict[str, Any],
) -> dict[str, Any]:
    """The release's own manifest fields (the runner adds those every release carries);
    ``read``: what the release was made from."""
    return {
        "run": config.run.name,
        "config_file": config.source,
        "config_text": config.document.text,
        **read,
        "privacy": privacy_summary(config),
        "budget": budget_rows(config),
        "estimation": {
            "method": config.estimation_method,
            "fallback_reason": config.method_fallback or None,
        },
        "bypass": bypass,
        "nodes": summary.nodes,
        "guarantee_checks": checks,
        **(
            {"pl94_tables": {"tables": list(config.pl94_tables.tables), "csv": csv_files}}
            if config.pl94_tables
            else {}
        ),
    }


def _post_process(
    spark: SparkSession,
    config: TopDownConfig,
    options: TopDownOptions,
    source: Path,
    observer: RunObserver,
) -> TopDownSummary:
    """The release of the noisy measurements at ``source`` (``topdown.given``): estimation,
    every guarantee check and the products of the estimates, as a release that measures;
    no input, secret, noise or evaluation."""
    if options.evaluate:
        raise ValueError(
            f"{source}: --evaluate compares with the truth, which post-processing does not read"
        )
    config = replace(config, run=with_command_line(config.run, options.output, None))
    contents = release_contents(
        TOPDOWN,
        config.document.doc,
        input_fingerprint(_folders_read(config, options, source)),
        tables=release_tables(config, options.variances, leaves=not options.assemble_nation),
        estimation_keys=ESTIMATION_KEYS,
        output_keys=OUTPUT_KEYS,
    )
    run = ReleaseRun(
        TOPDOWN,
        config.run.output,
        config.run.private_dir,
        None,
        contents,
        inputs=[source],
        overwrite=options.overwrite,
        resume=options.resume,
    )
    with run, reporting_progress(spark):
        return _run_post_processing(spark, config, options, source, run, observer)


def _refuse_mixed_options(options: TopDownOptions) -> None:
    """The state-by-state options that need others, or exclude them, in one line each."""
    given = options.noisy_measurements is not None
    if options.states and not given:
        raise ValueError(
            "--states: a state-by-state run estimates given noisy measurements; add"
            " --noisy-measurements PATH"
        )
    if options.assemble_nation and not given:
        raise ValueError(
            "--assemble-nation: the nation's measurements come from the file; add"
            " --noisy-measurements PATH"
        )
    if options.assemble_nation and options.states:
        raise ValueError(
            "--assemble-nation and --states: the nation is assembled from every state's run;"
            " run the states first (--states), then the nation alone"
        )
    if options.state_estimates is not None and not options.states:
        raise ValueError(
            "--state-estimates: holds the states of a state-by-state run to the assembled"
            " nation's estimates; add --states CODES"
        )


def _state_by_state(config: TopDownConfig, options: TopDownOptions) -> dict[str, Any] | None:
    """The manifest's account of a state-by-state run (None for a whole file's)."""
    if not options.states:
        return None
    root = config.hierarchy.root.name
    given = options.state_estimates
    each = (
        f"held to its estimate in the nation assembled at {given} (--state-estimates)"
        if given
        else "estimated as the root of its own tree (its own measurements and, where held, its"
        " total)"
    )
    return {
        "states": list(options.states),
        "levels_released": list(config.hierarchy.names[STATE_LEVEL:]),
        "each_state": f"{each}; no nation row: the nation needs every state",
        "state_estimates": str(given) if given else None,
        "root_budget": f"the config's [budget] for level {root} (its measurements are not read)",
    }


def _state_runs(config: TopDownConfig, runs: StateRuns | None) -> dict[str, Any] | None:
    """The manifest's account of a nation assembled from state runs (None otherwise)."""
    if runs is None:
        return None
    below = config.hierarchy.names[STATE_LEVEL + 1 :]
    return {
        "runs": [str(p) for p in runs.parts],
        "states": list(runs.states),
        "levels_released": list(config.hierarchy.names[: STATE_LEVEL + 1]),
        "each_state": "its state-level rows (measurements, held total, bottom-up estimate)"
        " from its run; the nation's measurements and total from the file",
        "levels_below": f"{', '.join(below)}: each state's run with --states CODE"
        " --state-estimates <this release>",
        "budget_below": "the config's [budget] for the levels below the states (not read here)",
    }


def _folders_read(config: TopDownConfig, options: TopDownOptions, source: Path) -> list[Path]:
    """What a post-processing run reads (its input fingerprint): the file, or in a
    state-by-state run of an NMF its states' folders alone (and the nation it is held to); in
    a nation's assembly, an NMF's root folders and the state runs."""
    nmf = options.noisy_format is NoisyFormat.CENSUS_NMF
    if options.assemble_nation:
        root = root_folders(source.absolute(), config) if nmf else [source]
        return [*root, *options.assemble_nation]
    held = [options.state_estimates] if options.state_estimates else []
    if options.states and nmf:
        return [*state_folders(source.absolute(), config, options.states), *held]
    return [source, *held]


def _released_levels(options: TopDownOptions) -> LevelSpan:
    """The levels a post-processing run releases: from the states down in a state-by-state
    run, the nation and the states in a nation's assembly, else every level."""
    if options.states:
        return LevelSpan(top=STATE_LEVEL)
    if options.assemble_nation:
        return LevelSpan(bottom=STATE_LEVEL + 1)
    return EVERY_LEVEL


def _read_given(
    spark: SparkSession, config: TopDownConfig, options: TopDownOptions, source: Path
) -> tuple[GivenMeasurements, StateRuns | None]:
    """What a post-processing run estimates from; in a nation's assembly, the file's root and
    the state runs' state rows (those returned too)."""
    fmt = options.noisy_format
    if not options.assemble_nation:
        return read_given(spark, source, fmt, config, options.states), None
    known = given_states(spark, source, fmt, config)
    runs = read_state_runs(spark, options.assemble_nation, config, known)
    root = read_given(spark, source, fmt, config, root_only=True)
    return with_state_runs(root, runs), runs


def _run_post_processing(
    spark: SparkSession,
    config: TopDownConfig,
    options: TopDownOptions,
    source: Path,
    run: ReleaseRun,
    observer: RunObserver,
) -> TopDownSummary:
    span = _released_levels(options)
    given, runs = _read_given(spark, config, options, source)
    budget = given_budget(given.noisy, config, source, span)
    for line in budget.disagreements:
        log.info("config [budget] not used: %s", line)
    config = budget.config
    geography = given.geography.persist(StorageLevel.MEMORY_AND_DISK)
    node_counts = {
        r["level"]: int(r["count"]) for r in geography.groupBy("level").count().collect()
    }
    run.clock.lap("read_and_validate")
    _start_writing(spark, config, options, run, span)
    if not run.done("measure"):
        _write_measurements(budget.with_exact_variances(given.noisy), config.run.output)
        run.commit("measure")
        run.clock.lap("copy_measurements")
    held = HeldExact(given.invariants.persist(StorageLevel.MEMORY_AND_DISK), None)
    noisy = delta.read_table(spark, config.run.output, delta.NOISY_MEASUREMENTS)
    names = config.hierarchy.names
    if runs is not None and runs.bottom_up is not None:
        _copy_bottom_up(config, run, runs.bottom_up, [names[STATE_LEVEL]])
    states = (
        held_states(spark, options.state_estimates, config, options.states)
        if options.state_estimates
        else None
    )
    if states is not None and states.bottom_up is not None:
        _copy_bottom_up(config, run, states.bottom_up, names[STATE_LEVEL:])
    roots = states.estimates if states is not None else None
    _estimate_levels(spark, config, run, noisy, held, node_counts, observer, span, roots)
    released = delta.read_table(spark, config.run.output, delta.ESTIMATES)
    checks = _check_guarantees(config, released, noisy, held, None, span)
    run.clock.lap("check_guarantees")
    csv_files = _write_products(spark, config, options, released, held, geography, run, span)
    described = f"{source} ({options.noisy_format})"
    if options.states:
        described += f", state by state: {', '.join(options.states)}"
    if runs is not None:
        described += f", the nation assembled from {len(runs.parts)} state runs"
    summary = replace(
        _summary(config, run, node_counts, span),
        post_processed=described,
        budget_disagreements=budget.disagreements,
    )
    read = {
        "input": None,
        "spine": None,
        "post_processing": {
            "noisy_measurements": str(source),
            "format": str(options.noisy_format),
            "rho_spent_by_this_release": "0",
            "config_budget_not_used": list(budget.disagreements),
            "state_by_state": _state_by_state(config, options),
            STATE_RUNS: _state_runs(config, runs),
        },
    }
    bypass = {"bypass_single_child": False}
    run.write_manifest(_manifest(config, summary, checks, csv_files, read, bypass))
    geography.unpersist()
    held.unpersist()
    return summary
