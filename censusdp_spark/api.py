"""The Python API: one call per release, for notebooks and orchestrators other than the CLI.

Each ``run_*`` takes a config (a path, a mapping shaped like the TOML, relative paths resolved
against the current directory, or a config object already loaded) and the same options as the
command line, runs the release under the shared runner (secret policy, lock, manifest)
and returns a :class:`Release` naming its Delta tables, manifest and guarantee checks.

>>> import tomllib
>>> from censusdp_spark import budget
>>> budget("conf/ri_2010_demo.toml").split()[:2]
['level', 'query']
>>> ri = tomllib.loads(Path("conf/ri_2010_demo.toml").read_text())  # a config built in Python
>>> budget(ri) == budget("conf/ri_2010_demo.toml")
True
>>> calm = tomllib.loads(Path("conf/pgsr_calm.toml").read_text())
>>> calm["budget"]["epsilon"] = "1/2"
>>> from censusdp_spark import run_group_sizes
>>> release = run_group_sizes(calm, output=scratch / "calm", mechanism="dp")
>>> sorted(release.tables)
['group_sizes', 'noisy_measurements']
>>> release.checks["negative_counts"], release.for_release
(0, True)
>>> spark.read.format("delta").load(str(release.tables["group_sizes"])).count() > 0
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from censusdp_spark.group_sizes.config import PgsrConfig
    from censusdp_spark.synth.config import SynthConfig
    from censusdp_spark.topdown.config import RunConfig


@dataclass(frozen=True)
class Release:
    """A finished release: where its tables and manifest are, and what its checks found."""

    kind: str
    output: Path
    tables: dict[str, Path]
    manifest: Path
    checks: dict[str, int]
    for_release: bool
    summary: Any
    """The release's own summary object (``.text()`` prints what the CLI prints)."""
    evaluation: Path | None = None
    """With ``evaluate``: the internal evaluation folder, beside the release (not part of it)."""

    @classmethod
    def of(cls, kind: str, output: Path, summary: Any) -> Release:
        manifest = json.loads((output / "manifest.json").read_text())
        return cls(
            kind,
            output,
            {name: output / name for name in manifest["tables"]},
            output / "manifest.json",
            dict(manifest.get("guarantee_checks", {})),
            bool(manifest.get("for_release", True)),
            summary,
            summary.evaluation_dir,
        )


def _session(spark: SparkSession | None, name: str) -> SparkSession:
    from censusdp_spark.engine.session import spark_session

    return spark if spark is not None else spark_session(f"censusdp-{name}")


def budget(config: str | Path | Mapping[str, Any] | RunConfig) -> str:
    """The budget table of a TopDown config (levels, queries, shares, ρ, σ; total ρ and ε)."""
    from censusdp_spark.privacy.accounting import budget_table
    from censusdp_spark.topdown.config import load_config

    loaded = load_config(config)
    return budget_table(loaded.budget, loaded.run.delta, loaded.bypass_single_child)


def run_topdown(
    config: str | Path | Mapping[str, Any] | RunConfig,
    *,
    spark: SparkSession | None = None,
    input: Path | None = None,
    output: Path | None = None,
    secret_file: Path | None = None,
    evaluate: bool = False,
    overwrite: bool = False,
    resume: bool = False,
    reuse_secret: bool = False,
    evaluation_output: Path | None = None,
) -> Release:
    """Run the TopDown release of ``config`` (as ``censusdp topdown``)."""
    from censusdp_spark.topdown.config import load_config
    from censusdp_spark.topdown.job import TopDownOptions
    from censusdp_spark.topdown.job import run_topdown as run

    loaded = load_config(config)
    options = TopDownOptions(
        _path(input), _path(output), _path(secret_file), evaluate, overwrite, resume, reuse_secret,
        evaluation_output=_path(evaluation_output),
    )  # fmt: skip
    summary = run(_session(spark, "topdown"), loaded, options)
    return Release.of("topdown", summary.output, summary)


def run_group_sizes(
    config: str | Path | Mapping[str, Any] | PgsrConfig,
    *,
    spark: SparkSession | None = None,
    mechanism: str | None = None,
    input: Path | None = None,
    output: Path | None = None,
    secret_file: Path | None = None,
    evaluate: bool = False,
    overwrite: bool = False,
    reuse_secret: bool = False,
    evaluation_output: Path | None = None,
    epsilon: Fraction | str | None = None,
) -> Release:
    """Run the group-size release (PGSR) of ``config`` (as ``censusdp pgsr``); ``epsilon``
    (exact) replaces the config's total, each level keeping its share."""
    from censusdp_spark.group_sizes.config import load_pgsr_config
    from censusdp_spark.group_sizes.job import PgsrOptions, run_pgsr

    loaded = load_pgsr_config(config)
    options = PgsrOptions(
        mechanism, _path(input), _path(output), _path(secret_file), evaluate, overwrite,
        reuse_secret, _path(evaluation_output), None if epsilon is None else Fraction(epsilon),
    )  # fmt: skip
    summary = run_pgsr(_session(spark, "group-sizes"), loaded, options)
    return Release.of("group_sizes", summary.output, summary)


def run_synth(
    config: str | Path | Mapping[str, Any] | SynthConfig,
    *,
    method: str,
    spark: SparkSession | None = None,
    rho: Fraction | str | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    rounds: int | None = None,
    output: Path | None = None,
    secret_file: Path | None = None,
    evaluate: bool = False,
    overwrite: bool = False,
    reuse_secret: bool = False,
    evaluation_output: Path | None = None,
) -> Release:
    """Run the hierarchical synthetic-data release of ``config`` (as ``censusdp synth``)."""
    from censusdp_spark.synth.config import load_synth_config
    from censusdp_spark.synth.job import SynthOptions
    from censusdp_spark.synth.job import run_synth as run

    loaded = load_synth_config(config)
    options = SynthOptions(
        method,
        None if rho is None else Fraction(rho),
        epsilon,
        delta,
        rounds,
        _path(output),
        _path(secret_file),
        evaluate,
        overwrite,
        reuse_secret,
        _path(evaluation_output),
    )
    summary = run(_session(spark, "synth"), loaded, options)
    return Release.of("synth", summary.output, summary)


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)
