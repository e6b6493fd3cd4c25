"""``censusdp synth``: the synthetic-data release's command.

Building the parser imports no Spark and no numpy core; running it imports the job.
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from typing import Any

from censusdp_spark.release.flags import add_command, add_release_flags, add_spark_flags
from censusdp_spark.synth.methods import METHODS, method_named

DESCRIPTION = """\
Release synthetic households and their persons under rho-zCDP: one of the
methods fits a model to noisy measurements of the config's workloads (household,
person and relationship marginals), then samples it. Writes the Delta tables
synthetic_households, synthetic_persons and noisy_measurements and a
manifest.json to [run].output."""


def add_synth_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``synth`` to the CLI's subparsers."""
    parser = add_command(
        subparsers,
        "synth",
        help="run the synthetic-data release (households and persons, zCDP)",
        description=DESCRIPTION,
        run=run_synth_from_args,
    )
    parser.add_argument(
        "--method",
        required=True,
        choices=METHODS,
        help="mwem, hpd_fixed, hpd_gen (Adaptive Measurements) or independent (one-way marginals)",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--rho",
        type=Fraction,
        metavar="FRACTION",
        help="total rho as an exact fraction, e.g. 1/10 (default: [budget] rho)",
    )
    budget.add_argument(
        "--epsilon", type=float, help="total epsilon at --delta (converted to rho, rounded down)"
    )
    parser.add_argument("--delta", type=float, help="with --epsilon (default: [run].delta)")
    parser.add_argument(
        "--rounds", type=int, help="fixed number of rounds T (default: [budget], scaled with rho)"
    )
    add_release_flags(parser)
    add_spark_flags(parser)
    return parser


def run_synth_from_args(args: argparse.Namespace) -> int:
    """``censusdp synth``: user errors propagate to the CLI, which prints one line and exits 2."""
    from censusdp_spark.synth.config import load_synth_config, refuse_unfit_method

    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds {args.rounds} must be >= 1")
    method = method_named(args.method)  # one of the parser's choices
    config = load_synth_config(args.config)
    refuse_unfit_method(config, method)  # the config decides it: before Spark is loaded
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.release.runner import release_choices
    from censusdp_spark.synth.job import SynthOptions, run_synth

    options = SynthOptions(
        method=method,
        rho=args.rho,
        epsilon=args.epsilon,
        delta=args.delta,
        rounds=args.rounds,
        **release_choices(args),
    )
    spark = spark_session(f"censusdp-synth-{config.run.name}", args.master, args.remote)
    summary = run_synth(spark, config, options)
    print(summary.text())
    return 0
