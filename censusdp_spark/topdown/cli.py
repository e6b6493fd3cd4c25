"""``censusdp topdown``: the TopDown release's command.

Building the parser imports no Spark; running it imports the job.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from censusdp_spark.release.flags import (
    add_command,
    add_input_flag,
    add_release_flags,
    add_spark_flags,
)
from censusdp_spark.topdown.observer import QUIET

DESCRIPTION = """\
Release counts of the config's schema in every node of the geography under
rho-zCDP (the Census TopDown Algorithm): measure every level's queries with
Gaussian noise, then estimate consistent non-negative integers top-down.
Writes Delta tables (noisy_measurements, estimates, microdata, ...) and a
manifest.json, which lists them, to [run].output."""


def add_topdown_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``topdown`` to the CLI's subparsers."""
    parser = add_command(
        subparsers,
        "topdown",
        help="run the TopDown release (counts per geography, zCDP)",
        description=DESCRIPTION,
        run=run_topdown_from_args,
    )
    add_input_flag(parser)
    add_release_flags(parser)
    parser.add_argument(
        "--resume", action="store_true", help="continue a killed run from its last complete step"
    )
    parser.add_argument(
        "--variances",
        action="store_true",
        help="also write total_variances: the bottom-up variance of every node's total"
        ' (needs [estimation] method = "full_information")',
    )
    parser.add_argument(
        "--noisy-measurements",
        type=Path,
        metavar="PATH",
        help="estimate from these published noisy measurements instead of measuring: no input"
        " is read, no secret read or made, no budget spent (docs/post-processing.md)",
    )
    parser.add_argument(
        "--noisy-format",
        choices=["census_nmf", "censusdp"],
        default="census_nmf",
        help="with --noisy-measurements: the Census Noisy Measurement File's layout, or a"
        " censusdp TopDown release folder",
    )
    parser.add_argument(
        "--states",
        type=state_codes,
        default=(),
        metavar="CODE[,CODE...]",
        help="with --noisy-measurements: a state-by-state run, reading only these states'"
        " State=<CODE> folders (codes as the file's folders spell them, e.g. 44 or 044); each"
        " state estimated as the root of its own tree, no nation row",
    )
    parser.add_argument(
        "--assemble-nation",
        type=Path,
        nargs="+",
        default=(),
        metavar="STATE_RUN",
        help="with --noisy-measurements: the nation and the states, from the file's nation"
        " folders and these --states runs (together every state); then each state again with"
        " --states CODE --state-estimates <this release> (docs/post-processing.md)",
    )
    parser.add_argument(
        "--state-estimates",
        type=Path,
        metavar="NATION",
        help="with --states: hold each state to its estimate in this --assemble-nation"
        " release instead of estimating it as a root",
    )
    add_spark_flags(parser)
    parser.set_defaults(observer=QUIET)
    return parser


def state_codes(text: str) -> tuple[str, ...]:
    """``--states``: comma-separated codes, each once, none empty."""
    codes = tuple(code.strip() for code in text.split(","))
    if any(not code for code in codes):
        raise argparse.ArgumentTypeError(f"{text!r}: an empty state code")
    if len(set(codes)) < len(codes):
        raise argparse.ArgumentTypeError(f"{text!r}: a state given twice")
    return codes


def add_export_nmf_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``export-nmf`` to the CLI's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "export-nmf",
        help="write a TopDown release's noisy measurements in the Census NMF layout",
        description="Write a TopDown release's noisy measurements and invariant totals in the"
        " layout of the Census Bureau's Noisy Measurement File (<Level>.parquet/DPQuery and"
        " Constraint folders), for any tool that reads that file; `censusdp topdown"
        " --noisy-measurements PATH --noisy-format census_nmf` reads it back.",
    )
    parser.add_argument(
        "--release", type=Path, required=True, metavar="DIR", help="the TopDown release folder"
    )
    parser.add_argument(
        "--output", type=Path, required=True, metavar="DIR", help="a new folder for the file"
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="CONF",
        help="the release's config (default: the config file its manifest names)",
    )
    add_spark_flags(parser)
    parser.set_defaults(run=run_export_nmf_from_args)
    return parser


def run_export_nmf_from_args(args: argparse.Namespace) -> int:
    """``censusdp export-nmf``."""
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.topdown.config import load_topdown_config
    from censusdp_spark.topdown.given import export_nmf

    manifest = args.release / "manifest.json"
    if not manifest.is_file():
        raise ValueError(f"{args.release}: not a censusdp release (no manifest.json)")
    config = load_topdown_config(
        args.config or Path(json.loads(manifest.read_text())["config_file"])
    )
    spark = spark_session("censusdp-export-nmf", args.master, args.remote)
    export_nmf(spark, args.release, config, args.output)
    print(f"noisy measurements of {args.release} written in the NMF layout to {args.output}")
    return 0


def add_optimizer_flags(parser: argparse.ArgumentParser) -> None:
    """``censusdp budget``'s options of the budget optimizer (TopDown configs)."""
    parser.add_argument(
        "--optimize",
        action="store_true",
        help="TopDown: print the [budget] that minimises --workload's expected error at the"
        " config's rho, from the config and its public spine alone (no count is read)",
    )
    parser.add_argument(
        "--workload",
        default="pl94",
        metavar="pl94|FILE",
        help="with --optimize: a TOML file of tables, queries and level weights, or pl94"
        " (P1-P4 at county, tract and block group, equal weights; the default)",
    )
    add_input_flag(parser)
    parser.add_argument(
        "--write-config",
        type=Path,
        metavar="PATH",
        help="with --optimize: write the config with the optimized [budget] to PATH (a new file)",
    )
    parser.add_argument(
        "--plot", type=Path, metavar="PNG", help="with --optimize: a figure of the errors"
    )
    add_spark_flags(parser)


def run_topdown_from_args(args: argparse.Namespace) -> int:
    """``censusdp topdown``: user errors propagate to the CLI, which prints one line and
    exits 2."""
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.model.errors import ConfigError
    from censusdp_spark.topdown.config import load_topdown_config
    from censusdp_spark.topdown.given import NoisyFormat
    from censusdp_spark.topdown.job import TopDownOptions, run_topdown

    config = load_topdown_config(args.config)
    if args.variances and config.estimation_method != "full_information":
        raise ConfigError(
            str(args.config),
            "estimation.method",
            f'--variances needs "full_information", not {config.estimation_method!r}',
        )
    options = TopDownOptions(
        input=args.input,
        output=args.output,
        secret_file=args.secret_file,
        evaluate=args.evaluate,
        overwrite=args.overwrite,
        resume=args.resume,
        reuse_secret=args.reuse_secret,
        variances=args.variances,
        evaluation_output=args.evaluation_output,
        noisy_measurements=args.noisy_measurements,
        noisy_format=NoisyFormat(args.noisy_format),
        states=args.states,
        assemble_nation=tuple(args.assemble_nation),
        state_estimates=args.state_estimates,
    )
    spark = spark_session(f"censusdp-topdown-{config.run.name}", args.master, args.remote)
    summary = run_topdown(spark, config, options, args.observer)
    print(summary.text())
    return 0
