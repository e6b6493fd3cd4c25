"""``censusdp validate`` for a synth config: the config, its households and persons through the
release's own reader (``read_linked``: every row rule) and its secret, if one is fixed. Writes
nothing; prints the budget, never a count of people."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from censusdp_spark.release.runner import check_secret
from censusdp_spark.synth.config import SynthConfig, budget_text
from censusdp_spark.synth.spark import read_linked


def validate_synth(
    spark: SparkSession, config: SynthConfig, secret_file: Path | None = None
) -> str:
    """The report of a config that passes every check; the first broken rule raises
    ``ConfigError``, ``InputError`` or ``ValueError`` (one line)."""
    secret = check_secret(config.run, secret_file)
    read_linked(spark, config.input, config.domain)
    return "\n".join(
        [
            f"{config.source}: valid",
            f"  input {config.input.households}, {config.input.persons}: pass every input rule",
            "  budget: " + budget_text(config).replace("\n", "\n  "),
            f"  secret: {secret}",
        ]
    )
