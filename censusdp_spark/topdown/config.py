"""The TopDown run config: schema, geography, budget, queries, input and
estimation settings, validated at the door (errors name the file, key and rule).

``TopDownModel`` mirrors the TOML; ``load_topdown_config`` validates it and converts it into a
``TopDownConfig``, checking there the rules that depend on the schema or the hierarchy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal, get_args

import numpy as np
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from censusdp_spark.io.pl94_layout import (
    BLOCK_DIGITS,
    CELLS,
    SUMMARY_LEVELS,
    TABLES,
    LegacyFiles,
    table_cells,
)
from censusdp_spark.model.attribute import Attribute
from censusdp_spark.model.config import (
    INPUT_FORMATS,
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
    RunModel,
    RunOptions,
    Source,
    SpineModel,
    SpineSpec,
    budget_in_range,
    check_choice,
    check_keys,
    choice_of,
    read_config,
    refused,
    require_spine,
    resolve,
    variant,
)
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy.accounting import (
    BudgetError,
    ZcdpAllocation,
    allocate_by_shares,
    allocate_per_query_rho,
)
from censusdp_spark.privacy.unit import PrivacyUnit
from censusdp_spark.topdown.path_cuts import bypass_paths
from censusdp_spark.topdown.pl94_tables import CENSUS_TABLES, VARIABLES
from censusdp_spark.topdown.queries import TOTAL, MarginalQuery, parse_query
from censusdp_spark.topdown.schema import Recode, Schema
from censusdp_spark.topdown.solvers.symmetric_covariance import covariance_layout

InputLayout = Literal["block_counts", "microdata"]
INPUT_LAYOUTS: tuple[str, ...] = get_args(InputLayout)
PL94_LEGACY: Final = "pl94_legacy"
"""``[input] format``: a state's P.L. 94-171 redistricting files in the legacy layout
(``topdown.pl94``), whose geoheader lists every block (the spine, unless ``[geography] spine``)."""
TopDownInputFormat = Literal["csv", "parquet", "delta", "pl94_legacy"]
assert get_args(TopDownInputFormat) == (*INPUT_FORMATS, PL94_LEGACY)
TopDownInputLayout = Literal["block_counts", "microdata", "pl94_legacy"]
"""An input's layout: a table's, or the legacy files' own."""
assert get_args(TopDownInputLayout) == (*INPUT_LAYOUTS, PL94_LEGACY)
EstimationMethod = Literal["topdown", "full_information"]
"""``topdown``: each level fitted to its own measurements under its parent (the Census method);
``full_information``: each child fitted to its bottom-up BLUE from its own and all its
descendants' measurements, weighted by that estimate's precision."""
ESTIMATION_METHODS: tuple[str, ...] = get_args(EstimationMethod)
EstimationPass = Literal["total", "all"]
"""``total``: each child's total fitted first, under the constraints, then held exactly;
``all``: every query (the last pass). See ``_passes``."""
ESTIMATION_PASSES: tuple[str, ...] = get_args(EstimationPass)
ONE_PASS: tuple[EstimationPass, ...] = ("all",)
TOTAL_FIRST: tuple[EstimationPass, ...] = ("total", "all")


_TERM = re.compile(r"([+-]?)\s*([A-Za-z_][A-Za-z0-9_]*)")
_EXPRESSION = re.compile(r"\s*[+-]?\s*[A-Za-z_]\w*(\s*[+-]\s*[A-Za-z_]\w*)*\s*", re.ASCII)


@dataclass(frozen=True)
class CellColumn:
    """A histogram cell read from count columns: sum of ``plus`` minus sum of ``minus``."""

    cell: int
    plus: tuple[str, ...]
    minus: tuple[str, ...]
    expr: str


@dataclass(frozen=True)
class AttributeColumn:
    """A microdata column holding one attribute; ``value_map`` maps raw values to levels."""

    attribute: str
    column: str
    value_map: Mapping[str, str]


@dataclass(frozen=True)
class LegacyInput:
    """``format = "pl94_legacy"``: the state's files in ``InputSpec.path`` (``io.pl94_layout.
    LegacyFiles``), the derived histogram ``table`` read (``io.pl94_layout.TABLES``), and the
    summary levels whose records are checked against the sums of their blocks."""

    state: str
    vintage: str
    table: str
    summary_levels: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    path: Path
    format: TopDownInputFormat
    layout: TopDownInputLayout
    geocode_columns: tuple[str, ...]  # concatenated, in order, into the leaf geocode
    cells: tuple[CellColumn, ...] = ()  # block_counts, pl94_legacy (over the table cells)
    attributes: tuple[AttributeColumn, ...] = ()  # microdata
    ignore: tuple[str, ...] = ()  # columns present in the file but deliberately unused
    total: str | None = None  # block_counts: a column every row's mapped cells must sum to
    legacy: LegacyInput | None = None  # pl94_legacy

    def legacy_files(self) -> LegacyFiles:
        assert self.legacy is not None
        return LegacyFiles(self.path, self.legacy.state, self.legacy.vintage)

    def files(self) -> tuple[Path, ...]:
        """The files the input is read from (the run's input fingerprint covers them)."""
        return self.legacy_files().paths if self.legacy else (self.path,)

    def used_columns(self) -> tuple[str, ...]:
        cols = list(self.geocode_columns)
        for c in self.cells:
            cols += [*c.plus, *c.minus]
        cols += [a.column for a in self.attributes] + ([self.total] if self.total else [])
        return tuple(dict.fromkeys(cols))


@dataclass(frozen=True, kw_only=True)
class OccupancyGroup:
    """``[[estimation.occupancy]]``: the schema ``cells`` whose persons live in dwellings of
    one kind (housing units, or the group quarters of one type), which a block may hold only
    where ``plus - minus`` (a block's counts of those dwellings: cells of the legacy files'
    tables, or columns of ``[estimation] dwellings``) is positive. A node above the blocks may
    hold them where one of its blocks may."""

    cells: tuple[int, ...]
    plus: tuple[str, ...]
    minus: tuple[str, ...]
    where: str
    at_least: BoundExpression | None = None
    """Every node's persons of the group are at least this (a sum over its blocks): the
    2020 production's lower bound, one person per occupied facility."""
    at_most: BoundExpression | None = None
    """And at most this: the caps (99 persons a housing unit, 99,999 a facility)."""


@dataclass(frozen=True)
class BoundExpression:
    """``[[estimation.occupancy]]`` ``at_least`` / ``at_most``: a block's bound on the group's
    persons, ``sum coefficient * value``, where a term's value is a column of the block's
    dwelling counts, or with ``indicator`` 1 where that column is positive and 0 elsewhere
    (``(COLUMN > 0)``: with the legacy files, whose "occupied facility of a type" is a
    positive population of that type)."""

    terms: tuple[tuple[int, str, bool], ...]  # (coefficient, column, indicator)
    text: str

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(column for _, column, _ in self.terms))


@dataclass(frozen=True)
class CensusVariable:
    """A variable of the P.L. 94-171 tables (``topdown.pl94_tables.VARIABLES``) held by a schema
    attribute: each code's level, one level per code and one code per level."""

    name: str
    attribute: str
    level_of: Mapping[str, str]


@dataclass(frozen=True)
class Pl94TablesSpec:
    """``[output.pl94_tables]``: the tables released in the Census's shape (``topdown.pl94_tables.
    CENSUS_TABLES``) and the variables they are computed over."""

    tables: tuple[str, ...]
    variables: tuple[CensusVariable, ...]


@dataclass(frozen=True, kw_only=True)
class TopDownConfig:
    source: str
    run: RunOptions
    schema: Schema
    hierarchy: Hierarchy
    budget: ZcdpAllocation
    queries: Mapping[str, tuple[MarginalQuery, ...]]  # per level, in budget order
    invariant_levels: tuple[str, ...]  # node totals held exact at these levels and above
    structural_zero_cells: tuple[int, ...]
    input: InputSpec | None
    spine: SpineSpec | None = None
    estimation_method: EstimationMethod = "topdown"
    method_fallback: str = ""  # why a requested "full_information" runs as "topdown", if it does
    document: Document = field(default_factory=Document, compare=False, repr=False)
    bypass_single_child: bool = False  # [budget] (BYPASS_DESCRIPTION)
    estimation_passes: Mapping[str, tuple[EstimationPass, ...]] = field(default_factory=dict)
    """Per level, its estimation passes; a level not listed is one pass (``passes_at``)."""
    pl94_tables: Pl94TablesSpec | None = None  # [output.pl94_tables]
    occupancy: tuple[OccupancyGroup, ...] = ()  # [[estimation.occupancy]]
    dwellings: SpineSpec | None = None
    """``[estimation] dwellings``: the block table of dwelling counts the occupancy groups'
    expressions read when the input is not the legacy files (one row per block)."""

    def passes_at(self, level: str) -> tuple[EstimationPass, ...]:
        """The estimation passes of ``level``: ``("all",)`` or ``("total", "all")``."""
        return self.estimation_passes.get(level, ONE_PASS)

    def query(self, level: str, name: str) -> MarginalQuery:
        for q in self.queries[level]:
            if q.name == name:
                return q
        raise KeyError(name)


def invariant_levels(config: TopDownConfig) -> list[str]:
    """Levels whose node totals are held exact: each configured level and every level above."""
    if not config.invariant_levels:
        return []
    deepest = max(config.hierarchy.index(lv) for lv in config.invariant_levels)
    return list(config.hierarchy.names[: deepest + 1])


def _level_range(value: Any) -> Any:
    """``{ from, to, width }``: the levels ``from``..``to``, zero-padded to ``width`` digits."""
    if not isinstance(value, Mapping):
        return value
    check_keys(value, {"from", "to", "width"}, {"from", "to"})
    bounds = (value["from"], value["to"], value.get("width", 0))
    if any(isinstance(b, bool) or not isinstance(b, int) for b in bounds):
        raise ValueError(f"from, to and width must be integers, got {list(bounds)}")
    return [f"{i:0{bounds[2]}d}" for i in range(bounds[0], bounds[1] + 1)]


class AttributeModel(Model):
    name: Name = Field(
        description="The attribute's name: a query name and the column it is released in."
    )
    levels: Annotated[
        list[Name],
        BeforeValidator(_level_range, json_schema_input_type=list[str] | dict[str, int]),
        Field(min_length=1),
    ] = Field(
        description="The attribute's levels (labels), in order; or { from, to, width }: the integers from..to, zero-padded to width digits."
    )


class RecodeModel(Model):
    attribute: Name = Field(description="The attribute whose levels it groups.")
    groups: dict[str, list[str]] = Field(
        description="Group name -> the attribute's levels in that group; every level in exactly one group."
    )


class SchemaModel(Model):
    attributes: Annotated[list[AttributeModel], Field(min_length=1)] = Field(
        description="The histogram's attributes: a cell is one level of each, numbered row-major (the last attribute varies fastest)."
    )
    recodes: dict[str, RecodeModel] = Field(
        {},
        description="Named groupings of one attribute's levels ([schema.recodes.<name>]), usable in queries like an attribute.",
    )


QUERY_NAMES = 'A query is "total", "detailed" (every cell), an attribute or recode, or a product such as "votingage * hisprace".'
BYPASS_DESCRIPTION = "Census bypassing: a parent with exactly one child is not measured; its rho moves to the child (down a chain of single-child parents), whose released value it shares. Which nodes are bypassed depends on the spine alone."
"""Census "bypassing" (spine paper, Algorithm 3 under zCDP): a parent with exactly one child
in the geography is not measured; its share of rho moves to the child (down a chain of
single-child parents to its lowest node, measured with its own level's queries at the
chain's summed rho, ``ZcdpAllocation.node_budget``), and its released value is that node's.
Which nodes are bypassed depends on the spine alone. Default off."""
LEVELS_DESCRIPTION = (
    "One table per geography level, [budget.levels.<level>]: its share and its queries."
)
BudgetMode = Literal["shares", "per_query_rho"]
BUDGET_MODES: tuple[str, ...] = get_args(BudgetMode)


class SharedLevelBudgetModel(Model):
    share: Exact = Field(
        description="This level's share of rho, an exact fraction; the levels' shares sum to 1."
    )
    queries: dict[str, Budget] = Field(
        description=f"Query -> its share of the level's rho (the shares sum to 1). {QUERY_NAMES}"
    )


class QueryRhoLevelBudgetModel(Model):
    queries: dict[str, Budget] = Field(description=f"Query -> its rho. {QUERY_NAMES}")


class SharesBudgetModel(Model):
    """``mode = "shares"``: ``rho`` split by each level's share, then by its queries' shares."""

    model_config = ConfigDict(title='mode = "shares"')

    @model_validator(mode="before")
    @classmethod
    def _rho(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "rho" not in data:
            raise ValueError("missing required key 'rho' (mode = 'shares')")
        return data

    rho: Budget = Field(
        description='The total rho (zCDP), an exact fraction such as "293764/114921".'
    )
    mode: Literal["shares"] = Field(
        "shares",
        description='"shares": rho split by each level\'s share, then by its queries\' shares; else "per_query_rho".',
    )
    bypass_single_child: bool = Field(False, description=BYPASS_DESCRIPTION)
    levels: dict[str, SharedLevelBudgetModel] = Field(description=LEVELS_DESCRIPTION)


class QueryRhoBudgetModel(Model):
    """``mode = "per_query_rho"``: each query's rho given, the total their sum."""

    model_config = ConfigDict(title='mode = "per_query_rho"')
    rho: Annotated[
        SkipJsonSchema[None],
        refused("not used with mode = 'per_query_rho' (the total is the sum)"),
    ] = None
    mode: Literal["per_query_rho"] = Field(
        description='"per_query_rho": each query\'s rho given, the total their sum (no rho, no shares).'
    )
    bypass_single_child: bool = Field(False, description=BYPASS_DESCRIPTION)
    levels: dict[str, QueryRhoLevelBudgetModel] = Field(description=LEVELS_DESCRIPTION)


def _budget_variant(data: Any) -> str:
    return f"mode = '{data.get('mode', 'shares') if isinstance(data, Mapping) else 'shares'}'"


BudgetModel = Annotated[
    Annotated[SharesBudgetModel, variant("mode = 'shares'")]
    | Annotated[QueryRhoBudgetModel, variant("mode = 'per_query_rho'")],
    Discriminator(_budget_variant),
    choice_of("mode", "shares", BUDGET_MODES),
]
"""``[budget]``: its variant told by ``mode``."""


class AttributeColumnModel(Model):
    column: Name = Field(description="The input column holding the attribute's value.")
    map: dict[str, Name] | None = Field(
        None, description="Raw value -> level. Default: the raw values are the level labels."
    )


LegacyOnly = Annotated[SkipJsonSchema[None], refused(f"only for format = '{PL94_LEGACY}'")]
BlockCountsOnly = Annotated[SkipJsonSchema[None], refused("only for layout = 'block_counts'")]
MicrodataOnly = Annotated[SkipJsonSchema[None], refused("only for layout = 'microdata'")]
FixedByLegacyLayout = Annotated[
    SkipJsonSchema[None], refused(f"not used with format = '{PL94_LEGACY}' (fixed by the layout)")
]
Pl94Table = Literal["persons", "group_quarters", "units"]
assert get_args(Pl94Table) == tuple(TABLES)


def _usps_code(value: str) -> str:
    if not re.fullmatch(r"[a-z]{2}", value):
        raise ValueError(f"{value!r} must be a lower-case USPS code, as in the file names ('ri')")
    return value


def _summary_levels(value: list[str]) -> list[str]:
    if bad := [level for level in value if level not in SUMMARY_LEVELS]:
        raise ValueError(f"{bad} are not among {tuple(SUMMARY_LEVELS)}")
    if len(set(value)) != len(value):
        raise ValueError(f"levels must be distinct, got {value}")
    return value


def _non_empty_cells(value: Any) -> Any:
    if not value:  # absent (None) or an empty list
        raise ValueError("must be a non-empty list of {<attribute> = <level>, expr = ...}")
    return value


class TableInputModel(Model):
    """The keys of an input table (``format`` csv, parquet or delta), either layout."""

    path: PathText = Field(
        description="The input file or folder, relative to the current directory."
    )
    format: InputFormat = Field(
        "csv", description='csv, parquet or delta (else "pl94_legacy", the Census\'s files).'
    )
    geocode: Columns = Field(
        description="The block geocode column, or columns concatenated in order."
    )
    ignore: list[Name] = Field(
        [],
        description="Columns present in the input but deliberately unused; any other unused column is an error.",
    )
    state: LegacyOnly = None
    vintage: LegacyOnly = None
    table: LegacyOnly = None
    summary_levels: LegacyOnly = None


class BlockCountsInputModel(TableInputModel):
    """``layout = "block_counts"``: one row per block, count columns mapped to cells."""

    model_config = ConfigDict(title='layout = "block_counts"')
    layout: Literal["block_counts"] = Field(
        description="block_counts: one row per block, count columns mapped to cells by input.cells."
    )
    cells: Annotated[
        list[dict[str, Name]],
        BeforeValidator(_non_empty_cells, json_schema_input_type=list[dict[str, str]]),
    ] = Field(
        None,
        validate_default=True,
        description='Required: one entry per cell not structurally zero, { <attribute> = "<level>", ..., expr = "<columns added and subtracted>" }, e.g. expr = "pop_white - vap_white".',
    )
    total: Name | None = Field(
        None, description="A column every row's mapped cells must sum to (checked on reading)."
    )
    attributes: MicrodataOnly = None


class MicrodataInputModel(TableInputModel):
    """``layout = "microdata"``: one row per person, its attributes read from columns."""

    model_config = ConfigDict(title='layout = "microdata"')
    layout: Literal["microdata"] = Field(
        description="microdata: one row per person, attributes read by input.attributes (needs [geography] spine)."
    )
    attributes: dict[str, AttributeColumnModel] = Field(
        {},
        description="Each schema attribute's input column and value map, [input.attributes.<attribute>].",
    )
    cells: BlockCountsOnly = None
    total: BlockCountsOnly = None


class LegacyInputModel(Model):
    """``format = "pl94_legacy"``: a state's P.L. 94-171 files as the Census publishes them."""

    model_config = ConfigDict(title='format = "pl94_legacy"')
    required_by: ClassVar[str] = f" (format = '{PL94_LEGACY}')"
    path: PathText = Field(
        description="The folder of the state's files, relative to the current directory."
    )
    format: Literal["pl94_legacy"] = Field(
        description="pl94_legacy: a state's P.L. 94-171 files as the Census publishes them."
    )
    attributes: dict[str, AttributeColumnModel] = Field(
        {},
        description="Each schema attribute's variable of the table (column) and code -> level map, [input.attributes.<attribute>].",
    )
    state: Annotated[str, AfterValidator(_usps_code)] = Field(
        description="The state's lower-case USPS code, as in the files' names (\"ri\")."
    )
    vintage: Name = Field("2020", description="The files' name suffix (rigeo<vintage>.pl).")
    table: Pl94Table = Field(
        description="The table derived from the files: persons, group_quarters or units."
    )
    summary_levels: Annotated[list[Name], AfterValidator(_summary_levels)] = Field(
        list(SUMMARY_LEVELS),
        description="The summary levels whose records are checked against the sums of their blocks. Default: all four.",
    )
    layout: FixedByLegacyLayout = None
    geocode: FixedByLegacyLayout = None
    cells: FixedByLegacyLayout = None
    ignore: FixedByLegacyLayout = None
    total: FixedByLegacyLayout = None


def _input_variant(data: Any) -> str:
    """The tag of the input's variant: its format, or else its layout (block counts when
    absent, whose model then refuses the missing key)."""
    if not isinstance(data, Mapping):
        return "layout = 'block_counts'"
    if data.get("format") == PL94_LEGACY:
        return f"format = '{PL94_LEGACY}'"
    return f"layout = '{data.get('layout', 'block_counts')}'"


def _input_layout(data: Any) -> Any:
    """An input table's ``layout`` checked before its variant is chosen (when absent, the
    block counts' model refuses the missing key)."""
    if isinstance(data, Mapping) and data.get("format") != PL94_LEGACY and "layout" in data:
        check_choice(data, "layout", "", INPUT_LAYOUTS)
    return data


InputModel = Annotated[
    Annotated[BlockCountsInputModel, variant("layout = 'block_counts'")]
    | Annotated[MicrodataInputModel, variant("layout = 'microdata'")]
    | Annotated[LegacyInputModel, variant(f"format = '{PL94_LEGACY}'")],
    Discriminator(_input_variant),
    BeforeValidator(_input_layout),
    choice_of("format", "csv", get_args(TopDownInputFormat)),
]
"""``[input]``: its variant told by ``format``, and for an input table by ``layout``."""


class OccupancyModel(Model):
    where: str = Field(
        description="An expression over a block's input columns (as input.cells' expr), e.g. \"H0010001 + P0050001\": the group may hold persons in a block only where it is positive."
    )
    cells: dict[str, list[str]] = Field(
        {},
        description="The group's cells, { <attribute> = [levels] } as in structural_zeros. Default: every cell.",
    )
    at_least: str | None = Field(
        None,
        description="A block's lower bound on the group's persons: a sum of integer multiples of input or dwellings columns or of \"(COLUMN > 0)\" indicators.",
    )
    at_most: str | None = Field(
        None, description="A block's cap on the group's persons, in the same form as at_least."
    )


class EstimationModel(Model):
    invariants: list[Name] = Field(
        [],
        description='Levels whose node totals are released exact (invariant), and so every level above, e.g. ["state"].',
    )
    structural_zeros: list[dict[str, list[str]]] = Field(
        [],
        description="Cells zero by definition, released as 0 and not read from the input: each entry { <attribute> = [levels], ... } names the cells matching all of its attributes.",
    )
    occupancy: list[OccupancyModel] = Field(
        [],
        description="Where persons may live: [[estimation.occupancy]] groups of cells, each held at 0 in a block where its expression is not positive, within optional bounds.",
    )
    dwellings: SpineModel | None = Field(
        None,
        description="A block table (path, format, geocode, as the spine) whose columns the occupancy bounds may read.",
    )
    method: EstimationMethod = Field(
        "topdown",
        description="topdown: the Census's estimation, each family fitted to its own noisy answers; full_information: each node first estimated from its own and all its descendants' measurements, then fitted top-down.",
    )
    passes: list[str] | dict[str, list[str]] = Field(
        list[str](ONE_PASS),
        description='The estimation passes: ["all"] (one) or ["total", "all"] (the 2020 production\'s two: totals first); a table gives them per level, e.g. { county = ["total", "all"] }.',
    )
    fallback: Literal["topdown"] | None = Field(
        None,
        description="\"topdown\": run TopDown's estimation when full_information cannot hold the config's queries or zeros (the manifest says so); unset: such a config is refused.",
    )

    @field_validator("method", mode="before")
    @classmethod
    def _method(cls, value: Any) -> Any:
        if value not in ESTIMATION_METHODS:
            raise ValueError(f"{value!r} must be one of {list(ESTIMATION_METHODS)}")
        return value

    @field_validator("passes", mode="before")
    @classmethod
    def _passes_shape(cls, value: Any) -> Any:
        def is_list(v: Any) -> bool:
            return isinstance(v, list) and all(isinstance(name, str) for name in v)

        if is_list(value) or (
            isinstance(value, Mapping)
            and all(isinstance(k, str) and is_list(v) for k, v in value.items())
        ):
            return value
        raise ValueError(
            f"must be a list of pass names or a table of them per level, got {value!r}"
        )


class CensusVariableModel(Model):
    attribute: Name = Field(description="The schema attribute that gives this census variable.")
    map: dict[str, Name] | None = Field(
        None, description="Census code -> the attribute's level. Default: the codes are the levels."
    )


class Pl94TablesModel(Model):
    tables: Annotated[list[Name], Field(min_length=1)] = Field(
        description="The P.L. 94-171 tables to write from the released counts: P1, P2, P3, P4, P5, H1."
    )
    variables: dict[str, CensusVariableModel] | None = Field(
        None,
        description='Census variable -> the schema attribute giving it, [output.pl94_tables.variables.<variable>]. Not with format = "pl94_legacy", whose variables are known.',
    )


class OutputModel(Model):
    pl94_tables: Pl94TablesModel | None = Field(
        None,
        description="Also write the released counts as P.L. 94-171 tables: the Delta table pl94_tables and a CSV per level.",
    )


class TopDownModel(Model):
    run: RunModel = Field(RunModel(), description="The run: its name, folders, secret and delta.")
    schema_: SchemaModel = Field(
        alias="schema", description="The histogram: attributes and recodes."
    )
    geography: GeographyModel = Field(description="The hierarchy's levels and the spine.")
    budget: BudgetModel = Field(description="rho and its split over levels and queries.")
    input: InputModel | None = Field(
        None,
        description="The confidential input. Without it the config can only be checked and budgeted.",
    )
    estimation: EstimationModel = Field(
        EstimationModel(),
        description="How the noisy measurements become consistent integer counts.",
    )
    output: OutputModel = Field(OutputModel(), description="Extra tables to write.")


def _schema(fail: Fail, model: SchemaModel) -> Schema:
    for i, a in enumerate(model.attributes):
        if len(set(a.levels)) != len(a.levels):
            raise fail(f"schema.attributes[{i}].levels", f"levels must be distinct, got {a.levels}")
    attrs = [Attribute(a.name, tuple(a.levels)) for a in model.attributes]
    names = [a.name for a in attrs]
    if len(set(names)) != len(names):
        raise fail("schema.attributes", f"attribute names must be unique: {names}")
    recodes = []
    for name, spec in model.recodes.items():
        key = f"schema.recodes.{name}"
        if spec.attribute not in names:
            raise fail(f"{key}.attribute", f"unknown attribute {spec.attribute!r}")
        attr = attrs[names.index(spec.attribute)]
        group_of = [-1] * attr.size
        for g, (group, members) in enumerate(spec.groups.items()):
            for m in members:
                if m not in attr.levels:
                    raise fail(f"{key}.groups.{group}", f"{m!r} is not a level of {attr.name}")
                if group_of[attr.index_of(m)] != -1:
                    raise fail(f"{key}.groups.{group}", f"level {m!r} is in two groups")
                group_of[attr.index_of(m)] = g
        if -1 in group_of:
            missing = [lv for lv, g in zip(attr.levels, group_of, strict=True) if g == -1]
            raise fail(f"{key}.groups", f"levels {missing} are in no group")
        if name in names:
            raise fail(key, "a recode cannot have an attribute's name")
        recodes.append(Recode(name, attr.name, tuple(spec.groups), tuple(group_of)))
    return Schema(tuple(attrs), tuple(recodes))


def _budget(fail: Fail, model: BudgetModel, hierarchy: Hierarchy) -> ZcdpAllocation:
    if unknown := sorted(set(model.levels) - set(hierarchy.names)):
        raise fail(
            "budget.levels", f"unknown level(s) {unknown}; levels are {list(hierarchy.names)}"
        )
    queries = {name: level.queries for name, level in model.levels.items()}
    try:
        if isinstance(model, QueryRhoBudgetModel):
            allocation = allocate_per_query_rho(queries, hierarchy.names)
        else:
            level_shares = {name: level.share for name, level in model.levels.items()}
            allocation = allocate_by_shares(model.rho, level_shares, queries, hierarchy.names)
    except BudgetError as err:
        raise fail("budget", str(err)) from None
    for e in allocation.entries:
        budget_in_range(fail, f"budget.levels.{e.level}.queries.{e.query}", e.rho)
    if model.bypass_single_child:
        try:
            bypass_paths(allocation)  # every path cut spends the total exactly
        except BudgetError as err:
            raise fail("budget.bypass_single_child", str(err)) from None
    return allocation


def _expression(fail: Fail, key: str, expr: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``a + b - c`` as the columns added and the columns subtracted."""
    if not _EXPRESSION.fullmatch(expr):
        raise fail(key, f"{expr!r} must be column names joined by + and -")
    terms = _TERM.findall(expr)
    return tuple(c for sign, c in terms if sign != "-"), tuple(
        c for sign, c in terms if sign == "-"
    )


def _cells(
    fail: Fail, cells: list[dict[str, str]], schema: Schema, zeros: tuple[int, ...]
) -> tuple[CellColumn, ...]:
    """The mapped cells; every cell of the schema is mapped or a structural zero, so none of
    the input's people silently become 0."""
    keys = {*schema.names, "expr"}
    out: dict[int, CellColumn] = {}
    for i, c in enumerate(cells):
        key = f"input.cells[{i}]"
        check_keys(c, keys, keys, partial(fail, key))
        for attr in schema.attributes:
            if c[attr.name] not in attr.levels:
                rule = f"{c[attr.name]!r} is not a level of {attr.name} {list(attr.levels)}"
                raise fail(f"{key}.{attr.name}", rule)
        cell = int(
            schema.cell_of(np.array([[a.index_of(c[a.name]) for a in schema.attributes]]))[0]
        )
        if cell in out:
            raise fail(key, "this cell is given twice")
        out[cell] = CellColumn(cell, *_expression(fail, f"{key}.expr", c["expr"]), c["expr"])
    if unmapped := sorted(set(range(schema.n_cells)) - set(out) - set(zeros)):
        named = [_cell_text(schema, levels) for levels in schema.levels_of(np.array(unmapped))]
        listed = ", ".join(named[:MAX_CELLS_NAMED])
        if len(named) > MAX_CELLS_NAMED:
            listed += f" and {len(named) - MAX_CELLS_NAMED} more"
        which = f"cell {listed} is" if len(named) == 1 else f"cells {listed} are"
        raise fail(
            "input.cells",
            f"{which} neither mapped nor in [estimation] structural_zeros"
            f" ({len(unmapped)} cell(s) left out): map every cell, or declare it structurally zero",
        )
    return tuple(out[c] for c in sorted(out))


MAX_CELLS_NAMED = 20
"""The unmapped cells one refusal spells out; the rest are counted (a schema of thousands of
cells left wholly unmapped would otherwise fill a screen)."""


def _cell_text(schema: Schema, levels: np.ndarray) -> str:
    """A cell as the config writes it: ``{votingage = '18plus', hisprace = 'nhpi'}``."""
    pairs = zip(schema.attributes, levels, strict=True)
    return "{" + ", ".join(f"{a.name} = {a.levels[i]!r}" for a, i in pairs) + "}"


def _input(
    fail: Fail, model: InputModel, schema: Schema, zeros: tuple[int, ...], base: Path
) -> InputSpec:
    if isinstance(model, LegacyInputModel):
        return _legacy_input(fail, model, schema, base)
    path, geocode, ignore = resolve(base, model.path), tuple(model.geocode), tuple(model.ignore)
    if isinstance(model, BlockCountsInputModel):
        return InputSpec(
            path=path,
            format=model.format,
            layout=model.layout,
            geocode_columns=geocode,
            cells=_cells(fail, model.cells, schema, zeros),
            ignore=ignore,
            total=model.total,
        )
    check_keys(
        model.attributes, {*schema.names}, {*schema.names}, partial(fail, "input.attributes")
    )
    columns = []
    for attr in schema.attributes:
        value_map = model.attributes[attr.name].map or {lv: lv for lv in attr.levels}
        if bad := [v for v in value_map.values() if v not in attr.levels]:
            rule = f"maps to {bad}, which are not levels of {attr.name}"
            raise fail(f"input.attributes.{attr.name}.map", rule)
        columns.append(AttributeColumn(attr.name, model.attributes[attr.name].column, value_map))
    return InputSpec(
        path=path,
        format=model.format,
        layout=model.layout,
        geocode_columns=geocode,
        attributes=tuple(columns),
        ignore=ignore,
    )


def _legacy_input(fail: Fail, model: LegacyInputModel, schema: Schema, base: Path) -> InputSpec:
    """``format = "pl94_legacy"``: every schema attribute maps one variable of the derived
    ``table`` (every code to a level, so no one is left out), and each schema cell becomes the
    sum of the derived cells mapped to it, an expression over the table cells."""
    table = TABLES[model.table]
    attrs = model.attributes
    check_keys(attrs, {*schema.names}, {*schema.names}, partial(fail, "input.attributes"))
    variable_of: dict[str, str] = {}  # attribute -> variable
    level_of: dict[str, dict[str, str]] = {}  # variable -> code -> level
    for attr in schema.attributes:
        key, column = f"input.attributes.{attr.name}", attrs[attr.name].column
        if column not in table.variables:
            rule = f"{column!r} is not a variable of table {table.name!r} {list(table.variables)}"
            raise fail(f"{key}.column", rule)
        if column in level_of:
            raise fail(f"{key}.column", f"{column!r} is mapped twice")
        codes = table.variables[column]
        value_map = attrs[attr.name].map or {lv: lv for lv in attr.levels}
        problems = []
        if unknown := [c for c in value_map if c not in codes]:
            problems.append(f"{unknown} are not codes of {column} {list(codes)[:8]}...")
        if unmapped := [c for c in codes if c not in value_map]:
            problems.append(
                f"codes {unmapped} of {column} are not mapped (every one must be: else its"
                " people would be left out)"
            )
        if bad := sorted({v for v in value_map.values() if v not in attr.levels}):
            problems.append(f"maps to {bad}, which are not levels of {attr.name}")
        if problems:
            raise fail(f"{key}.map", "; ".join(problems))
        variable_of[attr.name], level_of[column] = column, value_map
    if unused := [v for v in table.variables if v not in level_of]:
        raise fail(
            "input.attributes",
            f"variable(s) {unused} of table {table.name!r} are mapped to no attribute (map each"
            " with [input.attributes.<attribute>] column = ...)",
        )
    plus: dict[int, list[str]] = {}
    minus: dict[int, list[str]] = {}
    for cell in table.cells:
        index = [
            attr.index_of(level_of[variable_of[attr.name]][cell.codes[variable_of[attr.name]]])
            for attr in schema.attributes
        ]
        c = int(schema.cell_of(np.array([index]))[0])
        plus.setdefault(c, []).extend(cell.plus)
        minus.setdefault(c, []).extend(cell.minus)
    cells = tuple(
        CellColumn(c, tuple(plus[c]), tuple(minus[c]), " - ".join([" + ".join(plus[c]), *minus[c]]))
        for c in sorted(plus)
    )
    legacy = LegacyInput(model.state, model.vintage, table.name, tuple(model.summary_levels))
    return InputSpec(
        path=resolve(base, model.path),
        format=PL94_LEGACY,
        layout=PL94_LEGACY,
        geocode_columns=("GEOCODE",),
        cells=cells,
        legacy=legacy,
    )


PL94_TABLES_KEY = "output.pl94_tables"


@dataclass(frozen=True)
class GivenVariable:
    """A Census variable as a config maps it: the config ``key``, its attribute and its map."""

    key: str
    attribute: str
    value_map: Mapping[str, str] | None


def _pl94_tables(
    fail: Fail, model: Pl94TablesModel, schema: Schema, legacy: LegacyInputModel | None
) -> Pl94TablesSpec:
    """The tables asked for, each of whose variables the schema must hold one code per level:
    with ``legacy`` input (``format = "pl94_legacy"``) as its ``[input.attributes]`` maps them,
    else as ``[output.pl94_tables.variables.<VARIABLE>]`` does."""
    key = PL94_TABLES_KEY
    if bad := [t for t in model.tables if t not in CENSUS_TABLES]:
        raise fail(f"{key}.tables", f"{bad} are not among {list(CENSUS_TABLES)}")
    if len(set(model.tables)) != len(model.tables):
        raise fail(f"{key}.tables", f"tables must be distinct, got {model.tables}")
    given = _given_variables(fail, model, schema, legacy)
    for table in model.tables:
        if missing := [v for v in CENSUS_TABLES[table].variables if v not in given]:
            where = (
                f"[input] table = '{legacy.table}' has only {list(given)}"
                if legacy is not None
                else f"map each in [{key}.variables.<VARIABLE>]"
            )
            raise fail(
                f"{key}.tables",
                f"{table} needs {missing}, which the schema does not hold ({where})",
            )
    needed = [v for v in VARIABLES if any(v in CENSUS_TABLES[t].variables for t in model.tables)]
    variables = tuple(_census_variable(fail, v, given[v], schema) for v in needed)
    return Pl94TablesSpec(tuple(model.tables), variables)


def _given_variables(
    fail: Fail, model: Pl94TablesModel, schema: Schema, legacy: LegacyInputModel | None
) -> dict[str, GivenVariable]:
    """Variable -> where it is mapped, its attribute and its map, from ``[input.attributes]``
    (legacy files) or ``[output.pl94_tables.variables]``."""
    key = PL94_TABLES_KEY
    if legacy is not None:
        if model.variables is not None:
            raise fail(
                f"{key}.variables",
                f"not used with [input] format = '{PL94_LEGACY}' (the variables are those of"
                " [input.attributes])",
            )
        return {
            a.column: GivenVariable(f"input.attributes.{n}", n, a.map)
            for n, a in legacy.attributes.items()
        }
    if model.variables is None:
        raise fail(
            key,
            f"missing required key(s) ['variables'] (the schema attribute and code -> level map"
            f" of each Census variable of the tables, one of {list(VARIABLES)})",
        )
    if unknown := [v for v in model.variables if v not in VARIABLES]:
        raise fail(f"{key}.variables", f"{unknown} are not among {list(VARIABLES)}")
    given: dict[str, GivenVariable] = {}
    for name, v in model.variables.items():
        if v.attribute not in schema.names:
            rule = f"{v.attribute!r} is not an attribute of the schema {list(schema.names)}"
            raise fail(f"{key}.variables.{name}.attribute", rule)
        if twice := [w for w, g in given.items() if g.attribute == v.attribute]:
            rule = f"{v.attribute!r} already holds {twice[0]}"
            raise fail(f"{key}.variables.{name}.attribute", rule)
        given[name] = GivenVariable(f"{key}.variables.{name}", v.attribute, v.map)
    return given


def _census_variable(fail: Fail, name: str, given: GivenVariable, schema: Schema) -> CensusVariable:
    """A variable whose every code is one level of its attribute and every level one code: else
    a table field would sum levels it cannot tell apart, or miss a level's records."""
    levels, codes = schema.attribute(given.attribute).levels, VARIABLES[name]
    level_of = dict(given.value_map or {lv: lv for lv in levels})
    if sorted(level_of) != sorted(codes) or sorted(level_of.values()) != sorted(levels):
        raise fail(
            f"{given.key}.map",
            f"the P.L. 94-171 tables need each code of {name} {list(codes)[:8]} mapped to its"
            f" own level of {given.attribute}, every level once",
        )
    return CensusVariable(name, given.attribute, level_of)


def _check_method(fail: Fail, method: EstimationMethod, hierarchy: Hierarchy,
                  queries: Mapping[str, tuple[MarginalQuery, ...]], zeros: tuple[int, ...],
                  schema: Schema) -> None:  # fmt: skip
    """``full_information`` needs the leaf level's queries to determine every cell that is not
    a structural zero (its leaves are estimated from their own measurements), and a covariance
    layout for the schema and every level's queries (``covariance_layout``)."""
    if method == "topdown":
        return
    leaf = hierarchy.leaf.name
    _check_leaf_queries(fail, leaf, queries[leaf], zeros, schema.n_cells)
    every = [q.cell_to_marginal for level in hierarchy.names for q in queries[level]]
    try:
        covariance_layout(schema.shape, schema.names, zeros, every)
    except ValueError as err:
        raise fail("estimation.method", str(err)) from None


def _check_leaf_queries(fail: Fail, leaf: str, queries: tuple[MarginalQuery, ...],
                        zeros: tuple[int, ...], n_cells: int) -> None:  # fmt: skip
    active = np.setdiff1d(np.arange(n_cells), zeros)
    if not _identify_every_cell([q.cell_to_marginal[active] for q in queries], active.size):
        raise fail(
            "estimation.method",
            f'"full_information" needs the leaf level\'s queries to determine every cell;'
            f" those of [budget.levels.{leaf}.queries] ({[q.name for q in queries]}) do"
            ' not: add "detailed" there',
        )


def _identify_every_cell(codes: list[np.ndarray], n_cells: int) -> bool:
    """Whether marginals (each cell's marginal cell, per query) determine all ``n_cells``
    cells: one of them puts every cell in a cell of its own (``detailed``, at once), or their
    stacked 0/1 matrix has full column rank, found on its ``n_cells`` square Gram matrix
    (entry ``i, j``: the queries where cells ``i`` and ``j`` share a marginal cell), whose
    rank is the stacked matrix's (the production schema's 1,890 active cells: a fraction of a
    second, where the stacked matrix's SVD took ten)."""
    if any(np.unique(code).size == n_cells for code in codes):
        return True
    gram = np.zeros((n_cells, n_cells))
    for code in codes:
        gram += code[:, None] == code[None, :]
    return int(np.linalg.matrix_rank(gram, hermitian=True)) == n_cells


def _passes(
    fail: Fail,
    passes: list[str] | dict[str, list[str]],
    method: EstimationMethod,
    queries: Mapping[str, tuple[MarginalQuery, ...]],
) -> dict[str, tuple[EstimationPass, ...]]:
    """The passes of every level: ``["all"]`` (one pass, the default) or ``["total", "all"]``
    (the Census's two passes: each child's total first, then every query with those totals
    held), for every level (a list) or per level (a table of lists; a level not in it is one
    pass, as the Census's strategies choose per level).

    With ``topdown`` a level must measure ``total`` to fit it first: a level of the table
    without it is refused, and the list form skips such levels (the Census's US level) but
    needs at least one level with it. A pass of another query is refused: a pass holds its
    answers exactly in the passes after it, and the solvers hold exact per-child sums for the
    total only."""
    names = {q.name for level in queries.values() for q in level}
    if isinstance(passes, list):
        chosen = _level_passes(fail, "estimation.passes", passes, names)
        with_total = {lv for lv, qs in queries.items() if TOTAL in {q.name for q in qs}}
        if "total" in chosen and method == "topdown" and not with_total:
            raise fail(
                "estimation.passes",
                '"total" fits each child\'s measured total first, but no level of'
                ' [budget.levels] has the query "total"',
            )
        fitted = with_total if method == "topdown" else set(queries)
        return {level: chosen if level in fitted else ONE_PASS for level in queries}
    out = {}
    for level, listed in passes.items():
        key = f"estimation.passes.{level}"
        if level not in queries:
            raise fail(key, f"unknown level {level!r}; levels are {list(queries)}")
        out[level] = _level_passes(fail, key, listed, names)
        measures_total = TOTAL in {q.name for q in queries[level]}
        if "total" in out[level] and method == "topdown" and not measures_total:
            raise fail(
                key,
                '"total" fits each child\'s measured total first, but'
                f' [budget.levels.{level}.queries] has no "total"',
            )
    return out


def _level_passes(
    fail: Fail, key: str, passes: list[str], names: set[str]
) -> tuple[EstimationPass, ...]:
    """One list of passes, checked: ``("all",)`` or ``("total", "all")``."""
    for name in passes:
        if name in ESTIMATION_PASSES:
            continue
        if name in names:
            raise fail(
                key,
                f"a pass of {name!r} is not supported: the passes are"
                f' "total" (each child\'s total first) and "all", e.g. {list(TOTAL_FIRST)}',
            )
        raise fail(
            key,
            f"{name!r} is not a pass; the passes are {list(ESTIMATION_PASSES)},"
            f" e.g. {list(TOTAL_FIRST)}",
        )
    if len(set(passes)) != len(passes):
        raise fail(key, f"a pass is given twice in {passes}")
    if not passes or passes[-1] != "all":
        raise fail(key, f'"all" must be the last pass, got {passes}')
    return ONE_PASS if passes == list(ONE_PASS) else TOTAL_FIRST


def _estimation(
    fail: Fail, model: EstimationModel, schema: Schema, hierarchy: Hierarchy
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    for lv in model.invariants:
        if lv not in hierarchy.names:
            raise fail("estimation.invariants", f"unknown level {lv!r}")
    zeros: set[int] = set()
    for i, z in enumerate(model.structural_zeros):
        key = f"estimation.structural_zeros[{i}]"
        zeros.update(int(c) for c in _cells_of(fail, key, z, schema))
    return tuple(model.invariants), tuple(sorted(zeros))


def _cells_of(fail: Fail, key: str, levels: Mapping[str, list[str]], schema: Schema) -> np.ndarray:
    """The cells matching ``{attribute: [level, ...]}`` (every cell for an empty mapping)."""
    check_keys(levels, set(schema.names), set(), partial(fail, key))
    for name, chosen in levels.items():
        if bad := [v for v in chosen if v not in schema.attribute(name).levels]:
            raise fail(f"{key}.{name}", f"{bad} are not levels of {name}")
    return schema.cells_matching({n: frozenset(v) for n, v in levels.items()})


def _occupancy(
    fail: Fail,
    groups: list[OccupancyModel],
    schema: Schema,
    spec: InputSpec | None,
    dwellings: SpineSpec | None,
) -> tuple[OccupancyGroup, ...]:
    """The occupancy groups: disjoint sets of cells, each with its expression over a block's
    dwelling counts: the legacy files' table cells (whose blocks carry housing-unit and
    group-quarters counts beside the persons; only the public ones, ``_check_public``), or else
    the columns of ``dwellings``, a table the config declares public."""
    if not groups:
        if dwellings is not None:
            raise fail("estimation.dwellings", "is read only by [[estimation.occupancy]] groups")
        return ()
    legacy = spec is not None and spec.legacy is not None
    if legacy and dwellings is not None:
        raise fail(
            "estimation.dwellings",
            f"format = '{PL94_LEGACY}' input carries its blocks' H1 and P5 counts: the"
            " occupancy expressions name those table cells",
        )
    if not legacy and dwellings is None:
        raise fail(
            "estimation.occupancy",
            "needs each block's dwelling counts: [estimation] dwellings = { path = ...,"
            f" geocode = ... }} (a block table), or format = '{PL94_LEGACY}' input",
        )
    out: list[OccupancyGroup] = []
    taken: set[int] = set()
    for i, group in enumerate(groups):
        key = f"estimation.occupancy[{i}]"
        cells = tuple(int(c) for c in _cells_of(fail, f"{key}.cells", group.cells, schema))
        if overlap := taken & set(cells):
            raise fail(f"{key}.cells", f"{len(overlap)} cell(s) are in an earlier group too")
        taken |= set(cells)
        plus, minus = _expression(fail, f"{key}.where", group.where)
        if legacy and (unknown := [c for c in (*plus, *minus) if c not in CELLS]):
            raise fail(f"{key}.where", f"{unknown} are not cells of the legacy files' tables")
        if legacy:  # only positivity is read: added facility populations say "occupied"
            _check_public(fail, f"{key}.where", [(c, True) for c in plus], "where")
            _check_public(fail, f"{key}.where", [(c, False) for c in minus], "where")
        bounds = {
            name: _bound_expression(fail, f"{key}.{name}", text, legacy)
            for name, text in (("at_least", group.at_least), ("at_most", group.at_most))
            if text is not None
        }
        out.append(OccupancyGroup(cells=cells, plus=plus, minus=minus, where=group.where, **bounds))
    return tuple(out)


_BOUND_TERM = re.compile(
    r"\s*([+-])?\s*(?:(\d+)\s*\*\s*)?(?:\(\s*([A-Za-z_]\w*)\s*>\s*0\s*\)|([A-Za-z_]\w*))\s*",
    re.ASCII,
)


MAX_BOUND_COEFFICIENT = 10**9
"""Largest coefficient of a bound term: its products with counts stay far inside int64."""


def _bound_expression(fail: Fail, key: str, text: str, legacy: bool) -> BoundExpression:
    """``at_least`` / ``at_most``: terms ``[+|-] [integer *] (COLUMN | (COLUMN > 0))``."""
    terms: list[tuple[int, str, bool]] = []
    position = 0
    while position < len(text):
        match = _BOUND_TERM.match(text, position)
        if match is None or match.end() == position or (terms and match.group(1) is None):
            raise fail(
                key,
                f"{text!r} must be terms joined by + and -, each COLUMN, (COLUMN > 0) or"
                " an integer times one (e.g. '99 * H0010001', '(P0050003 > 0)')",
            )
        sign = -1 if match.group(1) == "-" else 1
        coefficient = int(match.group(2)) if match.group(2) else 1
        if coefficient > MAX_BOUND_COEFFICIENT:
            raise fail(key, f"coefficient {coefficient} is above {MAX_BOUND_COEFFICIENT:,}")
        column = match.group(3) or match.group(4)
        terms.append((sign * coefficient, column, match.group(3) is not None))
        position = match.end()
    if not terms:
        raise fail(key, "must not be empty")
    bound = BoundExpression(tuple(terms), " ".join(text.split()))
    if legacy and (unknown := [c for c in bound.columns if c not in CELLS]):
        raise fail(key, f"{unknown} are not cells of the legacy files' tables")
    if legacy:
        _check_public(fail, key, [(c, indicator) for _, c, indicator in bound.terms], "a bound")
    return bound


PUBLIC_COUNTS = ("H0010001",)
"""Legacy-file cells public as counts: a block's housing units (a 2020 invariant)."""
FACILITY_CELLS = table_cells("P005", 10)
"""Legacy-file cells public only as ``(CELL > 0)``: persons of a group-quarters type, whose
positivity is an occupied facility (the files count no facilities; the 2020 invariants
include them)."""


def _check_public(fail: Fail, key: str, terms: list[tuple[str, bool]], what: str) -> None:
    """Refuse a term ``(column, positivity only)`` of the legacy files that is not public:
    ``where`` and the bounds are published without noise (a refusal names a bound's value)."""
    for column, indicator in terms:
        if column in PUBLIC_COUNTS or (indicator and column in FACILITY_CELLS):
            continue
        raise fail(
            key,
            f"{column} is not public: only housing units (H0010001) and occupied facilities"
            f" ((P0050003 > 0), ...: a type's persons, added only in where) may be named, since"
            f" {what} is published without noise",
        )


def load_topdown_config(
    config: Source | TopDownConfig, project_root: Path | None = None
) -> TopDownConfig:
    """Parse and validate a TopDown run config: a TOML file's path, a mapping shaped like the
    TOML, or a ``TopDownConfig`` (returned as is). Relative paths resolve against ``project_root``
    (default: the current directory). Raises ``ConfigError`` naming the file and key."""
    if isinstance(config, TopDownConfig):
        return config
    document, model = read_config(TopDownModel, config, project_root)
    fail, base = document.fail, document.base
    run = model.run.options(base, document.name)
    schema = _schema(fail, model.schema_)
    hierarchy = model.geography.hierarchy(fail)
    spine = model.geography.spine_spec(base)
    budget = _budget(fail, model.budget, hierarchy)
    queries = {}
    for level in hierarchy.names:
        try:
            queries[level] = tuple(parse_query(q, schema) for q in budget.queries_at(level))
        except ValueError as err:
            raise fail(f"budget.levels.{level}.queries", str(err)) from None
    invariants, zeros = _estimation(fail, model.estimation, schema, hierarchy)
    spec = _input(fail, model.input, schema, zeros, base) if model.input else None
    if spec is not None and spine is not None:
        spine = spine.for_input(spec.path)
    if spec is not None and spec.layout == "microdata":
        require_spine(fail, spine, spec.layout)
    if spec is not None and spec.legacy and hierarchy.leaf.digits != BLOCK_DIGITS:
        raise fail(
            "geography.levels",
            f"format = '{PL94_LEGACY}' reads {BLOCK_DIGITS}-digit blocks; the leaf level"
            f" {hierarchy.leaf.name!r} has {hierarchy.leaf.digits} digits",
        )
    tables = model.output.pl94_tables
    legacy = model.input if isinstance(model.input, LegacyInputModel) else None
    pl94_tables = _pl94_tables(fail, tables, schema, legacy) if tables else None
    method, fallback = model.estimation.method, ""
    try:
        _check_method(fail, method, hierarchy, queries, zeros, schema)
    except ConfigError as err:
        if model.estimation.fallback is None:
            raise
        method, fallback = model.estimation.fallback, err.rule
    passes = _passes(fail, model.estimation.passes, method, queries)
    if (
        method == "topdown"
        and model.budget.bypass_single_child
        and any("total" in chosen for chosen in passes.values())
    ):
        raise fail(
            "estimation.passes",
            '"total" first is not supported with [budget] bypass_single_child = true and'
            ' method = "topdown" (a bypassed node may have no measured total)',
        )
    dwellings = model.estimation.dwellings
    dwellings_spec = dwellings.spec(base) if dwellings else None
    occupancy = _occupancy(fail, model.estimation.occupancy, schema, spec, dwellings_spec)
    if occupancy and any("total" in chosen for chosen in passes.values()):
        raise fail(
            "estimation.passes",
            '"total" first is not supported with [[estimation.occupancy]] (the totals of the'
            " first pass do not see which children may hold persons)",
        )
    return TopDownConfig(
        source=document.source,
        run=run,
        schema=schema,
        hierarchy=hierarchy,
        budget=budget,
        queries=queries,
        invariant_levels=invariants,
        structural_zero_cells=zeros,
        input=spec,
        spine=spine,
        estimation_method=method,
        method_fallback=fallback,
        document=document,
        bypass_single_child=model.budget.bypass_single_child,
        estimation_passes=passes,
        pl94_tables=pl94_tables,
        occupancy=occupancy,
        dwellings=dwellings_spec,
    )


def privacy_unit(config: TopDownConfig) -> PrivacyUnit:
    """TopDown's privacy unit (the manifest's ``change-one-record`` relation): neighbours differ
    in one person's record, their number of records the same; public are what every neighbour
    shares under this config: the leaf list, the invariant totals, the dwelling facts the
    occupancy rule reads and the cells zero by definition."""
    spec = config.input
    if config.spine is not None:
        leaves = f"the leaf list (the spine {config.document.shown(config.spine.path)})"
    elif spec is not None and spec.legacy is not None:
        leaves = "the leaf list (every block of the files' geoheader)"
    else:
        leaves = "the leaf list (every row of the input, zero-population ones included)"
    public = ["the number of records", leaves]
    if config.invariant_levels:
        levels = ", ".join(config.invariant_levels)
        public.append(f"every node's total at {levels} and above (invariants, released exact)")
    if config.occupancy:
        public.append(
            "the dwelling counts [[estimation.occupancy]] reads (where each group may live, and"
            " its bounds), used without noise"
        )
    if config.structural_zero_cells:
        public.append("the cells of [estimation] structural_zeros (0 by definition)")
    return PrivacyUnit(
        "neighbouring inputs differ in one person's record (its block and characteristics);"
        " the number of records is the same (bounded DP)",
        tuple(public),
    )
