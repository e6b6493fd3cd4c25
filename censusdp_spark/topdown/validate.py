"""``censusdp validate``: check a TopDown config, its input and its secret; write nothing.

What it checks, in the order a release would meet them:
1. the config (every rule of ``load_topdown_config``, the budget included);
2. the input, through the same reader as the release (``read_blocks``: columns, integer counts,
   non-negative cells, geocode length, unique geocodes; with ``[geography] spine``, the spine's
   rows and every record on it), so an input that passes here passes there;
3. the run secret, if the run is given one (``--secret-file`` or the config's ``secret_env`` set):
   readable, owner-only, 64 hex characters. It is never printed.

It prints the number of input blocks and of nodes per level (the public spine) and the budget
totals; no count of people. ``censusdp validate`` dispatches a TopDown config to
:func:`run_validate_from_args`; ``spark-submit censusdp_spark/topdown/validate.py --config CONF``
runs it as well.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from pyspark.sql import SparkSession

from censusdp_spark.engine.hierarchy import nodes_per_level
from censusdp_spark.model.config import input_for_run
from censusdp_spark.privacy import zcdp_to_approx_dp
from censusdp_spark.release.flags import CommandParser, add_validate_flags
from censusdp_spark.release.runner import check_secret
from censusdp_spark.topdown.config import TopDownConfig, load_topdown_config
from censusdp_spark.topdown.readers import read_blocks


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    config: str
    input: Path
    spine: Path | None  # the blocks are the spine's when one is configured
    blocks: int
    nodes: dict[str, int]
    rho: str
    epsilon: float
    delta: float
    secret: str  # how the secret was checked, never the secret

    def text(self) -> str:
        return "\n".join(
            [
                f"{self.config}: valid",
                f"  input {self.input}: passes every input rule",
                f"  blocks: {self.blocks}, "
                + (f"from the spine {self.spine}" if self.spine else "those of the input"),
                "  nodes: " + ", ".join(f"{lv} {n}" for lv, n in self.nodes.items()),
                f"  budget: rho = {self.rho} (~{float(Fraction(self.rho)):.4f}) zCDP,"
                f" epsilon = {self.epsilon:.2f} at delta = {self.delta:g}",
                f"  secret: {self.secret}",
            ]
        )


def validate_release(
    spark: SparkSession,
    config: TopDownConfig,
    input_path: Path | None = None,
    secret_file: Path | None = None,
) -> ValidationReport:
    """Run every check; raise ``ConfigError``, ``InputError`` or ``ValueError`` at the first
    broken rule."""
    spec, spine = input_for_run(
        config.source,
        config.input,
        config.spine,
        input_path,
        "the TopDown job needs an input table",
    )
    secret = check_secret(config.run, secret_file)
    blocks = read_blocks(
        spark,
        spec,
        config.schema,
        config.hierarchy.leaf.digits,
        spine,
        config.occupancy,
        config.dwellings,
    )
    nodes = nodes_per_level(blocks, config.hierarchy)
    rho = config.budget.total_rho
    return ValidationReport(
        config=config.source,
        input=spec.path,
        spine=spine.path if spine else None,
        blocks=nodes[config.hierarchy.leaf.name],
        nodes=nodes,
        rho=str(rho),
        epsilon=zcdp_to_approx_dp(rho, config.run.delta),
        delta=config.run.delta,
        secret=secret,
    )


def run_validate_from_args(args: argparse.Namespace) -> int:
    """``censusdp validate``: user errors propagate to the CLI, which prints one line, exit 2."""
    from censusdp_spark.engine.session import spark_session

    config = load_topdown_config(args.config)
    spark = spark_session(f"censusdp-validate-{config.run.name}", args.master, args.remote)
    print(validate_release(spark, config, args.input, args.secret_file).text())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``spark-submit censusdp_spark/topdown/validate.py ...``)."""
    from censusdp_spark.model.errors import ConfigError, InputError

    parser = CommandParser(prog="censusdp validate", description=__doc__.splitlines()[0])
    add_validate_flags(parser)
    try:
        return run_validate_from_args(parser.parse_args(argv))
    except (ConfigError, InputError, ValueError) as err:
        print(f"censusdp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
