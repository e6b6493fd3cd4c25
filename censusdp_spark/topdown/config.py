"""The TopDown run config: schema, geography, budget, queries, input and
estimation settings, validated at the door (errors name the file, key and rule).

``TopDownModel`` mirrors the TOML; ``load_config`` validates it and converts it into a
``RunConfig``, checking there the rules that depend on the schema or the hierarchy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import numpy as np
from pydantic import BeforeValidator, Field, field_validator

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
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy.accounting import (
    BudgetError,
    ZcdpAllocation,
    allocate_by_shares,
    allocate_per_query_rho,
)
from censusdp_spark.topdown.queries import TOTAL, MarginalQuery, parse_query
from censusdp_spark.topdown.schema import Attribute, Recode, Schema
from censusdp_spark.topdown.solvers.symmetric_covariance import covariance_layout

InputLayout = Literal["block_counts", "microdata"]
INPUT_LAYOUTS: tuple[str, ...] = get_args(InputLayout)
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
class InputSpec:
    path: Path
    format: str
    layout: str
    geocode_columns: tuple[str, ...]  # concatenated, in order, into the leaf geocode
    cells: tuple[CellColumn, ...] = ()  # block_counts
    attributes: tuple[AttributeColumn, ...] = ()  # microdata
    ignore: tuple[str, ...] = ()  # columns present in the file but deliberately unused
    total: str | None = None  # block_counts: a column every row's mapped cells must sum to

    def used_columns(self) -> tuple[str, ...]:
        cols = list(self.geocode_columns)
        for c in self.cells:
            cols += [*c.plus, *c.minus]
        cols += [a.column for a in self.attributes] + ([self.total] if self.total else [])
        return tuple(dict.fromkeys(cols))


@dataclass(frozen=True)
class RunConfig:
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
    estimation_passes: Mapping[str, tuple[EstimationPass, ...]] = field(default_factory=dict)
    """Per level, its estimation passes; a level not listed is one pass (``passes_at``)."""
    document: Document = field(default_factory=Document, compare=False, repr=False)

    def passes_at(self, level: str) -> tuple[EstimationPass, ...]:
        """The estimation passes of ``level``: ``("all",)`` or ``("total", "all")``."""
        return self.estimation_passes.get(level, ONE_PASS)

    def query(self, level: str, name: str) -> MarginalQuery:
        for q in self.queries[level]:
            if q.name == name:
                return q
        raise KeyError(name)


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
    name: Name
    levels: Annotated[list[Name], BeforeValidator(_level_range), Field(min_length=1)]


class RecodeModel(Model):
    attribute: Name
    groups: dict[str, list[str]]


class SchemaModel(Model):
    attributes: Annotated[list[AttributeModel], Field(min_length=1)]
    recodes: dict[str, RecodeModel] = {}


class LevelBudgetModel(Model):
    share: Exact | None = None  # mode = "shares" only
    queries: dict[str, Budget]  # query shares, or with mode = "per_query_rho" each query's rho


class BudgetModel(Model):
    rho: Budget | None = None
    mode: Literal["shares", "per_query_rho"] = "shares"
    levels: dict[str, LevelBudgetModel]


class AttributeColumnModel(Model):
    column: Name
    map: dict[str, Name] | None = None  # raw value -> level; default: the levels themselves


class InputModel(Model):
    path: PathText
    format: InputFormat = "csv"
    layout: InputLayout
    geocode: Columns
    cells: list[dict[str, Name]] | None = None  # block_counts: {<attribute> = <level>, expr}
    attributes: dict[str, AttributeColumnModel] | None = None  # microdata, one per attribute
    ignore: list[Name] = []
    total: Name | None = None


class EstimationModel(Model):
    invariants: list[Name] = []
    structural_zeros: list[dict[str, list[str]]] = []
    method: EstimationMethod = "topdown"
    passes: list[str] | dict[str, list[str]] = list(ONE_PASS)  # every level, or per level

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


class TopDownModel(Model):
    run: RunModel = RunModel()
    schema_: SchemaModel = Field(alias="schema")
    geography: GeographyModel
    budget: BudgetModel
    input: InputModel | None = None
    estimation: EstimationModel = EstimationModel()


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
    shares = model.mode == "shares"
    for name, level in model.levels.items():
        if shares and level.share is None:
            raise fail(f"budget.levels.{name}", "missing required key(s) ['share']")
        if not shares and level.share is not None:
            raise fail(f"budget.levels.{name}", "unknown key(s) ['share']; allowed: ['queries']")
    queries = {name: level.queries for name, level in model.levels.items()}
    if shares and model.rho is None:
        raise fail("budget", "missing required key 'rho' (mode = 'shares')")
    if not shares and model.rho is not None:
        raise fail("budget.rho", "not used with mode = 'per_query_rho' (the total is the sum)")
    try:
        if model.rho is None:
            allocation = allocate_per_query_rho(queries, hierarchy.names)
        else:
            level_shares = {n: lv.share for n, lv in model.levels.items() if lv.share is not None}
            allocation = allocate_by_shares(model.rho, level_shares, queries, hierarchy.names)
    except BudgetError as err:
        raise fail("budget", str(err)) from None
    for e in allocation.entries:
        budget_in_range(fail, f"budget.levels.{e.level}.queries.{e.query}", e.rho)
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
    fail: Fail, cells: list[dict[str, str]] | None, schema: Schema, zeros: tuple[int, ...]
) -> tuple[CellColumn, ...]:
    """The mapped cells; every cell of the schema is mapped or a structural zero, so none of
    the input's people silently become 0."""
    if not cells:
        raise fail("input.cells", "must be a non-empty list of {<attribute> = <level>, expr = ...}")
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
        levels = schema.levels_of(np.array(unmapped[:1]))[0]
        shown = ", ".join(
            f"{a.name} = {a.levels[i]!r}" for a, i in zip(schema.attributes, levels, strict=True)
        )
        raise fail(
            "input.cells",
            f"cell {{{shown}}} is neither mapped nor in [estimation] structural_zeros"
            f" ({len(unmapped)} cell(s) left out): map every cell, or declare it structurally zero",
        )
    return tuple(out[c] for c in sorted(out))


def _input(
    fail: Fail, model: InputModel, schema: Schema, zeros: tuple[int, ...], base: Path
) -> InputSpec:
    path, geocode = resolve(base, model.path), tuple(model.geocode)
    common = (path, model.format, model.layout, geocode)
    if model.layout == "block_counts":
        if model.attributes is not None:
            raise fail("input.attributes", "only for layout = 'microdata'")
        cells = _cells(fail, model.cells, schema, zeros)
        return InputSpec(*common, cells=cells, ignore=tuple(model.ignore), total=model.total)
    for key in ("cells", "total"):
        if getattr(model, key) is not None:
            raise fail(f"input.{key}", "only for layout = 'block_counts'")
    attrs = model.attributes or {}
    check_keys(attrs, {*schema.names}, {*schema.names}, partial(fail, "input.attributes"))
    columns = []
    for attr in schema.attributes:
        value_map = attrs[attr.name].map or {lv: lv for lv in attr.levels}
        if bad := [v for v in value_map.values() if v not in attr.levels]:
            rule = f"maps to {bad}, which are not levels of {attr.name}"
            raise fail(f"input.attributes.{attr.name}.map", rule)
        columns.append(AttributeColumn(attr.name, attrs[attr.name].column, value_map))
    return InputSpec(*common, attributes=tuple(columns), ignore=tuple(model.ignore))


def _check_method(fail: Fail, method: str, leaf: str, queries: tuple[MarginalQuery, ...],
                  zeros: tuple[int, ...], n_cells: int) -> None:  # fmt: skip
    """``full_information`` needs the leaf level's queries to determine every cell that is not
    a structural zero (its leaves are estimated from their own measurements)."""
    if method == "topdown":
        return
    active = np.setdiff1d(np.arange(n_cells), zeros)
    stacked = np.vstack(
        [np.eye(q.size)[q.cell_to_marginal[active]].T for q in queries]
        or [np.zeros((0, active.size))]
    )
    if np.linalg.matrix_rank(stacked) < active.size:
        raise fail(
            "estimation.method",
            f'"full_information" needs the leaf level\'s queries to determine every cell;'
            f" those of [budget.levels.{leaf}.queries] ({[q.name for q in queries]}) do"
            ' not: add "detailed" there',
        )


def _passes(
    fail: Fail,
    passes: list[str] | dict[str, list[str]],
    method: str,
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
        check_keys(z, set(schema.names), set(), partial(fail, key))
        for name, levels in z.items():
            if bad := [v for v in levels if v not in schema.attribute(name).levels]:
                raise fail(f"{key}.{name}", f"{bad} are not levels of {name}")
        zeros.update(int(c) for c in schema.cells_matching({n: frozenset(v) for n, v in z.items()}))
    return tuple(model.invariants), tuple(sorted(zeros))


def load_config(config: Source | RunConfig, project_root: Path | None = None) -> RunConfig:
    """Parse and validate a TopDown run config: a TOML file's path, a mapping shaped like the
    TOML, or a ``RunConfig`` (returned as is). Relative paths resolve against ``project_root``
    (default: the current directory). Raises ``ConfigError`` naming the file and key."""
    if isinstance(config, RunConfig):
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
    if spec is not None and spec.layout == "microdata":
        require_spine(fail, spine, spec.layout)
    method, leaf = model.estimation.method, hierarchy.leaf.name
    _check_method(fail, method, leaf, queries[leaf], zeros, schema.n_cells)
    if method == "full_information":
        every = [q.cell_to_marginal for level in hierarchy.names for q in queries[level]]
        try:
            covariance_layout(schema.shape, schema.names, zeros, every)
        except ValueError as err:
            raise fail("estimation.method", str(err)) from None
    passes = _passes(fail, model.estimation.passes, method, queries)
    return RunConfig(
        document.source, run, schema, hierarchy, budget, queries, invariants, zeros, spec, spine,
        method, passes, document,
    )  # fmt: skip
