"""The Python API: one call per release, for notebooks and orchestrators other than the CLI.

Each ``run_*`` takes a config (a path, a mapping shaped like the TOML, relative paths resolved
against the current directory, or a config object already loaded) and the same options as the
command line, runs the release under the shared runner (secret policy, lock, manifest)
and returns a :class:`Release` naming its Delta tables, manifest and guarantee checks.
:func:`open_release` gives the same for a release folder written before, and reads its
tables into pandas or Spark.

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
>>> from censusdp_spark import open_release
>>> opened = open_release(scratch / "calm")
>>> opened.kind, opened.budget["epsilon"], opened.manifest["run"]
('group_sizes', '1/2', 'pgsr_calm')
>>> len(opened.to_pandas("group_sizes")) == opened.spark("group_sizes").count()
True
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from censusdp_spark.group_sizes.config import GroupSizesConfig, MechanismName
    from censusdp_spark.privacy.unit import PrivacyUnit
    from censusdp_spark.synth.config import SynthConfig
    from censusdp_spark.synth.methods import Method
    from censusdp_spark.topdown.config import TopDownConfig
    from censusdp_spark.topdown.schema import Schema
    from censusdp_spark.topdown.strategy import BudgetChoice


@dataclass(frozen=True)
class Release:
    """A finished release on disk: its manifest, its Delta tables, and readers for them.

    Made by ``open_release`` (any release folder) or returned by a ``run_*`` call, which
    also sets ``summary`` and ``evaluation``. ``output`` is the folder, ``manifest`` its
    ``manifest.json`` as a dict; ``tables`` names the Delta tables, ``to_pandas`` and
    ``spark`` read one.

    Example:
        On the demo's release (``scripts/demo.sh`` writes it):

        ```python
        from censusdp_spark import open_release

        release = open_release("output/ri_2010_demo")
        release.kind                      # "topdown"
        sorted(release.tables)            # ["bottom_up", "estimates", "microdata", "noisy_measurements"]
        release.checks                    # every guarantee check, 0 violations each
        release.budget["rho"]             # "293764/114921", an exact fraction as text
        estimates = release.to_pandas("estimates")
        ```
    """

    output: Path
    """The release folder: ``manifest.json`` and one Delta table per folder."""
    manifest: dict[str, Any]
    """``manifest.json`` as read: what was run, the budget, checks, versions and timings."""
    summary: Any = None
    """From a ``run_*`` call: the run's own summary (``.text()`` prints what the CLI prints)."""
    evaluation: Path | None = None
    """With ``evaluate``: the internal evaluation folder, beside the release (not part of it)."""

    @property
    def kind(self) -> str:
        """``"topdown"``, ``"group_sizes"`` or ``"synth"``."""
        return str(self.manifest["release_kind"])

    @property
    def tables(self) -> dict[str, Path]:
        """The release's Delta tables, by name, in the manifest's order."""
        return {name: self.output / name for name in self.manifest["tables"]}

    @property
    def manifest_path(self) -> Path:
        """Where ``manifest`` was read from."""
        return self.output / MANIFEST

    @property
    def checks(self) -> dict[str, int]:
        """The guarantee checks the run made (each the number of violations found)."""
        return dict(self.manifest.get("guarantee_checks", {}))

    @property
    def for_release(self) -> bool:
        """False when the run was marked not for release (e.g. ``--reuse-secret``)."""
        return bool(self.manifest.get("for_release", True))

    @property
    def budget(self) -> dict[str, Any]:
        """The privacy the release spent, as its manifest records it: the definition and the
        total (``rho`` with ``delta`` and ``epsilon_tight``, or a pure ``epsilon`` with its
        ``levels``), and with ``entries`` each measurement's share (TopDown: level, query,
        ρ and σ; synth: every one-way measurement and round)."""
        entries = self.manifest.get("budget")
        return {**self.manifest["privacy"], **({"entries": entries} if entries else {})}

    def spark(self, name: str, spark: SparkSession | None = None) -> DataFrame:
        """Table ``name`` as a Spark DataFrame (``spark``, else the active or a new local
        session). A TopDown table with a ``cell`` column gains one column per attribute of
        the schema, the cell's level label (as ``to_pandas``).

        Args:
            name: One of the release's tables (a key of ``tables``), e.g. ``"estimates"``.
            spark: The session to read with; default the active one, else a new local session
                with Delta Lake (its jars as ``CENSUSDP_JARS`` says).

        Returns:
            The Delta table, decoded as above.

        Raises:
            KeyError: The release has no table ``name``; the message lists its tables.
            SetupError: A new local session finds no Delta Lake jars.
        """
        path = self._path(name)
        frame = _session(spark, "read").read.format("delta").load(str(path))
        schema = self._cell_schema(frame.columns)
        if schema is None:
            return frame
        from censusdp_spark.topdown.microdata import attribute_columns

        return frame.select("*", *attribute_columns(schema))

    def to_pandas(self, name: str, spark: SparkSession | None = None) -> pd.DataFrame:
        """Table ``name`` as a pandas DataFrame, read with the ``deltalake`` package when it is
        installed (no Spark), else through Spark. A TopDown table with a ``cell`` column (the
        row-major index over the schema's attributes) gains one column per attribute, the
        cell's level label; the ``cell`` column stays.

        Args:
            name: One of the release's tables (a key of ``tables``), e.g. ``"estimates"``.
            spark: The session to read with when ``deltalake`` is not installed (as for
                ``spark``); unused otherwise.

        Returns:
            The whole table in memory: read a large one by level with ``spark`` instead.

        Raises:
            KeyError: The release has no table ``name``; the message lists its tables.
        """
        try:
            from deltalake import DeltaTable
        except ImportError:
            return self.spark(name, spark).toPandas()
        frame = DeltaTable(str(self._path(name))).to_pandas()
        schema = self._cell_schema(list(frame.columns))
        if schema is None:
            return frame
        return frame.assign(**schema.labels_of(frame["cell"].to_numpy()))

    def _path(self, name: str) -> Path:
        if name not in self.manifest["tables"]:
            raise KeyError(f"{self.output} has no table {name!r}; its tables: {list(self.tables)}")
        return self.output / name

    def _cell_schema(self, columns: list[str]) -> Schema | None:
        """The TopDown schema, when the table has a ``cell`` column to decode."""
        if self.kind != "topdown" or "cell" not in columns:
            return None
        from censusdp_spark.topdown.config import load_topdown_config

        text = self.manifest["config_text"]  # TOML, or JSON for a config given as a mapping
        document = json.loads(text) if text.lstrip().startswith("{") else tomllib.loads(text)
        return load_topdown_config(document).schema


MANIFEST = "manifest.json"


def open_release(path: str | Path) -> Release:
    """The release in folder ``path`` (any kind), read from its ``manifest.json``; a
    ``FileNotFoundError`` naming the folder when it holds none (a run not finished, or not a
    release).

    Args:
        path: A release folder, as a run wrote it (its ``[run] output`` or ``--output``).

    Returns:
        The release; reading it starts no Spark until ``spark`` (or ``to_pandas`` without the
        ``deltalake`` package) is called. Its paths are absolute, resolved against the current
        directory now: a Spark session started elsewhere reads the same folder.

    Raises:
        FileNotFoundError: ``path`` holds no ``manifest.json``.

    Example:
        >>> from censusdp_spark import open_release
        >>> open_release("output/no_such_release")
        Traceback (most recent call last):
        FileNotFoundError: output/no_such_release: no manifest.json, so no finished release
    """
    output = Path(path)
    manifest = output / MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(f"{output}: no {MANIFEST}, so no finished release")
    return Release(output.absolute(), json.loads(manifest.read_text()))


def _finished(summary: Any) -> Release:
    """The release a ``run_*`` call just wrote, with its summary."""
    release = open_release(summary.output)
    return replace(release, summary=summary, evaluation=summary.evaluation_dir)


def _session(spark: SparkSession | None, name: str) -> SparkSession:
    from censusdp_spark.engine.session import spark_session

    return spark if spark is not None else spark_session(f"censusdp-{name}")


def optimize_budget(
    config: str | Path,
    *,
    workload: str | Path = "pl94",
    input: Path | None = None,
    spark: SparkSession | None = None,
) -> BudgetChoice:
    """Choose a TopDown config's shares of ρ for a workload (as ``censusdp budget --optimize``).

    The total ρ, the queries and the method stay the config's; the level and query shares are
    those minimising the workload's expected error under the linear estimator on a tree with
    each level's mean number of children, read from the config's public spine. No count is
    read: two inputs on one spine get the same answer, and choosing spends no privacy.

    Args:
        config: A TopDown config file with a ``[geography] spine``.
        workload: ``"pl94"`` (P1-P4 at county, tract and block group, weight 1 each) or a
            TOML file of ``tables`` (P.L. 94-171, through the config's
            ``[output.pl94_tables]``), ``queries`` (the config's query grammar) and
            ``[levels]`` weights.
        input: The input the config would read instead of its ``[input] path``, for a spine
            kept beside the input (``relative_to = "input"``).
        spark: The session to read the spine with; default the active one, else a new local
            session.

    Returns:
        The choice: its ``budget`` (the ``[budget]`` TOML, exact fractions), ``text()`` (what
        the command prints: the expected errors beside the config's), ``write_config(path)``
        and ``plot(path)``.

    Raises:
        ConfigError: The config is not TopDown's or has no spine, or the workload file breaks
            a rule (the message names the file and the key).
        InputError: The spine breaks a rule.
        ValueError: A level's queries do not identify every cell where they must.

    Example:
        ```python
        from censusdp_spark import optimize_budget

        choice = optimize_budget("conf/pl94_2020_production.toml")
        print(choice.text())          # expected error per level and table, then [budget]
        choice.write_config(Path("conf/my_optimized.toml"))
        ```
    """
    from censusdp_spark.model.config import release_kind
    from censusdp_spark.model.errors import ConfigError
    from censusdp_spark.topdown import strategy
    from censusdp_spark.topdown.config import load_topdown_config
    from censusdp_spark.topdown.readers import spine_node_counts

    source = str(config)
    if release_kind(config) != "topdown":
        raise ConfigError(source, "-", "--optimize chooses TopDown budgets only")
    loaded = load_topdown_config(config)
    if loaded.spine is None:
        raise ConfigError(
            source,
            "geography.spine",
            "--optimize reads the public spine for the tree's shape and nothing else: the"
            " config needs [geography] spine",
        )
    chosen_workload = strategy.load_workload(workload, loaded)
    spine = loaded.spine if input is None else loaded.spine.for_input(Path(input))
    nodes = spine_node_counts(_session(spark, "budget"), spine, loaded.hierarchy)
    model = strategy.ErrorModel(loaded, nodes, chosen_workload)
    return strategy.BudgetChoice(
        config=loaded,
        source=source,
        spine=loaded.document.shown(spine.path),
        nodes=nodes,
        model=model,
        optimized=strategy.optimize(model),
    )


def load_any_config(
    config: str | Path | Mapping[str, Any] | TopDownConfig | GroupSizesConfig | SynthConfig,
) -> TopDownConfig | GroupSizesConfig | SynthConfig:
    """Any release's config, validated: TopDown's, the group sizes' or synth's, told apart by
    their sections (``model.config.release_kind``); a ``ConfigError`` in one line otherwise.
    A config already loaded is returned as it is."""
    from censusdp_spark.group_sizes.config import GroupSizesConfig, load_group_sizes_config
    from censusdp_spark.model.config import release_kind
    from censusdp_spark.synth.config import SynthConfig, load_synth_config
    from censusdp_spark.topdown.config import TopDownConfig, load_topdown_config

    if isinstance(config, TopDownConfig | GroupSizesConfig | SynthConfig):
        return config
    kind = release_kind(config)
    if kind == "topdown":
        return load_topdown_config(config)
    return load_group_sizes_config(config) if kind == "group_sizes" else load_synth_config(config)


def budget(
    config: str | Path | Mapping[str, Any] | TopDownConfig | GroupSizesConfig | SynthConfig,
    *,
    epsilon: str | Fraction | float | None = None,
    delta: float | None = None,
) -> str:
    """How any release's config spends its budget (as ``censusdp budget``): TopDown's levels,
    queries, shares, ρ and σ; the group sizes' ε and noise scales per level; synth's ρ per
    measurement and round. Each ends with the total and its ε.

    Args:
        config: A config file's path, a mapping shaped like its TOML, or a config loaded
            before.
        epsilon: Another total, meaning what the release's own ``--epsilon`` means: the group
            sizes' exact pure-DP ε (``"1/2"``), each level keeping its share; synth's ε at
            ``delta``, converted to the largest ρ within it (rounded down). TopDown's budget
            is ρ per level and query: it takes none.
        delta: Synth's δ of ``epsilon``, only with it; default the config's ``[run] delta``.

    Returns:
        The table ``censusdp budget`` prints, without its first lines (the config's name and
        its privacy unit).

    Raises:
        ConfigError: The config breaks a rule (a budget that does not add up included), or
            ``epsilon`` or ``delta`` is not one the release takes; the message names the
            file, the key and the rule.
        ValueError: Synth's ``delta`` without ``epsilon``.

    Example:
        >>> from censusdp_spark import budget
        >>> print(budget("conf/ri_2010_demo.toml").splitlines()[-1])
        epsilon at delta=1e-10: 17.1436 (tight, CKS20 Cor. 13); 17.9002 (Bun-Steinke bound)
    """
    from censusdp_spark.group_sizes.config import GroupSizesConfig, parse_epsilon, with_epsilon
    from censusdp_spark.group_sizes.config import budget_text as group_sizes_budget
    from censusdp_spark.model.errors import ConfigError
    from censusdp_spark.synth.config import budget_text as synth_budget
    from censusdp_spark.synth.config import total_rho
    from censusdp_spark.topdown.config import TopDownConfig
    from censusdp_spark.topdown.manifest import budget_table

    loaded = load_any_config(config)
    if isinstance(loaded, TopDownConfig | GroupSizesConfig) and delta is not None:
        rule = "--delta is synth's, with --epsilon"
        raise ConfigError(loaded.source, "run.delta", rule)
    if isinstance(loaded, TopDownConfig):
        if epsilon is not None:
            rule = "--epsilon: TopDown's budget is rho per level and query, and its run takes none"
            raise ConfigError(loaded.source, "budget", rule)
        return budget_table(loaded.budget, loaded.run.delta, loaded.bypass_single_child)
    if isinstance(loaded, GroupSizesConfig):
        if epsilon is not None:
            loaded = with_epsilon(loaded, parse_epsilon(loaded.source, str(epsilon)))
        return group_sizes_budget(loaded)
    rho, reported = total_rho(loaded, None, _synth_epsilon(loaded.source, epsilon), delta)
    return synth_budget(replace(loaded, run=replace(loaded.run, delta=reported)), rho)


def _synth_epsilon(source: str, epsilon: str | Fraction | float | None) -> float | None:
    """Synth's ``--epsilon``: a number, as its run's flag reads it."""
    from censusdp_spark.model.errors import ConfigError

    if epsilon is None:
        return None
    try:
        return float(epsilon)
    except ValueError:
        rule = f"--epsilon {epsilon!r} is not a number such as 1.5 (converted to rho at --delta)"
        raise ConfigError(source, "budget.rho", rule) from None


def privacy_unit(
    config: str | Path | Mapping[str, Any] | TopDownConfig | GroupSizesConfig | SynthConfig,
) -> PrivacyUnit:
    """Whom any release's config protects (as ``censusdp budget`` and a run's summary print
    it): how neighbouring inputs differ, and what they share, which the release takes as
    public. The manifest records the same under ``privacy.unit``.

    Raises:
        ConfigError: The config breaks a rule; the message names the file, the key and the
            rule.

    Example:
        >>> from censusdp_spark.api import privacy_unit
        >>> print(privacy_unit("conf/pgsr_calm.toml").lines()[0])
        privacy unit: neighbouring inputs differ in one individual joining or leaving an existing group (no group is added or removed)
    """
    from censusdp_spark.group_sizes.config import GroupSizesConfig
    from censusdp_spark.group_sizes.config import privacy_unit as group_sizes_unit
    from censusdp_spark.synth.config import privacy_unit as synth_unit
    from censusdp_spark.topdown.config import TopDownConfig
    from censusdp_spark.topdown.config import privacy_unit as topdown_unit

    loaded = load_any_config(config)
    if isinstance(loaded, TopDownConfig):
        return topdown_unit(loaded)
    if isinstance(loaded, GroupSizesConfig):
        return group_sizes_unit(loaded)
    return synth_unit(loaded)


def check(
    config: str | Path | Mapping[str, Any] | TopDownConfig | GroupSizesConfig | SynthConfig,
) -> str:
    """Validate any release's config without Spark or data (as ``censusdp check``) and say
    what it describes in one line; a ``ConfigError`` naming file, key and rule otherwise.

    Args:
        config: A config file's path, a mapping shaped like its TOML (named ``<config>`` in
            messages), or a config loaded before.

    Returns:
        One line: the file, the release it configures, its shape and its total budget.

    Raises:
        ConfigError: The config cannot be read or breaks a rule; the message names the file,
            the key and the rule.

    Example:
        >>> from censusdp_spark import check
        >>> print(check("conf/pgsr_calm.toml"))
        conf/pgsr_calm.toml: a valid group-size config (pgsr_calm): levels region > county > tract > block_group > taz, sizes 1..4 (4 = 4 or more), mechanism dp; epsilon 1 (pure DP)
        >>> check("conf/no_such_config.toml")
        Traceback (most recent call last):
        censusdp_spark.model.errors.ConfigError: conf/no_such_config.toml: [-] file not found
    """
    from censusdp_spark.group_sizes.config import GroupSizesConfig
    from censusdp_spark.topdown.config import TopDownConfig

    loaded = load_any_config(config)
    if isinstance(loaded, TopDownConfig):
        return _topdown_summary(loaded)
    if isinstance(loaded, GroupSizesConfig):
        return _group_sizes_summary(loaded)
    return _synth_summary(loaded)


def _topdown_summary(config: TopDownConfig) -> str:
    queries = sum(len(q) for q in config.queries.values())
    shape = (
        f"levels {' > '.join(config.hierarchy.names)}, {config.schema.n_cells} cells,"
        f" {queries} queries"
    )
    return f"{config.source}: a valid TopDown config ({config.run.name}): {shape};" + _zcdp(
        config.budget.total_rho, config.run.delta
    )


def _group_sizes_summary(config: GroupSizesConfig) -> str:
    sizes = config.groups.max_size
    top = f" ({sizes} = {sizes} or more)" if config.groups.topcode else ""
    return (
        f"{config.source}: a valid group-size config ({config.run.name}):"
        f" levels {' > '.join(config.hierarchy.names)}, sizes 1..{sizes}{top},"
        f" mechanism {config.mechanism}; epsilon {config.budget.total_epsilon} (pure DP)"
    )


def _synth_summary(config: SynthConfig) -> str:
    from censusdp_spark.synth.config import mwem_fit_text

    domain = config.domain
    shape = (
        f"{len(domain.group)} household and {len(domain.individual)} person attributes,"
        f" at most {domain.max_members} persons a household"
    )
    zcdp = _zcdp(config.budget.rho, config.run.delta)
    return f"{config.source}: a valid synth config ({config.run.name}): {shape};{zcdp}; " + (
        mwem_fit_text(config)
    )


def _zcdp(rho: Fraction, delta: float) -> str:
    from censusdp_spark.privacy import zcdp_to_approx_dp

    return f" rho {rho} (epsilon {zcdp_to_approx_dp(rho, delta):.3f} at delta {delta:g})"


def run_topdown(
    config: str | Path | Mapping[str, Any] | TopDownConfig,
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
    variances: bool = False,
    noisy_measurements: Path | None = None,
    noisy_format: str = "census_nmf",
    states: Sequence[str] = (),
    assemble_nation: Sequence[Path] = (),
    state_estimates: Path | None = None,
) -> Release:
    """Run the TopDown release of ``config`` (as ``censusdp topdown``).

    Args:
        config: A config file's path, a mapping shaped like its TOML (relative paths read
            from the current directory), or a config loaded with
            ``topdown.config.load_topdown_config``.
        spark: The session to run in; default the active one, else a new local session.
        input: Read this input instead of the config's ``[input] path`` (``--input``).
        output: Write the release here instead of ``[run] output`` (``--output``).
        secret_file: The run secret's file (64 hex characters, mode 0600); default the
            config's, else a secret generated for this run into its private folder.
        evaluate: Also write the errors against the true counts to ``evaluation_output``,
            beside the release. For non-confidential data only: an evaluation reads the truth.
        overwrite: Replace a release censusdp wrote at ``output``.
        resume: Continue the interrupted run at ``output`` where it stopped.
        reuse_secret: Allow a secret bound to another release; the release is then marked
            not for release.
        evaluation_output: Where ``evaluate`` writes; default ``<output>.evaluation``.
        variances: Also write ``total_variances``, the bottom-up variance of every node's
            total (``full_information`` only; ``--variances``).
        noisy_measurements: Estimate from these published noisy measurements instead of
            measuring (``--noisy-measurements``): no input is read, no secret read or made,
            no budget spent; the variances are the file's.
        noisy_format: Their layout: ``"census_nmf"`` (the Census Noisy Measurement File) or
            ``"censusdp"`` (a TopDown release folder of censusdp).
        states: With ``noisy_measurements``, a state-by-state run (``--states``): only these
            states' subtrees are read (an NMF's ``State=<code>`` folders, codes as the file
            spells them; a string is split at its commas) and each state is estimated as the
            root of its own tree; the release has no root (nation) row.
        assemble_nation: With ``noisy_measurements``, the nation and the states from the
            file's root and these state runs (``--assemble-nation``; together every state).
        state_estimates: With ``states``, each state held to its estimate in this nation
            assembled by ``assemble_nation`` (``--state-estimates``): the levels below it as
            the national run's.

    Returns:
        The release written, with the run's ``summary`` (and ``evaluation`` folder).

    Raises:
        ConfigError: The config breaks a rule.
        InputError: The input breaks a rule; the message names the file, the row or column
            and the rule. Nothing is written.
        OutputExistsError: The output holds a release and ``overwrite`` was not given.
        SecretError: The secret cannot be used: readable by others, or bound to another
            release.
        RunLockedError: Another run holds this run's private folder.
        SetupError: No Delta Lake jars for a new local session.
        ResumeError: ``resume`` was asked for a run that cannot be resumed.
        GuaranteeViolation: The released values break a guarantee the release promises; they
            must not be published.

    Example:
        ```python
        from censusdp_spark import run_topdown

        release = run_topdown("conf/ri_2010_demo.toml", output="output/ri")
        print(release.summary.text())     # what ``censusdp topdown`` prints
        release.to_pandas("estimates")
        ```
    """
    from censusdp_spark.topdown.config import load_topdown_config
    from censusdp_spark.topdown.given import NoisyFormat
    from censusdp_spark.topdown.job import TopDownOptions
    from censusdp_spark.topdown.job import run_topdown as run

    loaded = load_topdown_config(config)
    choices = _choices(output, secret_file, evaluate, overwrite, reuse_secret, evaluation_output)
    options = TopDownOptions(
        input=_path(input),
        resume=resume,
        variances=variances,
        noisy_measurements=_path(noisy_measurements),
        noisy_format=NoisyFormat(noisy_format),
        states=tuple(states.split(",")) if isinstance(states, str) else tuple(states),
        assemble_nation=tuple(Path(p) for p in assemble_nation),
        state_estimates=_path(state_estimates),
        **choices,
    )
    summary = run(_session(spark, "topdown"), loaded, options)
    return _finished(summary)


def run_group_sizes(
    config: str | Path | Mapping[str, Any] | GroupSizesConfig,
    *,
    spark: SparkSession | None = None,
    mechanism: MechanismName | None = None,
    input: Path | None = None,
    output: Path | None = None,
    secret_file: Path | None = None,
    evaluate: bool = False,
    overwrite: bool = False,
    reuse_secret: bool = False,
    evaluation_output: Path | None = None,
    epsilon: Fraction | str | None = None,
) -> Release:
    """Run the group-size release (PGSR) of ``config`` (as ``censusdp group-sizes``);
    ``epsilon`` (exact) replaces the config's total, each level keeping its share.

    Args:
        config: A config file's path, a mapping shaped like its TOML (relative paths read
            from the current directory), or a config loaded with
            ``group_sizes.config.load_group_sizes_config``.
        spark: The session to run in; default the active one, else a new local session.
        mechanism: ``"exact"`` (alias ``"dp"``), ``"relaxed"``, ``"relaxed_families"`` or
            ``"cumulative"`` (``--mechanism``); default the config's ``[mechanism]``.
        input: Read this input instead of the config's ``[input] path`` (``--input``).
        output: Write the release here instead of ``[run] output`` (``--output``).
        secret_file: The run secret's file (64 hex characters, mode 0600); default the
            config's, else a secret generated for this run into its private folder.
        evaluate: Also write the errors against the true counts to ``evaluation_output``.
            For non-confidential data only: an evaluation reads the truth.
        overwrite: Replace a release censusdp wrote at ``output``.
        reuse_secret: Allow a secret bound to another release; the release is then marked
            not for release.
        evaluation_output: Where ``evaluate`` writes; default ``<output>.evaluation``.
        epsilon: The total ε (pure DP), exact: a ``Fraction`` or a string such as ``"1/2"``.

    Returns:
        The release written, with the run's ``summary`` (and ``evaluation`` folder).

    Raises:
        ConfigError: The config breaks a rule.
        InputError: The input breaks a rule; the message names the file, the row or column
            and the rule. Nothing is written.
        OutputExistsError: The output holds a release and ``overwrite`` was not given.
        SecretError: The secret cannot be used: readable by others, or bound to another
            release.
        RunLockedError: Another run holds this run's private folder.
        SetupError: No Delta Lake jars for a new local session.
        GuaranteeViolation: The released values break a guarantee the release promises; they
            must not be published.
        ValueError: ``mechanism`` is unknown (before a session starts).

    Example:
        ```python
        from censusdp_spark import run_group_sizes

        release = run_group_sizes("conf/pgsr_calm.toml", mechanism="dp", output="output/calm")
        release.to_pandas("group_sizes")  # level, geocode, size, count
        ```
    """
    from censusdp_spark.group_sizes.config import Mechanism, load_group_sizes_config
    from censusdp_spark.group_sizes.job import PgsrOptions, run_pgsr

    loaded = load_group_sizes_config(config)
    choices = _choices(output, secret_file, evaluate, overwrite, reuse_secret, evaluation_output)
    options = PgsrOptions(
        mechanism=None if mechanism is None else Mechanism.named(mechanism),
        input=_path(input),
        epsilon=None if epsilon is None else Fraction(epsilon),
        **choices,
    )
    summary = run_pgsr(_session(spark, "group-sizes"), loaded, options)
    return _finished(summary)


def run_synth(
    config: str | Path | Mapping[str, Any] | SynthConfig,
    *,
    method: Method,
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
    """Run the hierarchical synthetic-data release of ``config`` (as ``censusdp synth``).

    Args:
        config: A config file's path, a mapping shaped like its TOML (relative paths read
            from the current directory), or a config loaded with
            ``synth.config.load_synth_config``.
        method: ``"mwem"``, ``"hpd_fixed"``, ``"hpd_gen"`` (Adaptive Measurements) or
            ``"independent"`` (one-way marginals).
        spark: The session to run in; default the active one, else a new local session.
        rho: The total ρ, exact (a ``Fraction`` or a string such as ``"1/10"``); default the
            config's ``[budget] rho``. Given, it wins over ``epsilon``.
        epsilon: The total ε at ``delta``, converted to the largest ρ within it (rounded
            down).
        delta: The δ of ``epsilon``, only with it; default the config's ``[run] delta``.
        rounds: A fixed number of rounds; default the config's ``[budget]``, scaled with ρ.
        output: Write the release here instead of ``[run] output`` (``--output``).
        secret_file: The run secret's file (64 hex characters, mode 0600); default the
            config's, else a secret generated for this run into its private folder.
        evaluate: Also write the errors against the input to ``evaluation_output``. For
            non-confidential data only: an evaluation reads the truth.
        overwrite: Replace a release censusdp wrote at ``output``.
        reuse_secret: Allow a secret bound to another release; the release is then marked
            not for release.
        evaluation_output: Where ``evaluate`` writes; default ``<output>.evaluation``.

    Returns:
        The release written, with the run's ``summary`` (and ``evaluation`` folder).

    Raises:
        ConfigError: The config breaks a rule, or ``method`` is ``"mwem"`` and the config's
            explicit domain is above ``[mwem] max_domain`` (refused before any data is read).
        InputError: The input breaks a rule; the message names the file, the row or column
            and the rule. Nothing is written.
        OutputExistsError: The output holds a release and ``overwrite`` was not given.
        SecretError: The secret cannot be used: readable by others, or bound to another
            release.
        RunLockedError: Another run holds this run's private folder.
        SetupError: No Delta Lake jars for a new local session.
        BudgetError: The measurements did not spend exactly the total ρ.
        ValueError: ``method`` is unknown, ρ is not positive, or ``delta`` came without
            ``epsilon``.

    Example:
        ```python
        from censusdp_spark import run_synth

        release = run_synth("conf/synth_pums.toml", method="independent", output="output/pums")
        release.to_pandas("synthetic_households")
        ```
    """
    from censusdp_spark.synth.config import load_synth_config, refuse_unfit_method
    from censusdp_spark.synth.job import SynthOptions
    from censusdp_spark.synth.job import run_synth as run

    loaded = load_synth_config(config)
    refuse_unfit_method(loaded, method)  # before a session starts: the config decides it
    choices = _choices(output, secret_file, evaluate, overwrite, reuse_secret, evaluation_output)
    options = SynthOptions(
        method=method,
        rho=None if rho is None else Fraction(rho),
        epsilon=epsilon,
        delta=delta,
        rounds=rounds,
        **choices,
    )
    summary = run(_session(spark, "synth"), loaded, options)
    return _finished(summary)


def _choices(
    output: str | Path | None,
    secret_file: str | Path | None,
    evaluate: bool,
    overwrite: bool,
    reuse_secret: bool,
    evaluation_output: str | Path | None,
) -> dict[str, Any]:
    """Every ``run_*``'s release choices (``release.runner.ReleaseChoices``) as its options
    take them, paths as ``Path``."""
    return {
        "output": _path(output),
        "secret_file": _path(secret_file),
        "evaluate": evaluate,
        "overwrite": overwrite,
        "reuse_secret": reuse_secret,
        "evaluation_output": _path(evaluation_output),
    }


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)
