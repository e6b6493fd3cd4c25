"""``censusdp group-sizes`` (alias ``pgsr``): the group-size release's command.

Building the parser imports no Spark; running it imports the job.
"""

from __future__ import annotations

import argparse
from typing import Any

from censusdp_spark.group_sizes.config import MECHANISM_NAMES, Mechanism
from censusdp_spark.release.flags import (
    add_command,
    add_input_flag,
    add_release_flags,
    add_spark_flags,
)

DESCRIPTION = """\
Release the number of groups (households) of each size 1..N in every node of
the geography under pure epsilon-DP, as non-negative integers consistent with
the parent's. Writes the Delta tables group_sizes and noisy_measurements and
a manifest.json to [run].output."""


def add_group_sizes_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``group-sizes`` (and its alias ``pgsr``) to the CLI's subparsers."""
    parser = add_command(
        subparsers,
        "group-sizes",
        aliases=["pgsr"],
        help="run the group-size release (households of each size per region; alias: pgsr)",
        description=DESCRIPTION,
        run=run_group_sizes_from_args,
    )
    parser.add_argument(
        "--mechanism",
        choices=MECHANISM_NAMES,
        metavar="MECHANISM",
        help="post-processing: exact (alias dp: the exact integer optimum, family by family),"
        " relaxed (the whole tree's"
        " convex relaxation, rounded), relaxed_families (the same per family) or cumulative"
        " (cumulative noise) (default: the config's [mechanism] default)",
    )
    add_input_flag(parser)
    parser.add_argument(
        "--epsilon",
        metavar="FRACTION",
        help="total epsilon, exact (e.g. 1/2); each level keeps its config share",
    )
    add_release_flags(parser)
    add_spark_flags(parser)
    return parser


def run_group_sizes_from_args(args: argparse.Namespace) -> int:
    """``censusdp group-sizes``: user errors propagate to the CLI, which prints one line and
    exits 2."""
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.group_sizes.config import load_group_sizes_config, parse_epsilon
    from censusdp_spark.group_sizes.job import PgsrOptions, run_pgsr
    from censusdp_spark.release.runner import release_choices

    config = load_group_sizes_config(args.config)
    options = PgsrOptions(
        mechanism=None if args.mechanism is None else Mechanism.named(args.mechanism),
        input=args.input,
        epsilon=None if args.epsilon is None else parse_epsilon(config.source, args.epsilon),
        **release_choices(args),
    )
    spark = spark_session(f"censusdp-pgsr-{config.run.name}", args.master, args.remote)
    summary = run_pgsr(spark, config, options)
    print(summary.text())
    return 0
