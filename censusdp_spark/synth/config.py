"""The synthetic-data config (``conf/synth_*.toml``), validated once at the door.

Sections: ``[run]`` (as for TopDown), ``[input]`` (two tables and their key columns),
``[budget]`` (ρ, rounds and how they scale with ρ, the selection share of each round),
``[workload]``, ``[relationships]``, one ``[[group]]`` / ``[[individual]]`` table per attribute
(column and bins), and one table of hyperparameters per method. Unknown keys are errors; fractions are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, PlainValidator

from censusdp_spark.model.config import (
    Budget,
    Columns,
    Document,
    Exact,
    Fail,
    InputFormat,
    Model,
    Name,
    PathText,
    PositiveFloat,
    PositiveInt,
    RunModel,
    RunOptions,
    Source,
    read_config,
    resolve,
)
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.privacy.unit import PrivacyUnit
from censusdp_spark.synth.domain import BinnedAttribute, Binning, HouseholdDomain, Roles
from censusdp_spark.synth.methods import Method

MAX_MEMBERS = 10  # the largest M: households hold at most this many persons


@dataclass(frozen=True, kw_only=True)
class SynthInput:
    households: Path
    persons: Path
    format: InputFormat
    household_id: str
    member_order: str
    drop_larger: bool = False  # households of more than M persons: left out, else an input error


@dataclass(frozen=True)
class SynthBudget:
    rho: Fraction
    rounds: int
    select_share: Fraction  # of each round's rho, for the exponential mechanism
    rounds_at_rho: Fraction | None = None  # the ρ at which T = rounds; None: T = rounds always

    def rounds_for(self, rho: Fraction) -> int:
        """T at this ρ: ``rounds``·√(ρ/``rounds_at_rho``), rounded, at least 1.

        A round's noise on a normalised answer grows as √(T/ρ), while the error left on the
        workloads no round measured shrinks as T grows; balancing a noise term ∝ √(T/ρ) against
        a coverage term ∝ 1/√T gives T ∝ √ρ. Without ``rounds_at_rho``, T is ``rounds``.
        """
        if self.rounds_at_rho is None:
            return self.rounds
        return max(1, round(self.rounds * math.sqrt(rho / self.rounds_at_rho)))


# The hyperparameter tables validate straight into these dataclasses (unknown keys refused).
@dataclass(frozen=True)
class _Hyperparameters:
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")


# What both HPD methods' tables hold alike: Adam's steps and learning rate.
AdamSteps = Annotated[PositiveInt, Field(description="Adam steps after each measurement.")]
AdamRate = Annotated[PositiveFloat, Field(description="Adam's learning rate.")]


@dataclass(frozen=True)
class MwemOptions(_Hyperparameters):
    passes: Annotated[
        PositiveInt,
        Field(description="Multiplicative-weights passes over all measurements each round."),
    ] = 10
    step: Annotated[
        PositiveFloat, Field(description="The step size (eta) of the multiplicative update.")
    ] = 1.0
    max_domain: Annotated[
        PositiveInt,
        Field(
            description="The most possible households MWEM enumerates; a larger domain is refused (use the reduced config or an HPD method)."
        ),
    ] = 2_000_000


@dataclass(frozen=True)
class HpdFixedOptions(_Hyperparameters):
    components: Annotated[
        PositiveInt, Field(description="K: product distributions in the mixture.")
    ] = 128
    steps_per_round: AdamSteps = 50
    learning_rate: AdamRate = 0.05
    init_scale: Annotated[
        PositiveFloat, Field(description="The standard deviation of the initial logits.")
    ] = 0.5


@dataclass(frozen=True)
class HpdGenOptions(_Hyperparameters):
    components: Annotated[
        PositiveInt, Field(description="Latent draws per step (the mixture's K).")
    ] = 128
    steps_per_round: AdamSteps = 50
    learning_rate: AdamRate = 0.003
    hidden: Annotated[
        PositiveInt, Field(description="The width of the generator's two hidden layers.")
    ] = 128
    latent: Annotated[
        PositiveInt, Field(description="The dimension of the generator's Gaussian input.")
    ] = 32


@dataclass(frozen=True, kw_only=True)
class SynthConfig:
    source: str
    run: RunOptions
    input: SynthInput
    domain: HouseholdDomain
    budget: SynthBudget
    degree: int  # |S| of the Q_G / Q_I / Q_R workloads
    mwem: MwemOptions
    hpd_fixed: HpdFixedOptions
    hpd_gen: HpdGenOptions
    document: Document = field(default_factory=Document, compare=False, repr=False)


def _raw(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r}: raw values are integers or strings")
    return value if isinstance(value, int) else value.strip()


class InputModel(Model):
    households: PathText = Field(
        description="The household table (one row per household, with its [[group]] columns)."
    )
    persons: PathText = Field(
        description="The person table (one row per person, with its [[individual]] columns)."
    )
    format: InputFormat = Field("csv", description="csv, parquet or delta (both tables).")
    household_id: Name = Field(
        description="The household key column, in both tables: it links persons to their household."
    )
    member_order: Name = Field(
        description="The person table's column ordering the members within a household."
    )
    max_members: Annotated[PositiveInt, Field(le=MAX_MEMBERS)] = Field(
        description="M: the most persons a household holds (at most 10)."
    )
    larger_households: Literal["refuse", "drop"] = Field(
        "refuse",
        description="A household of more than max_members persons: refuse (an input error) or drop (left out, counted in the manifest).",
    )


class BudgetModel(Model):
    rho: Budget = Field(
        description='The total rho (zCDP), an exact fraction such as "1/10"; --rho or --epsilon replace it.'
    )
    rounds: PositiveInt = Field(
        description="T: rounds of selecting and measuring a workload (at rounds_at_rho, if given)."
    )
    rounds_at_rho: Budget | None = Field(
        None,
        description="The rho at which T = rounds; at another rho, T scales as its square root. Default: T = rounds at every rho.",
    )
    select_share: Exact = Field(
        Fraction(1, 2),
        description="Each round's share of its rho spent selecting the workload (exponential mechanism); the rest measures it.",
    )


class AttributeModel(Model):
    name: Name = Field(description="The attribute's name, the column it is released in.")
    column: Name = Field(description="The input column it is read from.")
    levels: (
        dict[
            str, list[Annotated[int | str, PlainValidator(_raw, json_schema_input_type=int | str)]]
        ]
        | None
    ) = Field(
        None,
        description="Level -> the raw values (integers or strings) in it. Give exactly one of levels and ranges.",
    )
    ranges: dict[str, list[float]] | None = Field(
        None,
        description="Level -> its numeric range [low, high), or [] for the level of blank values.",
    )
    missing: Name | None = Field(
        None, description="The level blank values fall in; the only level that may be empty."
    )

    def attribute(self, fail: Fail, key: str) -> BinnedAttribute:
        if (self.levels is None) == (self.ranges is None):
            rule = "give exactly one of 'levels' (value lists) and 'ranges' ([low, high) pairs)"
            raise fail(key, rule)
        names: list[str] = []
        values: dict[float | str, int] = {}
        ranges: list[tuple[float, float, int]] = []
        for level, members in (self.levels or {}).items():
            for v in members:
                raw = float(v) if isinstance(v, int) else v
                if raw in values:
                    raise fail(f"{key}.levels.{level}", f"value {v!r} is in two levels")
                values[raw] = len(names)
            names.append(level)
        for level, bounds in (self.ranges or {}).items():
            if bounds and (len(bounds) != 2 or not bounds[0] < bounds[1]):
                rule = f"{bounds!r} must be [low, high] with low < high"
                raise fail(f"{key}.ranges.{level}", rule)
            if bounds:
                ranges.append((bounds[0], bounds[1], len(names)))
            names.append(level)
        ordered = sorted(ranges)
        if any(a[1] > b[0] for a, b in zip(ordered, ordered[1:], strict=False)):
            raise fail(f"{key}.ranges", "ranges overlap")
        if self.missing is not None and self.missing not in names:
            raise fail(f"{key}.missing", f"{self.missing!r} is not one of the levels {names}")
        missing = None if self.missing is None else names.index(self.missing)
        empty = [lv for lv, members in (self.levels or self.ranges or {}).items() if not members]
        if any(level != self.missing for level in empty):
            raise fail(key, f"levels {empty} have no values; only the 'missing' level may be empty")
        if len(names) < 2:
            raise fail(key, "an attribute needs at least two levels")
        binning = Binning(self.column, values, tuple(ranges), missing)
        return BinnedAttribute(self.name, tuple(names), binning)


class RelationshipsModel(Model):
    attribute: Name = Field(
        description="The [[individual]] attribute giving each member's relationship to the household's head."
    )
    head: Name = Field(description="Its level of the head (exactly one per household).")
    spouse: Columns = Field(description="Its level, or list of levels, of a spouse or partner.")
    child: Columns = Field(description="Its level, or list of levels, of a child.")
    max_members: PositiveInt | None = Field(
        None,
        description="The most members the relationship workloads cover. Default: input.max_members.",
    )

    def roles(self, fail: Fail, individual: tuple[BinnedAttribute, ...], max_members: int) -> Roles:
        names = [a.name for a in individual]
        if self.attribute not in names:
            rule = f"{self.attribute!r} is not an individual attribute {names}"
            raise fail("relationships.attribute", rule)
        attr = individual[names.index(self.attribute)]

        def level(label: str, key: str) -> int:
            if label not in attr.levels:
                rule = f"{label!r} is not a level of {attr.name} {list(attr.levels)}"
                raise fail(f"relationships.{key}", rule)
            return attr.levels.index(label)

        head = level(self.head, "head")
        spouse = frozenset(level(v, "spouse") for v in self.spouse)
        child = frozenset(level(v, "child") for v in self.child)
        if head in spouse | child or spouse & child:
            raise fail("relationships", "head, spouse and child levels must be distinct")
        cap = self.max_members or max_members
        if cap > max_members:
            rule = f"{cap!r} must be at most input.max_members = {max_members}"
            raise fail("relationships.max_members", rule)
        return Roles(names.index(self.attribute), head, spouse, child, cap)


class WorkloadModel(Model):
    degree: PositiveInt | None = Field(
        None,
        description="|S|: the number of attributes in each marginal of the workloads. Default: 3, or the number of attributes if fewer.",
    )


class SynthModel(Model):
    run: RunModel = Field(RunModel(), description="The run: its name, folders, secret and delta.")
    input: InputModel = Field(description="The two confidential tables and their keys.")
    budget: BudgetModel = Field(description="rho, the rounds and their split.")
    workload: WorkloadModel = Field(WorkloadModel(), description="The marginals measured.")
    relationships: RelationshipsModel | None = Field(
        None,
        description="Relationship roles (head, spouse, child), for the relationship workloads.",
    )
    group: Annotated[list[AttributeModel], Field(min_length=1)] = Field(
        description="The household attributes, one [[group]] table each."
    )
    individual: Annotated[list[AttributeModel], Field(min_length=1)] = Field(
        description="The person attributes, one [[individual]] table each."
    )
    mwem: MwemOptions = Field(MwemOptions(), description="MWEM's hyperparameters.")
    hpd_fixed: HpdFixedOptions = Field(
        HpdFixedOptions(), description="HPD-Fixed's hyperparameters."
    )
    hpd_gen: HpdGenOptions = Field(HpdGenOptions(), description="HPD-Gen's hyperparameters.")


def load_synth_config(
    config: Source | SynthConfig, project_root: Path | None = None
) -> SynthConfig:
    """Parse and validate a synthetic-data config (a TOML file's path, a mapping shaped like the
    TOML, or a ``SynthConfig``, returned as is); raises ``ConfigError`` naming file and key."""
    if isinstance(config, SynthConfig):
        return config
    document, model = read_config(SynthModel, config, project_root)
    fail, base = document.fail, document.base
    spec = model.input
    group, individual = (
        tuple(a.attribute(fail, f"{key}[{i}]") for i, a in enumerate(getattr(model, key)))
        for key in ("group", "individual")
    )
    names = [a.name for a in (*group, *individual)]
    if len(set(names)) != len(names):
        raise fail("group/individual", f"attribute names must be unique: {names}")
    both = sorted({a.binning.column for a in group} & {a.binning.column for a in individual})
    if both:
        rule = (
            f"column {both[0]!r} is declared at both levels; a column is a household (group) "
            "or a person (individual) attribute, not both"
        )
        raise fail("group/individual", rule)
    relationships = model.relationships
    roles = relationships.roles(fail, individual, spec.max_members) if relationships else None
    budget = model.budget
    if budget.rho <= 0:
        raise fail("budget.rho", f"{budget.rho} must be > 0")
    if not 0 < budget.select_share < 1:
        rule = f"{budget.select_share} must lie strictly between 0 and 1"
        raise fail("budget.select_share", rule)
    if budget.rounds_at_rho is not None and budget.rounds_at_rho <= 0:
        raise fail("budget.rounds_at_rho", f"{budget.rounds_at_rho} must be > 0")
    degree = model.workload.degree or min(3, len(names))
    if degree > len(names):
        rule = f"{degree!r} must be at most the number of attributes, {len(names)}"
        raise fail("workload.degree", rule)
    inputs = SynthInput(
        households=resolve(base, spec.households),
        persons=resolve(base, spec.persons),
        format=spec.format,
        household_id=spec.household_id,
        member_order=spec.member_order,
        drop_larger=spec.larger_households == "drop",
    )
    return SynthConfig(
        source=document.source,
        run=model.run.options(base, document.name),
        input=inputs,
        domain=HouseholdDomain(group, individual, spec.max_members, roles),
        budget=SynthBudget(budget.rho, budget.rounds, budget.select_share, budget.rounds_at_rho),
        degree=degree,
        mwem=model.mwem,
        hpd_fixed=model.hpd_fixed,
        hpd_gen=model.hpd_gen,
        document=document,
    )


def mwem_refusal(config: SynthConfig) -> ConfigError | None:
    """Why ``--method mwem`` cannot run on ``config``, or None: MWEM holds a weight for every
    household of the explicit domain (:meth:`HouseholdDomain.explicit_size`), so a domain above
    ``[mwem] max_domain`` is refused. The domain is the config's alone, so this is known before
    Spark starts or any data is read; the other methods never enumerate it."""
    size, limit = config.domain.explicit_size(), config.mwem.max_domain
    if size <= limit:
        return None
    rule = (
        f"--method mwem: its explicit domain holds {household_count(size)} households, above the"
        f" limit {limit:,}; use the reduced config or an HPD method (hpd_fixed, hpd_gen)"
    )
    return ConfigError(config.source, "mwem.max_domain", rule)


def refuse_unfit_method(config: SynthConfig, method: Method) -> None:
    """Raise the ``ConfigError`` of :func:`mwem_refusal` when ``method`` is ``mwem`` and the
    config's domain is too large for it; every other method runs on any valid config."""
    refusal = mwem_refusal(config) if method == "mwem" else None
    if refusal is not None:
        raise refusal


def mwem_fit_text(config: SynthConfig) -> str:
    """One phrase for ``censusdp check`` and ``budget``: MWEM's domain against its limit, and
    whether ``--method mwem`` would be refused."""
    size, limit = config.domain.explicit_size(), config.mwem.max_domain
    verdict = "fits" if size <= limit else "too large: --method mwem is refused"
    return (
        f"MWEM's explicit domain: {household_count(size)} households,"
        f" limit mwem.max_domain = {limit:,} ({verdict})"
    )


def household_count(n: int) -> str:
    """``n`` with thousands separators, or as ~d.dde<k> past 10^12 (an explicit domain can
    hold more households than a float holds)."""
    if n < 10**12:
        return f"{n:,}"
    digits = str(n)
    return f"~{digits[0]}.{digits[1:3]}e{len(digits) - 1}"


RHO_GRID = 10**12
"""ρ converted from (ε, δ) is rounded *down* to a multiple of 1/RHO_GRID, so ε is never exceeded."""


def total_rho(
    config: SynthConfig,
    rho: Fraction | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
) -> tuple[Fraction, float]:
    """(ρ, the δ ε is reported at) of a run or budget: ``rho`` (``--rho``), else ``epsilon`` at
    ``delta`` (``--epsilon``, ``--delta``; default δ the config's) converted to the largest ρ on
    the grid within it, else the config's ρ. A ``ValueError`` in one line for ``delta`` without
    ``epsilon`` or a ρ that is not positive."""
    from censusdp_spark.privacy import approx_dp_to_zcdp

    reported = delta if delta is not None else config.run.delta
    if delta is not None and epsilon is None:
        raise ValueError("--delta goes with --epsilon")
    if rho is not None:
        total = rho
    elif epsilon is not None:
        total = Fraction(math.floor(approx_dp_to_zcdp(epsilon, reported) * RHO_GRID), RHO_GRID)
    else:
        total = config.budget.rho
    if total <= 0:
        raise ValueError(f"rho = {total} must be > 0")
    return total, reported


def budget_text(config: SynthConfig, rho: Fraction | None = None) -> str:
    """The budget of a synth config (or of ``rho`` instead of its own) as the adaptive methods
    (mwem, hpd_fixed, hpd_gen) spend it: ρ, the one-way measurements first, then T rounds each
    split into selection and measurement; ε at the config's δ; and whether MWEM's explicit
    domain fits its limit (:func:`mwem_fit_text`)."""
    from censusdp_spark.privacy import zcdp_to_approx_dp
    from censusdp_spark.synth.adaptive import plan_budget
    from censusdp_spark.synth.independent import one_way_workloads

    budget = config.budget
    total = budget.rho if rho is None else rho
    initial = len(one_way_workloads(config.domain).workloads)
    plan = plan_budget(total, budget.rounds_for(total), budget.select_share, initial)
    first = plan.rounds[0]
    return "\n".join(
        [
            f"rho = {total} (~{float(total):.4g}) zCDP",
            f"  {initial} one-way measurements: rho {plan.initial[0]} each"
            if initial
            else "  no one-way measurement",
            f"  {len(plan.rounds)} rounds: rho {first.rho_select} to select,"
            f" {first.rho_measure} to measure, each",
            f"  epsilon = {zcdp_to_approx_dp(total, config.run.delta):.3f}"
            f" at delta = {config.run.delta:g}",
            f"  {mwem_fit_text(config)}",
        ]
    )


def privacy_unit(config: SynthConfig) -> PrivacyUnit:
    """Synth's privacy unit (:mod:`censusdp_spark.synth.adaptive`'s change-one-person relation):
    neighbours differ in one person's individual attributes; who lives with whom, every
    household's group attributes, N_G, N_I and M are the same in both, hence public."""
    public = [
        "who lives with whom (household membership) and every household's group attributes",
        f"the numbers of households (N_G) and persons (N_I), and M = {config.domain.max_members}",
    ]
    if config.input.drop_larger:
        public.append(
            f"which households hold more than {config.domain.max_members} persons (dropped;"
            " their number is reported)"
        )
    return PrivacyUnit(
        "neighbouring inputs differ in one person's individual attributes ([[individual]])",
        tuple(public),
    )
