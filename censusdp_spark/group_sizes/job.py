"""The group-size release job (PGSR), shared by ``censusdp group-sizes`` and ``spark-submit jobs/pgsr.py``.

For every node of the hierarchy and every size s = 1..N: the number of groups (households) of
size s, ε-DP, consistent, valid and faithful (see ``censusdp_spark.group_sizes.spark`` for the
privacy claim and ``censusdp_spark.group_sizes.solvers.cost_tables`` for what each post-processing solves).

Mechanisms:
* ``dp`` (M_H^dp): histogram noise, cost tables bottom-up, the root by the dummy root of T^dp,
  then each family given its parent. Under ``faithfulness = "level"`` (the paper's; default)
  the release is the exact integer optimum and the run fails if its objective differs from
  the root tables' optimum; under ``"node"`` the manifest carries the certificate
  ``lower_bound <= opt <= objective``.
* ``relaxed`` (M_H, the paper's baseline, as the docs and benchmarks compare): the same
  noisy histograms collected on the driver, the convex relaxation of the whole tree in one QP
  (Clarabel, solved as a scaled step so large counts do not swamp the noise), checked
  independently (equality residual and a weak-duality lower bound: the manifest's ``relaxed``
  says ``reliable`` or not), then rounded cell by cell. Refused in one line beyond
  ``RELAXED_MAX_CELLS`` (node, size) cells, before any noise is drawn.
* ``relaxed_families``: the relaxation solved per family top-down on Spark (the parent's
  real-valued solution fixed), then rounded: a scalable variant, not the paper's, and no better
  than ``relaxed``. For both, rounding may break consistency and faithfulness: the violations
  are counted and reported, not raised.
* ``cumulative`` (M_c): cumulative noise, per-family exact integer programs top-down.

Every mechanism is refused in one line, before any noise is drawn, if its largest Spark Python
call would need more than ``CENSUSDP_WORKER_MEMORY`` (``group_sizes.memory``: an estimate from
N and the public geography's shape, never from a count).

Stages (each a Spark job): read and validate the input (nothing written if it fails) -> node
histograms (confidential, memory only) -> the geography's shape and the memory check (nothing
written if it fails) -> the noise pass, written once to
``noisy_measurements`` -> post-processing reading only that table, level by level (each level
computed and checkpointed in executor storage before the next reads it) -> ``group_sizes``
written in one transaction -> guarantees checked (a violation fails dp and cumulative loudly)
-> with ``--evaluate``, errors against the truth in ``<output>.evaluation/``, beside the release
and never inside it (internal) -> the manifest, last.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.engine.families import level_shapes
from censusdp_spark.engine.hierarchy import geocode_prefix, node_histograms
from censusdp_spark.engine.progress import reporting_progress
from censusdp_spark.engine.session import default_parallelism
from censusdp_spark.group_sizes import spark as gs
from censusdp_spark.group_sizes.config import (
    PgsrConfig,
    privacy_unit,
    with_epsilon,
)
from censusdp_spark.group_sizes.memory import check_memory
from censusdp_spark.group_sizes.readers import read_leaf_histograms
from censusdp_spark.group_sizes.solvers.cost_tables import WindowTooNarrow
from censusdp_spark.group_sizes.solvers.cumulative import cumulative_root
from censusdp_spark.io import delta
from censusdp_spark.model.errors import GuaranteeViolation
from censusdp_spark.model.geography import Level
from censusdp_spark.privacy.unit import PrivacyUnit
from censusdp_spark.release.runner import (
    Clock,
    ReleaseRun,
    input_fingerprint,
    release_contents,
    with_command_line,
)

GROUP_SIZES = "group_sizes"
RELAXED = ("relaxed", "relaxed_families")  # rounded relaxations: violations reported, not raised


@dataclass(frozen=True)
class PgsrOptions:
    mechanism: str | None = None  # None: the config's default
    input: Path | None = None
    output: Path | None = None
    secret_file: Path | None = None
    evaluate: bool = False
    overwrite: bool = False
    reuse_secret: bool = False
    evaluation_output: Path | None = None  # None: <output>.evaluation
    epsilon: Fraction | None = None  # None: the config's; else each level keeps its share


@dataclass
class PgsrSummary:
    output: Path
    mechanism: str
    epsilon: str
    nodes: dict[str, int]
    checks: dict[str, int]
    elapsed_s: float
    timings: dict[str, float] = field(default_factory=dict)
    optimality: dict[str, int] = field(default_factory=dict)
    relaxed: dict[str, Any] = field(default_factory=dict)  # the whole-tree QP's check
    evaluation: list[dict[str, Any]] = field(default_factory=list)
    for_release: bool = True
    evaluation_dir: Path | None = None
    privacy_unit: PrivacyUnit | None = None

    def text(self) -> str:
        guarantees = "  guarantees: " + ", ".join(f"{k} = {v}" for k, v in self.checks.items())
        lines = [
            f"group-size release ({self.mechanism}) written to {self.output}"
            + ("" if self.for_release else " (NOT FOR RELEASE: --reuse-secret)"),
            "  levels: " + ", ".join(f"{lv} ({n} nodes)" for lv, n in self.nodes.items()),
            f"  privacy: epsilon = {self.epsilon} (pure DP)",
            *(self.privacy_unit.lines("  ") if self.privacy_unit else []),
            guarantees,
            f"  elapsed: {self.elapsed_s:.1f} s ("
            + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items())
            + ")",
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
            lines.append(f"  evaluation (internal, not for release): {self.evaluation_dir}")
            lines += [
                f"    {r['level']:<14} L1 {r['l1_mean']:.2f}, EMD {r['emd_mean']:.2f} per node"
                for r in self.evaluation
            ]
        return "\n".join(lines)


def plot_level_errors(frame: pd.DataFrame, path: Path, title: str) -> None:
    """PNG of the mean L1 and EMD per node, level by level (internal, like the table)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for metric, label in (("l1_mean", "L1 per node"), ("emd_mean", "EMD per node")):
        ax.plot(frame["level"], frame[metric], marker="o", label=label)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("mean error per node (groups)")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _apply_options(config: PgsrConfig, options: PgsrOptions) -> PgsrConfig:
    run = with_command_line(config.run, options.output, options.secret_file)
    if config.input is None:
        raise ValueError(
            f"{config.source}: [input] missing: the group-size release needs an input table"
        )
    spec = config.input if options.input is None else replace(config.input, path=options.input)
    spine = config.spine.for_input(spec.path) if config.spine else None
    if options.epsilon is not None:
        config = with_epsilon(config, options.epsilon)
    mechanism = options.mechanism or config.mechanism
    return replace(config, run=run, input=spec, spine=spine, mechanism=mechanism)


def _privacy(config: PgsrConfig) -> dict[str, Any]:
    sensitivity = 1 if config.mechanism == "cumulative" else 2
    return {
        "definition": "pure epsilon-DP; neighbours: one individual joins or leaves an existing group "
        "(the geography is public and the number of groups does not change between neighbours)",
        "unit": privacy_unit(config).manifest(),
        "public_invariants": "G and every node's G^r"
        if config.faithfulness == "node"
        else "G (the root's number of groups) only",
        "epsilon": str(config.budget.total_epsilon),
        "measurement": "cumulative" if config.mechanism == "cumulative" else "histogram",
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


def release_run(config: PgsrConfig, options: PgsrOptions) -> ReleaseRun:
    """The runner of a group-size run of ``config`` (options applied)."""
    assert config.input is not None
    noise = "cumulative" if config.mechanism == "cumulative" else "histogram"
    inputs = [config.input.path, *([config.spine.path] if config.spine else [])]
    contents = release_contents(
        GROUP_SIZES,
        config.document.doc,
        input_fingerprint(inputs),
        tables=[delta.NOISY_MEASUREMENTS, GROUP_SIZES],
        estimation_keys=ESTIMATION_KEYS,
        settings={"noise": noise, "epsilon": str(config.budget.total_epsilon)},
        estimation={"--mechanism": config.mechanism},
    )
    streams = f"{GROUP_SIZES}/{noise}"
    return ReleaseRun.of(GROUP_SIZES, config.run, contents, options, inputs, streams)


def _root_release(
    spark: SparkSession, config: PgsrConfig, geocode: str, counts: Any, noisy: Any = None
) -> DataFrame:
    """The root's released rows (``DP_RELEASE_SCHEMA``, with its noisy values, if given)."""
    root = config.hierarchy.root.name
    if noisy is None:
        rows = [(geocode, root, j + 1, int(c)) for j, c in enumerate(counts)]
        return spark.createDataFrame(rows, gs.RELEASE_SCHEMA)
    cells = zip(counts, noisy, strict=True)
    with_noisy = [(geocode, root, j + 1, int(c), int(v)) for j, (c, v) in enumerate(cells)]
    return spark.createDataFrame(with_noisy, gs.DP_RELEASE_SCHEMA)


def _settle(df: DataFrame) -> DataFrame:
    """Compute a level now and cut its lineage (kept by the executors, not written: if one is
    lost, post-processing restarts from ``noisy_measurements``, which costs no budget)."""
    return df.localCheckpoint(eager=True)


def _post_process_dp(
    spark: SparkSession, config: PgsrConfig, noisy: DataFrame, clock: Clock
) -> tuple[list[DataFrame], dict[str, int]]:
    """Bottom-up tables and top-down splits; under level faithfulness with l2, rerun with the
    cells on a window bound widened until none is (then the release is the exact optimum);
    a rerun rebuilds only the tables of those cells' ancestors, and the leaves (no windows)
    are split once, at the end."""
    geocode, groups, root_noisy = gs.root_row(noisy, config.hierarchy)
    plan = gs.dp_plan(config, groups)
    widened: DataFrame | None = None  # cells whose window is wider than their level's
    reuse: _Reuse | None = None
    rounds = 0
    while True:
        rounds += 1
        try:
            released, tables, lower_bound = _dp_pass(
                spark, config, noisy, plan, widened, reuse, (geocode, groups, root_noisy), clock
            )
        except WindowTooNarrow:
            plan, reuse = plan.wider(), None
            continue
        bound = _settle(gs.bound_cells(_union(released), plan, widened))
        hits = bound.count()
        clock.lap(f"certificate_round_{rounds}")
        if hits == 0:
            break
        reuse = _Reuse(tables, bound)
        if widened is not None:
            cells = bound.unionByName(widened).groupBy("level", "geocode", "size")
            bound = cells.agg(F.max("width").alias("width"))
        widened = _settle(bound)
    # The leaves have no windows: they are split once, after the certificate holds.
    levels = config.hierarchy.levels
    released.append(
        _release_level(noisy, tables, plan, released[-1], levels[-2], levels[-1], clock)
    )
    objective = gs.release_objective(_union(released), config.norm)
    clock.lap("objective")
    if config.faithfulness == "level" and objective != lower_bound:
        raise GuaranteeViolation(
            f"the dp release's objective {objective} is not its tables' optimum {lower_bound}"
        )
    widths = {f"window_{lv}": w for lv, w in plan.widths.items() if w is not None}
    return released, {
        "objective": objective,
        "lower_bound": int(lower_bound),
        "gap": objective - int(lower_bound),
        "rounds": rounds,
        **widths,
        "widened_cells": 0 if widened is None else widened.count(),
    }


@dataclass(frozen=True)
class _Reuse:
    """The previous pass's cost tables and the cells widened since: a node's table depends only
    on the windows in its subtree, so only the ancestors of those cells need new tables."""

    tables: dict[str, DataFrame]
    changed: DataFrame  # level, geocode, size, width


def _affected(reuse: _Reuse, config: PgsrConfig, depth: int) -> DataFrame:
    """Geocodes of level ``depth``'s nodes whose subtree holds a newly widened cell."""
    levels = config.hierarchy.levels
    digits = levels[depth].digits
    prefix = geocode_prefix(digits)
    below = [lv.name for lv in levels[depth:]]
    cells = reuse.changed.filter(F.col("level").isin(below))
    return cells.select(prefix.alias("geocode")).distinct()


def _dp_pass(
    spark: SparkSession,
    config: PgsrConfig,
    noisy: DataFrame,
    plan: gs.DpPlan,
    widened: DataFrame | None,
    reuse: _Reuse | None,
    root: tuple[str, int, Any],  # the root's geocode, G and noisy values
    clock: Clock,
) -> tuple[list[DataFrame], dict[str, DataFrame], int]:
    levels = config.hierarchy.levels
    tables: dict[str, DataFrame] = {}
    below = noisy.filter(F.col("level") == levels[-1].name)
    for depth in reversed(range(len(levels) - 1)):
        level, leaves = levels[depth], depth == len(levels) - 2
        parents = noisy.filter(F.col("level") == level.name)
        if reuse is None:
            fresh = gs.dp_tables(parents, below, level.digits, plan, leaves, widened)
            tables[level.name] = below = _settle(fresh)
        else:
            affected = _settle(_affected(reuse, config, depth))
            key = geocode_prefix(level.digits)
            kids = below.join(affected.withColumnRenamed("geocode", "key"), key == F.col("key"))
            fresh = gs.dp_tables(
                parents.join(affected, "geocode", "left_semi"),
                kids.drop("key"),
                level.digits,
                plan,
                leaves,
                widened,
            )
            kept = reuse.tables[level.name].join(affected, "geocode", "left_anti")
            tables[level.name] = below = _settle(kept.unionByName(fresh))
        clock.lap(f"cost_tables_{level.name}")
    geocode, groups, root_noisy = root
    counts, lower_bound = gs.dp_root(tables[levels[0].name], groups)
    released = [_root_release(spark, config, geocode, counts, root_noisy)]
    for parent, level in zip(levels[:-2], levels[1:-1], strict=True):
        released.append(_release_level(noisy, tables, plan, released[-1], parent, level, clock))
    return released, tables, lower_bound


def _release_level(
    noisy: DataFrame,
    tables: dict[str, DataFrame],
    plan: gs.DpPlan,
    above: DataFrame,
    parent: Level,
    level: Level,
    clock: Clock,
) -> DataFrame:
    """One level's release, split from the level above's (its cost tables, or for the leaves
    their noisy rows)."""
    leaves = level.name not in tables
    children = noisy.filter(F.col("level") == level.name) if leaves else tables[level.name]
    parents = gs.released_histograms(above)
    out = _settle(gs.dp_families(level.name, children, parents, parent.digits, plan, leaves))
    clock.lap(f"release_{level.name}")
    return out


def _post_process_relaxed(
    spark: SparkSession, config: PgsrConfig, noisy: DataFrame, clock: Clock
) -> tuple[list[DataFrame], dict[str, Any]]:
    solution, solved = gs.relaxed_tree(spark, noisy, config.hierarchy, config.faithfulness)
    clock.lap("relaxed_qp")
    return [gs.rounded_release(solution)], solved.report()


def _post_process_relaxed_families(
    spark: SparkSession, config: PgsrConfig, noisy: DataFrame, clock: Clock
) -> list[DataFrame]:
    levels = config.hierarchy.levels
    geocode, groups, root_noisy = gs.root_row(noisy, config.hierarchy)
    solution = gs.relaxed_root(root_noisy, groups, config.faithfulness)
    solved = [
        spark.createDataFrame([(levels[0].name, geocode, solution.tolist())], gs.SOLUTION_SCHEMA)
    ]
    for parent, level in zip(levels, levels[1:], strict=False):
        solved.append(
            _settle(
                gs.relaxed_families(
                    noisy.filter(F.col("level") == level.name),
                    solved[-1],
                    parent.digits,
                    config.faithfulness,
                )
            )
        )
        clock.lap(f"relaxed_{level.name}")
    return [gs.rounded_release(s) for s in solved]


def _post_process_cumulative(
    spark: SparkSession, config: PgsrConfig, noisy: DataFrame, clock: Clock
) -> list[DataFrame]:
    levels = config.hierarchy.levels
    geocode, groups, root_noisy = gs.root_row(noisy, config.hierarchy)
    root = cumulative_root(root_noisy, groups, config.faithfulness)
    released = [_root_release(spark, config, geocode, root)]
    for parent, level in zip(levels, levels[1:], strict=False):
        parents = gs.released_histograms(released[-1])
        noisy_level = noisy.filter(F.col("level") == level.name)
        released.append(
            _settle(
                gs.cumulative_families(
                    level.name, noisy_level, parents, parent.digits, config.faithfulness, groups
                )
            )
        )
        clock.lap(f"release_{level.name}")
    return released


def _union(levels: list[DataFrame]) -> DataFrame:
    out = levels[0]
    for df in levels[1:]:
        out = out.unionByName(df)
    return out


def run_pgsr(spark: SparkSession, config: PgsrConfig, options: PgsrOptions) -> PgsrSummary:
    config = _apply_options(config, options)
    with release_run(config, options) as run, reporting_progress(spark):
        return _run_pgsr(spark, config, options, run)


def _run_pgsr(
    spark: SparkSession, config: PgsrConfig, options: PgsrOptions, run: ReleaseRun
) -> PgsrSummary:
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
    check_memory(config, shapes, gs.arrow_batch_rows(spark))  # before any noise is drawn

    secret = run.secret()  # only once the input has passed validation
    run.prepare_output()
    plan = gs.noise_plan(config, config.mechanism)
    delta.write_table(
        gs.measure(nodes, plan, secret, hierarchy),
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
    if config.mechanism == "dp":
        levels, optimality = _post_process_dp(spark, config, noisy, clock)
    elif config.mechanism == "relaxed":
        levels, relaxed = _post_process_relaxed(spark, config, noisy, clock)
    elif config.mechanism == "relaxed_families":
        levels = _post_process_relaxed_families(spark, config, noisy, clock)
    else:
        levels = _post_process_cumulative(spark, config, noisy, clock)
    delta.write_table(
        _union(levels).select("geocode", "level", "size", "count"),
        output,
        GROUP_SIZES,
        partition_by="level",
    )
    clock.lap("write_release")

    released = delta.read_table(spark, output, GROUP_SIZES)
    _, total, _ = gs.root_row(noisy, hierarchy)
    checks = gs.release_violations(released, noisy, hierarchy, config.faithfulness, total)
    clock.lap("check_guarantees")
    if config.mechanism not in RELAXED and any(checks.values()):
        raise GuaranteeViolation(f"the {config.mechanism} release breaks guarantees: {checks}")

    evaluation_rows: list[dict[str, Any]] = []
    eval_dir: Path | None = None
    if options.evaluate:
        eval_dir = run.evaluation_folder()
        delta.write_table(gs.evaluation(nodes, released), eval_dir, delta.EVALUATION_TABLE)
        frame = pd.DataFrame(delta.read_table(spark, eval_dir, delta.EVALUATION_TABLE).toPandas())
        order = {lv: i for i, lv in enumerate(hierarchy.names)}
        frame = frame.sort_values("level", key=lambda s: s.map(order)).reset_index(drop=True)
        frame.to_csv(eval_dir / delta.EVALUATION_CSV, index=False)
        title = f"{config.run.name}: {config.mechanism}, epsilon = {config.budget.total_epsilon}"
        plot_level_errors(frame, eval_dir / "error_by_level.png", title)
        evaluation_rows = frame.to_dict("records")
        clock.lap("evaluate")

    summary = PgsrSummary(
        output=output,
        mechanism=config.mechanism,
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
            "mechanism": config.mechanism,
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
