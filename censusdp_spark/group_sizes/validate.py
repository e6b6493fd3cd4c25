"""``censusdp validate`` for a group-size config: the config, its input through the release's
own reader (``read_leaf_histograms``: every input rule, the spine's included), the memory its
default mechanism needs (``group_sizes.memory``, the same check as the run's) and its secret,
if one is fixed. Writes nothing; prints node counts per level (the public geography), the
memory estimate and the budget, never a count of groups."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from censusdp_spark.engine.families import level_shapes
from censusdp_spark.group_sizes.config import GroupSizesConfig
from censusdp_spark.group_sizes.memory import WORKER_MEMORY_ENV, check_memory, worker_memory
from censusdp_spark.group_sizes.readers import read_leaf_histograms
from censusdp_spark.group_sizes.shapes import arrow_batch_rows, leaf_nodes
from censusdp_spark.model.config import input_for_run
from censusdp_spark.model.memory import size_text
from censusdp_spark.release.runner import check_secret


def validate_group_sizes(
    spark: SparkSession,
    config: GroupSizesConfig,
    input_path: Path | None = None,
    secret_file: Path | None = None,
) -> str:
    """The report of a config that passes every check; the first broken rule raises
    ``ConfigError``, ``InputError`` or ``ValueError`` (one line)."""
    spec, spine = input_for_run(
        config.source, config.input, config.spine, input_path, "the group-size release needs one"
    )
    secret = check_secret(config.run, secret_file)
    leaves = read_leaf_histograms(spark, spec, config.groups, config.hierarchy.leaf.digits, spine)
    shapes = level_shapes(leaf_nodes(leaves, config.hierarchy), config.hierarchy)
    memory = check_memory(config, shapes, arrow_batch_rows(spark))
    nodes = {s.name: s.nodes for s in shapes}
    origin = f"from the spine {spine.path}" if spine else "those of the input"
    return "\n".join(
        [
            f"{config.source}: valid",
            f"  input {spec.path}: passes every input rule",
            f"  leaves: {nodes[config.hierarchy.leaf.name]}, {origin}",
            "  nodes: " + ", ".join(f"{lv} {n}" for lv, n in nodes.items()),
            f"  sizes: 1..{config.groups.max_size}"
            + (f" ({config.groups.max_size} = or more)" if config.groups.topcode else ""),
            f"  memory: {config.mechanism} needs {memory.text()} (limit {WORKER_MEMORY_ENV} = "
            f"{size_text(worker_memory())})",
            f"  budget: epsilon = {config.budget.total_epsilon} (pure DP)",
            f"  secret: {secret}",
        ]
    )
