"""Group-size release (PGSR) configuration: a TOML file validated once, at the door.

Sections: ``[run]`` and ``[geography]`` as for TopDown; ``[groups]`` the largest size N (and
whether it is top-coded, "N or more"); ``[input]`` the table of households or of per-leaf size
counts; ``[budget]`` a pure-DP ε (an exact fraction) and optional per-level shares (default: an
even split over the levels, as in the paper); ``[mechanism]`` the default post-processing and the
norm of its objective and the definition of faithfulness (``"level"``, the paper's, or
``"node"``). Unknown keys are errors. See ``conf/pgsr_calm.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field

from censusdp_spark.model.config import (
    Budget,
    Columns,
    Document,
    Exact,
    Fail,
    GeographyModel,
    InputFormat,
    Model,
    Name,
    PathText,
    PositiveInt,
    RunModel,
    RunOptions,
    Source,
    SpineSpec,
    budget_in_range,
    check_keys,
    read_config,
    require_spine,
    resolve,
)
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy.accounting import BudgetError, PureDpSplit, split_epsilon
from censusdp_spark.privacy.unit import PrivacyUnit


class Mechanism(StrEnum):
    """The group-size post-processings (``[mechanism] default``, ``--mechanism``), all reading
    the same kind of noisy measurements (``cumulative`` its own).

    A member's value is the string a run records (the manifest's ``mechanism`` and contents,
    the summary): ``EXACT`` records ``"dp"``, its name before it was called ``exact``, so
    ``--mechanism exact`` and ``--mechanism dp`` make the same release, manifest included (a
    config's ``[mechanism]`` table is recorded as written).
    """

    EXACT = "dp"
    """The cost-table dynamic program: the exact integer optimum (``group_sizes.exact``)."""
    RELAXED = "relaxed"
    """The paper's M_H: the whole tree's convex relaxation in one QP, rounded."""
    RELAXED_FAMILIES = "relaxed_families"
    """The same relaxation family by family top-down on Spark, rounded."""
    CUMULATIVE = "cumulative"
    """M_c: cumulative noise, per-family integer programs top-down."""

    @classmethod
    def named(cls, name: str) -> Mechanism:
        """The mechanism a config or the command line names (``MECHANISM_NAMES``); anything
        else is a ``ValueError`` listing them."""
        if name in MECHANISM_ALIASES:
            return MECHANISM_ALIASES[name]
        try:
            return cls(name)
        except ValueError:
            raise ValueError(
                f"unknown mechanism {name!r}: one of {', '.join(MECHANISM_NAMES)}"
            ) from None


MECHANISM_ALIASES: dict[str, Mechanism] = {"exact": Mechanism.EXACT}
"""Other names of a mechanism: ``exact`` is the dynamic program's name; ``dp``, the value it
records, stays accepted."""
MechanismName = Literal["exact", "dp", "relaxed", "relaxed_families", "cumulative"]
"""Every name ``[mechanism] default`` and ``--mechanism`` accept: each mechanism's value and
its aliases."""
MECHANISM_NAMES: tuple[str, ...] = get_args(MechanismName)
assert set(MECHANISM_NAMES) == {*Mechanism, *MECHANISM_ALIASES}
Norm = Literal["l2", "l1"]
NORMS: tuple[str, ...] = get_args(Norm)
Faithfulness = Literal["level", "node"]
""""level": every level sums to the public G (the paper's definition; with consistency, the
root's sum alone). "node": every node sums to its own G^r (Kuo et al.'s
stricter invariant; makes every G^r public)."""
FAITHFULNESS: tuple[str, ...] = get_args(Faithfulness)
Layout = Literal["households", "size_counts"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


@dataclass(frozen=True)
class GroupSizes:
    max_size: int  # N: sizes are 1..N
    topcode: bool  # size N stands for "N or more"


@dataclass(frozen=True, kw_only=True)
class GroupInputSpec:
    """Where the groups come from.

    ``size_counts``: one row per leaf, ``size_columns[i]`` holding the number of groups of size
    ``i + 1``; every row is a leaf of the public spine, empty ones included. ``households``: one
    row per household with its ``size_column``, or one row per member with a ``member_column``
    quantity summed per ``household_column`` (with neither, one row per member, counted); the
    leaves are those holding a household, so
    this layout needs ``[geography] spine``, from which the leaves are then taken.
    """

    path: Path
    format: InputFormat
    layout: Layout
    geocode_columns: tuple[str, ...]
    size_columns: tuple[str, ...] = ()
    household_column: str | None = None
    size_column: str | None = None
    member_column: str | None = None
    ignore: tuple[str, ...] = ()

    def used_columns(self) -> tuple[str, ...]:
        named = [self.household_column, self.size_column, self.member_column]
        cols = [*self.geocode_columns, *self.size_columns, *(c for c in named if c)]
        return tuple(dict.fromkeys(cols))


@dataclass(frozen=True, kw_only=True)
class GroupSizesConfig:
    source: str
    run: RunOptions
    hierarchy: Hierarchy
    groups: GroupSizes
    budget: PureDpSplit
    mechanism: Mechanism  # the default; the command line may choose another
    norm: Norm  # objective of the exact and cumulative post-processings ("l2" as in the paper)
    faithfulness: Faithfulness  # "level" (sums per level = G) or "node" (sums per node = G^r)
    input: GroupInputSpec | None
    spine: SpineSpec | None = None
    document: Document = field(default_factory=Document, compare=False, repr=False)


class GroupsModel(Model):
    max_size: PositiveInt = Field(description="N: groups of sizes 1..N are counted.")
    topcode: bool = Field(
        False,
        description="true: size N stands for N or more; false: a larger group is an input error.",
    )


class InputModel(Model):
    path: PathText = Field(
        description="The input file or folder, relative to the current directory."
    )
    format: InputFormat = Field("csv", description="csv, parquet or delta.")
    layout: Layout = Field(
        description="size_counts: one row per leaf, one count column per size; households: one row per household or per member (needs [geography] spine)."
    )
    geocode: Columns = Field(
        description="The leaf geocode column, or columns concatenated in order."
    )
    size_columns: Columns | None = Field(
        None,
        description='size_counts: the count columns of sizes 1..N in order, or one pattern such as "HHSIZE{size}".',
    )
    household: Name | None = Field(None, description="households: the household key column.")
    size: Name | None = Field(
        None, description="households: the column giving each household's size (one row each)."
    )
    member_quantity: Name | None = Field(
        None,
        description="households: a column summed over a household's rows (one row per member); with neither size nor this, each row counts one member.",
    )
    ignore: list[Name] = Field(
        [],
        description="Columns present in the input but deliberately unused; any other unused column is an error.",
    )

    def spec(self, fail: Fail, groups: GroupSizes, base: Path) -> GroupInputSpec:
        columns = self._size_columns(fail, groups) if self.layout == "size_counts" else ()
        if self.layout == "households":
            self._check_households(fail)
        return GroupInputSpec(
            path=resolve(base, self.path),
            format=self.format,
            layout=self.layout,
            geocode_columns=tuple(self.geocode),
            size_columns=columns,
            household_column=self.household,  # each None with size_counts (checked)
            size_column=self.size,
            member_column=self.member_quantity,
            ignore=tuple(self.ignore),
        )

    def _size_columns(self, fail: Fail, groups: GroupSizes) -> tuple[str, ...]:
        """``size_counts``: the columns of sizes ``1..max_size``, checked."""
        for key in ("household", "size", "member_quantity"):
            if getattr(self, key) is not None:
                raise fail(f"input.{key}", "only for layout = 'households'")
        if self.size_columns is None:
            raise fail("input", "missing required key 'size_columns' (layout = 'size_counts')")
        columns = size_columns(self.size_columns, groups.max_size)
        if len(columns) != groups.max_size or len(set(columns)) != len(columns):
            n = groups.max_size
            rule = f"must name {n} distinct columns (sizes 1..{n}), got {list(columns)}"
            raise fail("input.size_columns", rule)
        return columns

    def _check_households(self, fail: Fail) -> None:
        """``households``: a household column, and at most one of size and member quantity."""
        if self.size_columns is not None:
            raise fail("input.size_columns", "only for layout = 'size_counts'")
        if self.household is None:
            raise fail("input", "missing required key 'household' (layout = 'households')")
        if self.size is not None and self.member_quantity is not None:
            rule = (
                "give at most one of 'size' (a row per household) or 'member_quantity' (a row"
                " per member, summed); with neither, a row per member counts one"
            )
            raise fail("input", rule)


SIZE = "{size}"


def size_columns(given: list[str], sizes: int) -> tuple[str, ...]:
    """The size columns: as listed, or one ``"NAME{size}"`` pattern naming sizes 1..N."""
    if len(given) == 1 and SIZE in given[0]:
        return tuple(given[0].replace(SIZE, str(size)) for size in range(1, sizes + 1))
    return tuple(given)


class BudgetModel(Model):
    epsilon: Budget = Field(
        description='The total epsilon (pure DP), an exact fraction such as "1" or "1/2".'
    )
    levels: dict[str, Exact] | None = Field(
        None,
        description="Level -> its share of epsilon, exact fractions summing to 1. Default: an even split over the levels.",
    )

    def split(self, fail: Fail, hierarchy: Hierarchy) -> PureDpSplit:
        names = hierarchy.names
        if self.levels is not None:
            check_keys(self.levels, {*names}, {*names}, partial(fail, "budget.levels"))
        shares = self.levels or {lv: Fraction(1, len(names)) for lv in names}
        try:
            split = split_epsilon(self.epsilon, {lv: shares[lv] for lv in names})
        except BudgetError as err:
            raise fail("budget", str(err)) from None
        for level, epsilon in split.level_epsilon.items():
            budget_in_range(fail, f"budget.levels.{level}", epsilon, "epsilon")
        return split


class MechanismModel(Model):
    default: MechanismName = Field(
        "exact",
        description="The post-processing unless --mechanism says otherwise: exact (the exact integer optimum by a dynamic program, family by family; also called dp, the name its releases record), relaxed (the whole tree's convex relaxation, rounded), relaxed_families (the same per family) or cumulative (cumulative noise).",
    )
    norm: Norm = Field("l2", description="The objective of exact and cumulative: l2 or l1.")
    faithfulness: Faithfulness = Field(
        "level",
        description="level: every level sums to the public number of groups G; node: every node sums to its own G^r (which makes each public).",
    )


class PgsrModel(Model):
    run: RunModel = Field(RunModel(), description="The run: its name, folders and secret.")
    geography: GeographyModel = Field(description="The hierarchy's levels and the spine.")
    groups: GroupsModel = Field(description="The sizes counted.")
    input: InputModel | None = Field(
        None,
        description="The confidential input. Without it the config can only be checked and budgeted.",
    )
    budget: BudgetModel = Field(description="epsilon and its split over levels.")
    mechanism: MechanismModel = Field(
        MechanismModel(), description="The post-processing and its objective."
    )


def load_group_sizes_config(
    config: Source | GroupSizesConfig, project_root: Path | None = None
) -> GroupSizesConfig:
    """Parse and validate a PGSR config (a TOML file's path, a mapping shaped like the TOML, or
    a ``GroupSizesConfig``, returned as is); relative paths resolve against ``project_root``
    (default: the current directory). Raises ``ConfigError`` naming the file and the key."""
    if isinstance(config, GroupSizesConfig):
        return config
    document, model = read_config(PgsrModel, config, project_root)
    fail, base = document.fail, document.base
    if "delta" in model.run.model_fields_set:
        raise fail("run.delta", "not used: the group-size release is pure epsilon-DP")
    hierarchy = model.geography.hierarchy(fail)
    spine, groups = model.geography.spine_spec(base), GroupSizes(**model.groups.__dict__)
    spec = model.input.spec(fail, groups, base) if model.input else None
    if spec is not None and spine is not None:
        spine = spine.for_input(spec.path)
    if spec is not None and spec.layout == "households":
        require_spine(fail, spine, spec.layout)
    run, budget, m = model.run.options(base, document.name), model.budget, model.mechanism
    return GroupSizesConfig(
        source=document.source,
        run=run,
        hierarchy=hierarchy,
        groups=groups,
        budget=budget.split(fail, hierarchy),
        mechanism=Mechanism.named(m.default),
        norm=m.norm,
        faithfulness=m.faithfulness,
        input=spec,
        spine=spine,
        document=document,
    )


def parse_epsilon(source: str, text: str) -> Fraction:
    """``--epsilon`` of the group-size release (and of ``censusdp budget`` on its config): an
    exact total ε such as ``1/2`` or ``0.5``; anything else is refused in one line naming
    ``budget.epsilon``."""
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        rule = f"--epsilon {text!r} is not an exact fraction like 1/2"
        raise ConfigError(source, "budget.epsilon", rule) from None


def with_epsilon(config: GroupSizesConfig, epsilon: Fraction) -> GroupSizesConfig:
    """``config`` at another total ε (``pgsr --epsilon``), each level keeping its share; an ε
    that is not positive, or gives a level an ε whose noise is not computable, is refused in
    one line naming ``budget.epsilon``."""
    fail = partial(ConfigError, config.source)
    if epsilon <= 0:
        raise fail("budget.epsilon", f"--epsilon {epsilon} must be positive")
    budget_in_range(fail, "budget.epsilon", epsilon, "epsilon")
    old = config.budget
    shares = {lv: e / old.total_epsilon for lv, e in old.level_epsilon.items()}
    split = split_epsilon(epsilon, shares)
    for level, eps in split.level_epsilon.items():
        budget_in_range(fail, f"budget.levels.{level}", eps, "epsilon")
    return replace(config, budget=split)


def budget_text(config: GroupSizesConfig) -> str:
    """The budget table of a group-size config: per level its share of ε and the geometric
    scale of each noise kind (histogram cells: sensitivity 2; cumulative counts: 1)."""
    budget = config.budget
    header = (
        f"{'level':<16}{'epsilon':>12}{'share':>10}{'scale (histogram)':>20}{'(cumulative)':>14}"
    )
    lines = [header, "-" * len(header)]
    for lv in config.hierarchy.names:
        eps = budget.level_epsilon[lv]
        lines.append(
            f"{lv:<16}{str(eps):>12}{str(eps / budget.total_epsilon):>10}"
            f"{str(budget.scale(lv, 2)):>20}{str(budget.scale(lv, 1)):>14}"
        )
    lines += ["-" * len(header), f"total epsilon = {budget.total_epsilon} (pure DP, exact)"]
    return "\n".join(lines)


def privacy_unit(config: GroupSizesConfig) -> PrivacyUnit:
    """The group sizes' privacy unit (the manifest's relation): one individual joins or leaves
    an existing group, so every node's number of groups is the same in neighbours; public are
    the leaf list and the numbers of groups the post-processing holds exactly."""
    if config.spine is not None:
        leaves = f"the leaf list (the spine {config.document.shown(config.spine.path)})"
    else:
        leaves = "the leaf list (every row of the input, empty ones included)"
    groups = (
        'G and every node\'s number of groups G^r (faithfulness = "node" holds each exactly)'
        if config.faithfulness == "node"
        else "G, the number of groups (every level sums to it exactly)"
    )
    return PrivacyUnit(
        "neighbouring inputs differ in one individual joining or leaving an existing group"
        " (no group is added or removed)",
        (leaves, groups),
    )
