"""The group-size release job (PGSR), shared by ``censusdp group-sizes`` and ``spark-submit jobs/pgsr.py``.

For every node of the hierarchy and every size s = 1..N: the number of groups (households) of
size s, ε-DP, consistent, valid and faithful. The job runs the stages; each concern has its
module: the noise pass and its privacy claim (``group_sizes.measure``), the post-processings
(``group_sizes.exact``: the dynamic program ``exact``, recorded as ``dp``, with its
certificate loop; ``group_sizes.baselines``: ``relaxed``, ``relaxed_families``,
``cumulative``; what each solves: ``group_sizes.solvers.cost_tables``), the guarantee checks
(``group_sizes.checks``) and the evaluation (``group_sizes.evaluate``).

Every mechanism is refused in one line, before any noise is drawn, if its largest Spark Python
call would need more than ``CENSUSDP_WORKER_MEMORY`` (``group_sizes.memory``: an estimate from
N and the public geography's shape, ``group_sizes.shapes``, never from a count).

Stages (each a Spark job): read and validate the input (nothing written if it fails) -> node
histograms (confidential, memory only) -> the geography's shape and the memory check (nothing
written if it fails) -> the noise pass, written once to
``noisy_measurements`` -> post-processing reading only that table, level by level (each level
computed and checkpointed in executor storage before the next reads it) -> ``group_sizes``
written in one transaction -> guarantees checked (a violation fails exact and cumulative
loudly) -> with ``--evaluate``, errors against the truth in ``<output>.evaluation/``, beside
the release and never inside it (internal) -> the manifest, last.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from censusdp_spark.engine.families import level_shapes
from censusdp_spark.engine.hierarchy import node_histograms
from censusdp_spark.engine.progress import reporting_progress
from censusdp_spark.engine.session import default_parallelism
from censusdp_spark.group_sizes.baselines import (
    post_process_cumulative,
    post_process_relaxed,
    post_process_relaxed_families,
)
from censusdp_spark.group_sizes.checks import release_violations
from censusdp_spark.group_sizes.config import (
    GroupSizesConfig,
    Mechanism,
    privacy_unit,
    with_epsilon,
)
from censusdp_spark.group_sizes.evaluate import write_evaluation
from censusdp_spark.group_sizes.exact import post_process_exact
from censusdp_spark.group_sizes.measure import measure, noise_plan
from censusdp_spark.group_sizes.memory import check_memory
from censusdp_spark.group_sizes.readers import read_leaf_histograms
from censusdp_spark.group_sizes.rows import root_row, union
from censusdp_spark.group_sizes.shapes import arrow_batch_rows
from censusdp_spark.io import delta
from censusdp_spark.model.config import input_for_run
from censusdp_spark.model.errors import GuaranteeViolation
from censusdp_spark.release.runner import (
    ReleaseChoices,
    ReleaseRun,
    input_fingerprint,
    release_contents,
    with_command_line,
)
from censusdp_spark.release.summary import ReleaseSummary

GROUP_SIZES = "group_sizes"
RELAXED = (Mechanism.RELAXED, Mechanism.RELAXED_FAMILIES)
"""The rounded relaxations: their violations are reported, not raised."""


@dataclass(frozen=True, kw_only=True)
class PgsrOptions(ReleaseChoices):
    mechanism: Mechanism | None = None  # None: the config's default
    input: Path | None = None
    epsilon: Fraction | None = None  # None: the config's; else each level keeps its share


@dataclass(kw_only=True)
class GroupSizesSummary(ReleaseSummary):
    mechanism: str
    epsilon: str
    nodes: dict[str, int]
    checks: dict[str, int]
    optimality: dict[str, int] = field(default_factory=dict)
    relaxed: dict[str, Any] = field(default_factory=dict)  # the whole-tree QP's check

    def text(self) -> str:
        guarantees = "  guarantees: " + ", ".join(f"{k} = {v}" for k, v in self.checks.items())
        lines = [
            self.written_line(f"group-size release ({self.mechanism})"),
            "  levels: " + ", ".join(f"{lv} ({n} nodes)" for lv, n in self.nodes.items()),
            f"  privacy: epsilon = {self.epsilon} (pure DP)",
            *self.unit_lines(),
            guarantees,
            self.elapsed_line(),
            f"  tables: {delta.table_path(self.output, delta.NOISY_MEASUREMENTS)}, {delta.table_path(self.output, GROUP_SIZES)}",
            f"  manifest: {self.output / 'manifest.json'}",
        ]
        after_guarantees = lines.index(guarantees) + 1
        if self.optimality:
            lines.insert(
                after_guarantees,
                "  optimality: " + ", ".join(f"{k} = {v}" for k, v in self.optimality.items()),
            )
        if self.relaxed:
            r = self.relaxed
            verdict = "reliable" if r["reliable"] else "UNRELIABLE (not an optimum)"
            lines.insert(
                after_guarantees,
                f"  relaxed QP: {verdict}; objective {r['objective']:.6g}, lower bound "
                f"{r['lower_bound']:.6g}, relative gap {r['relative_gap']:.1e}, equality "
                f"residual {r['equality_residual']:.1e} (Clarabel {r['solver_status']})",
            )
        if self.evaluation_dir is not None:
            lines += self.evaluation_dir_lines()
            lines += [
                f"    {r['level']:<14} L1 {r['l1_mean']:.2f}, EMD {r['emd_mean']:.2f} per node"
                for r in self.evaluation
            ]
        return "\n".join(lines)


def _apply_options(config: GroupSizesConfig, options: PgsrOptions) -> GroupSizesConfig:
    run = with_command_line(config.run, options.output, options.secret_file)
    spec, spine = input_for_run(
        config.source,
        config.input,
        config.spine,
        options.input,
        "the group-size release needs an input table",
    )
    if options.epsilon is not None:
        config = with_epsilon(config, options.epsilon)
    mechanism = options.mechanism or config.mechanism
    return replace(config, run=run, input=spec, spine=spine, mechanism=mechanism)


def _privacy(config: GroupSizesConfig) -> dict[str, Any]:
    sensitivity = 1 if config.mechanism == Mechanism.CUMULATIVE else 2
    return {
        "definition": "pure epsilon-DP; neighbours: one individual joins or leaves an existing group "
        "(the geography is public and the number of groups does not change between neighbours)",
        "unit": privacy_unit(config).manifest(),
        "public_invariants": "G and every node's G^r"
        if config.faithfulness == "node"
        else "G (the root's number of groups) only",
        "epsilon": str(config.budget.total_epsilon),
        "measurement": "cumulative" if config.mechanism == Mechanism.CUMULATIVE else "histogram",
        "sensitivity_per_node": sensitivity,
        "levels": [
            {
                "level": lv,
                "epsilon": str(config.budget.level_epsilon[lv]),
                "geometric_scale": str(config.budget.scale(lv, sensitivity)),
            }
            for lv in config.hierarchy.names
        ],
    }


ESTIMATION_KEYS = (("mechanism",),)
"""The config table that chooses the post-processing only (the noise kind is a setting)."""


def release_run(config: GroupSizesConfig, options: PgsrOptions) -> ReleaseRun:
    """The runner of a group-size run of ``config`` (options applied)."""
    assert config.input is not None
    noise = "cumulative" if config.mechanism == Mechanism.CUMULATIVE else "histogram"
    inputs = [config.input.path, *([config.spine.path] if config.spine else [])]
    contents = release_contents(
        GROUP_SIZES,
        config.document.doc,
        input_fingerprint(inputs),
        tables=[delta.NOISY_MEASUREMENTS, GROUP_SIZES],
        estimation_keys=ESTIMATION_KEYS,
        settings={"noise": noise, "epsilon": str(config.budget.total_epsilon)},
        estimation={"--mechanism": config.mechanism.value},
    )
    streams = f"{GROUP_SIZES}/{noise}"
    return ReleaseRun.of(GROUP_SIZES, config.run, contents, options, inputs, streams)


def run_pgsr(
    spark: SparkSession, config: GroupSizesConfig, options: PgsrOptions
) -> GroupSizesSummary:
    config = _apply_options(config, options)
    with release_run(config, options) as run, reporting_progress(spark):
        return _run_pgsr(spark, config, options, run)


def _run_pgsr(
    spark: SparkSession, config: GroupSizesConfig, options: PgsrOptions, run: ReleaseRun
) -> GroupSizesSummary:
    assert config.input is not None
    clock = run.clock
    output, hierarchy = config.run.output, config.hierarchy
    leaves = read_leaf_histograms(
        spark, config.input, config.groups, hierarchy.leaf.digits, config.spine
    )
    leaves = leaves.persist(StorageLevel.MEMORY_AND_DISK)
    # Few, larger partitions: every pandas task has a fixed start-up cost.
    parallelism = default_parallelism(spark)
    nodes = (
        node_histograms(leaves, hierarchy)
        .coalesce(parallelism)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    shapes = level_shapes(nodes, hierarchy)  # the public geography's: no count is read
    node_counts = {s.name: s.nodes for s in shapes}
    clock.lap("read_and_validate")
    check_memory(config, shapes, arrow_batch_rows(spark))  # before any noise is drawn

    secret = run.secret()  # only once the input has passed validation
    run.prepare_output()
    plan = noise_plan(config, config.mechanism)
    delta.write_table(
        measure(nodes, plan, secret, hierarchy),
        output,
        delta.NOISY_MEASUREMENTS,
        partition_by="level",
    )
    run.commit("measure")
    clock.lap("measure")

    noisy = delta.read_table(spark, output, delta.NOISY_MEASUREMENTS).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    optimality: dict[str, int] = {}
    relaxed: dict[str, Any] = {}
    levels: list[DataFrame]
    if config.mechanism == Mechanism.EXACT:
        levels, optimality = post_process_exact(spark, config, noisy, clock)
    elif config.mechanism == Mechanism.RELAXED:
        levels, relaxed = post_process_relaxed(spark, config, noisy, clock)
    elif config.mechanism == Mechanism.RELAXED_FAMILIES:
        levels = post_process_relaxed_families(spark, config, noisy, clock)
    else:
        levels = post_process_cumulative(spark, config, noisy, clock)
    delta.write_table(
        union(levels).select("geocode", "level", "size", "count"),
        output,
        GROUP_SIZES,
        partition_by="level",
    )
    clock.lap("write_release")

    released = delta.read_table(spark, output, GROUP_SIZES)
    _, total, _ = root_row(noisy, hierarchy)
    checks = release_violations(released, noisy, hierarchy, config.faithfulness, total)
    clock.lap("check_guarantees")
    if config.mechanism not in RELAXED and any(checks.values()):
        raise GuaranteeViolation(f"the {config.mechanism} release breaks guarantees: {checks}")

    evaluation_rows: list[dict[str, Any]] = []
    eval_dir: Path | None = None
    if options.evaluate:
        eval_dir = run.evaluation_folder()
        title = f"{config.run.name}: {config.mechanism}, epsilon = {config.budget.total_epsilon}"
        evaluation_rows = write_evaluation(spark, nodes, released, eval_dir, hierarchy, title)
        clock.lap("evaluate")

    summary = GroupSizesSummary(
        output=output,
        mechanism=config.mechanism.value,
        epsilon=str(config.budget.total_epsilon),
        nodes={lv: node_counts.get(lv, 0) for lv in hierarchy.names},
        checks=checks,
        elapsed_s=clock.elapsed(),
        timings=clock.timings,
        optimality=optimality,
        relaxed=relaxed,
        evaluation=evaluation_rows,
        for_release=run.for_release,
        evaluation_dir=eval_dir,
        privacy_unit=privacy_unit(config),
    )
    run.write_manifest(
        {
            "run": config.run.name,
            "release": "group sizes (PGSR)",
            "mechanism": config.mechanism.value,
            "norm": config.norm if config.mechanism not in RELAXED else "l2",
            "faithfulness": config.faithfulness,
            "config_file": config.source,
            "config_text": config.document.text,
            "input": str(config.input.path),
            "spine": str(config.spine.path) if config.spine else None,
            "groups": {"max_size": config.groups.max_size, "topcode": config.groups.topcode},
            "privacy": _privacy(config),
            "nodes": summary.nodes,
            "guarantee_checks": checks,
            "optimality": optimality,
            **({"relaxed": relaxed} if relaxed else {}),
        },
        {"clarabel": version("clarabel")} if config.mechanism in RELAXED else {},
    )
    leaves.unpersist()
    nodes.unpersist()
    noisy.unpersist()
    return summary
