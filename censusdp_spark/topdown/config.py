"""The TopDown run config: schema, geography, budget, queries, input and
estimation settings, validated at the door (errors name the file, key and rule).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from censusdp_spark.model.config import (
    INPUT_FORMATS,
    ConfigReader,
    RunOptions,
    SpineSpec,
    column_names,
    hierarchy_section,
    parse_toml,
    require_spine,
    run_options,
    spine_option,
)
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import Hierarchy
from censusdp_spark.privacy.accounting import (
    BudgetError,
    ZcdpAllocation,
    allocate_by_shares,
    allocate_per_query_rho,
)
from censusdp_spark.topdown.queries import MarginalQuery, parse_query
from censusdp_spark.topdown.schema import Attribute, Recode, Schema
from censusdp_spark.topdown.solvers.symmetric_covariance import covariance_layout

INPUT_LAYOUTS = ("block_counts", "microdata")
EstimationMethod = Literal["topdown", "full_information"]
"""``topdown``: each level fitted to its own measurements under its parent (the Census method);
``full_information``: each child fitted to its bottom-up BLUE from its own and all its
descendants' measurements, weighted by that estimate's precision."""
ESTIMATION_METHODS: tuple[str, ...] = get_args(EstimationMethod)


_TERM = re.compile(r"\s*([+-]?)\s*([A-Za-z_][A-Za-z0-9_]*)\s*")


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

    def used_columns(self) -> tuple[str, ...]:
        cols = list(self.geocode_columns)
        for c in self.cells:
            cols += [*c.plus, *c.minus]
        cols += [a.column for a in self.attributes]
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

    def query(self, level: str, name: str) -> MarginalQuery:
        for q in self.queries[level]:
            if q.name == name:
                return q
        raise KeyError(name)


def _levels(r: ConfigReader, spec: Any, key: str) -> tuple[str, ...]:
    if isinstance(spec, list):
        levels = tuple(r.string(v, f"{key}[{i}]") for i, v in enumerate(spec))
    else:
        spec = r.table(spec, key, {"from", "to", "width"}, {"from", "to"})
        width = spec.get("width", 0)
        levels = tuple(f"{i:0{width}d}" for i in range(int(spec["from"]), int(spec["to"]) + 1))
    if not levels or len(set(levels)) != len(levels):
        raise r.fail(key, "levels must be a non-empty list of distinct names")
    return levels


def schema_section(r: ConfigReader, doc: Any) -> Schema:
    doc = r.table(doc, "schema", {"attributes", "recodes"}, {"attributes"})
    attrs = []
    if not isinstance(doc["attributes"], list) or not doc["attributes"]:
        raise r.fail("schema.attributes", "must be a non-empty list of {name, levels}")
    for i, a in enumerate(doc["attributes"]):
        key = f"schema.attributes[{i}]"
        a = r.table(a, key, {"name", "levels"}, {"name", "levels"})
        attrs.append(
            Attribute(r.string(a["name"], f"{key}.name"), _levels(r, a["levels"], f"{key}.levels"))
        )
    names = [a.name for a in attrs]
    if len(set(names)) != len(names):
        raise r.fail("schema.attributes", f"attribute names must be unique: {names}")
    recodes = []
    for name, spec in doc.get("recodes", {}).items():
        key = f"schema.recodes.{name}"
        spec = r.table(spec, key, {"attribute", "groups"}, {"attribute", "groups"})
        attr_name = r.string(spec["attribute"], f"{key}.attribute")
        if attr_name not in names:
            raise r.fail(f"{key}.attribute", f"unknown attribute {attr_name!r}")
        attr = attrs[names.index(attr_name)]
        groups = r.table(spec["groups"], f"{key}.groups", set(spec["groups"]))
        group_of = [-1] * attr.size
        for g, (group, members) in enumerate(groups.items()):
            for m in members:
                if m not in attr.levels:
                    raise r.fail(f"{key}.groups.{group}", f"{m!r} is not a level of {attr_name}")
                if group_of[attr.index_of(m)] != -1:
                    raise r.fail(f"{key}.groups.{group}", f"level {m!r} is in two groups")
                group_of[attr.index_of(m)] = g
        if -1 in group_of:
            missing = [lv for lv, g in zip(attr.levels, group_of, strict=True) if g == -1]
            raise r.fail(f"{key}.groups", f"levels {missing} are in no group")
        if name in names:
            raise r.fail(key, "a recode cannot have an attribute's name")
        recodes.append(Recode(name, attr_name, tuple(groups), tuple(group_of)))
    return Schema(tuple(attrs), tuple(recodes))


def _budget(r: ConfigReader, doc: Any, hierarchy: Hierarchy) -> ZcdpAllocation:
    doc = r.table(doc, "budget", {"rho", "mode", "levels"}, {"levels"})
    mode = doc.get("mode", "shares")
    if mode not in ("shares", "per_query_rho"):
        raise r.fail("budget.mode", f"{mode!r} must be 'shares' or 'per_query_rho'")
    levels = r.table(doc["levels"], "budget.levels", set(doc["levels"]))
    unknown = set(levels) - set(hierarchy.names)
    if unknown:
        raise r.fail(
            "budget.levels",
            f"unknown level(s) {sorted(unknown)}; levels are {list(hierarchy.names)}",
        )
    query_values: dict[str, dict[str, Fraction]] = {}
    level_shares: dict[str, Fraction] = {}
    for name, spec in levels.items():
        key = f"budget.levels.{name}"
        allowed = {"share", "queries"} if mode == "shares" else {"queries"}
        spec = r.table(spec, key, allowed, allowed)
        if mode == "shares":
            level_shares[name] = r.fraction(spec["share"], f"{key}.share")
        queries = r.table(spec["queries"], f"{key}.queries", set(spec["queries"]))
        query_values[name] = {q: r.fraction(v, f"{key}.queries.{q}") for q, v in queries.items()}
    try:
        if mode == "shares":
            if "rho" not in doc:
                raise r.fail("budget", "missing required key 'rho' (mode = 'shares')")
            return allocate_by_shares(
                r.fraction(doc["rho"], "budget.rho"), level_shares, query_values, hierarchy.names
            )
        if "rho" in doc:
            raise r.fail(
                "budget.rho", "not used with mode = 'per_query_rho' (the total is the sum)"
            )
        return allocate_per_query_rho(query_values, hierarchy.names)
    except BudgetError as err:
        raise ConfigError(r.source, "budget", str(err)) from None


def _cell_columns(r: ConfigReader, cells: Any, schema: Schema) -> tuple[CellColumn, ...]:
    if not isinstance(cells, list) or not cells:
        raise r.fail(
            "input.cells", "must be a non-empty list of {<attribute> = <level>, expr = ...}"
        )
    out: dict[int, CellColumn] = {}
    for i, c in enumerate(cells):
        key = f"input.cells[{i}]"
        c = r.table(c, key, set(schema.names) | {"expr"}, set(schema.names) | {"expr"})
        index = []
        for attr in schema.attributes:
            level = r.string(c[attr.name], f"{key}.{attr.name}")
            if level not in attr.levels:
                raise r.fail(
                    f"{key}.{attr.name}",
                    f"{level!r} is not a level of {attr.name} {list(attr.levels)}",
                )
            index.append(attr.index_of(level))
        cell = int(schema.cell_of(np.array([index]))[0])
        if cell in out:
            raise r.fail(key, "this cell is given twice")
        expr = r.string(c["expr"], f"{key}.expr")
        plus: list[str] = []
        minus: list[str] = []
        pos = 0
        while pos < len(expr):
            m = _TERM.match(expr, pos)
            if not m or (m.group(1) == "" and pos > 0):
                raise r.fail(f"{key}.expr", f"{expr!r} must be column names joined by + and -")
            (minus if m.group(1) == "-" else plus).append(m.group(2))
            pos = m.end()
        out[cell] = CellColumn(cell, tuple(plus), tuple(minus), expr)
    return tuple(out[c] for c in sorted(out))


def _input(r: ConfigReader, doc: Any, schema: Schema, base: Path) -> InputSpec:
    doc = r.table(
        doc,
        "input",
        {"path", "format", "layout", "geocode", "cells", "attributes", "ignore"},
        {"path", "layout", "geocode"},
    )
    ignore = tuple(r.string(c, "input.ignore") for c in doc.get("ignore", []))
    fmt = doc.get("format", "csv")
    if fmt not in INPUT_FORMATS:
        raise r.fail("input.format", f"{fmt!r} must be one of {INPUT_FORMATS}")
    layout = doc["layout"]
    if layout not in INPUT_LAYOUTS:
        raise r.fail("input.layout", f"{layout!r} must be one of {INPUT_LAYOUTS}")
    geocode = column_names(r, doc["geocode"], "input.geocode")
    path = Path(r.string(doc["path"], "input.path"))
    spec = InputSpec(path if path.is_absolute() else base / path, fmt, layout, geocode)
    if layout == "block_counts":
        if "attributes" in doc:
            raise r.fail("input.attributes", "only for layout = 'microdata'")
        cells = _cell_columns(r, doc.get("cells"), schema)
        return InputSpec(spec.path, fmt, layout, geocode, cells=cells, ignore=ignore)
    if "cells" in doc:
        raise r.fail("input.cells", "only for layout = 'block_counts'")
    attrs = r.table(doc.get("attributes"), "input.attributes", set(schema.names), set(schema.names))
    columns = []
    for attr in schema.attributes:
        key = f"input.attributes.{attr.name}"
        spec_a = r.table(attrs[attr.name], key, {"column", "map"}, {"column"})
        value_map = {
            str(k): v for k, v in spec_a.get("map", {lv: lv for lv in attr.levels}).items()
        }
        bad = [v for v in value_map.values() if v not in attr.levels]
        if bad:
            raise r.fail(f"{key}.map", f"maps to {bad}, which are not levels of {attr.name}")
        columns.append(
            AttributeColumn(attr.name, r.string(spec_a["column"], f"{key}.column"), value_map)
        )
    return InputSpec(spec.path, fmt, layout, geocode, attributes=tuple(columns), ignore=ignore)


def _estimation_method(
    r: ConfigReader,
    doc: dict,
    leaf: str,
    leaf_queries: tuple[MarginalQuery, ...],
    structural_zeros: tuple[int, ...],
    n_cells: int,
) -> EstimationMethod:
    """The method; ``full_information`` also needs the leaf level's queries to determine every
    cell that is not a structural zero (its leaves are estimated from their own measurements)."""
    method = doc.get("method", "topdown")
    if method == "topdown":
        return "topdown"
    if method != "full_information":
        raise r.fail("estimation.method", f"{method!r} must be one of {list(ESTIMATION_METHODS)}")
    active = np.setdiff1d(np.arange(n_cells), structural_zeros)
    stacked = np.vstack(
        [np.eye(q.size)[q.cell_to_marginal[active]].T for q in leaf_queries]
        or [np.zeros((0, active.size))]
    )
    if np.linalg.matrix_rank(stacked) < active.size:
        raise r.fail(
            "estimation.method",
            f'"full_information" needs the leaf level\'s queries to determine every cell;'
            f" those of [budget.levels.{leaf}.queries] ({[q.name for q in leaf_queries]}) do"
            ' not: add "detailed" there',
        )
    return "full_information"


def _estimation(
    r: ConfigReader, doc: Any, schema: Schema, hierarchy: Hierarchy
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    doc = r.table(doc, "estimation", {"invariants", "structural_zeros", "method"})
    invariants = tuple(r.string(v, "estimation.invariants") for v in doc.get("invariants", []))
    for lv in invariants:
        if lv not in hierarchy.names:
            raise r.fail("estimation.invariants", f"unknown level {lv!r}")
    zeros: set[int] = set()
    for i, z in enumerate(doc.get("structural_zeros", [])):
        key = f"estimation.structural_zeros[{i}]"
        z = r.table(z, key, set(schema.names))
        selection = {}
        for name, levels in z.items():
            attr = schema.attribute(name)
            bad = [v for v in levels if v not in attr.levels]
            if bad:
                raise r.fail(f"{key}.{name}", f"{bad} are not levels of {name}")
            selection[name] = frozenset(levels)
        zeros.update(int(c) for c in schema.cells_matching(selection))
    return invariants, tuple(sorted(zeros))


def load_config(path: Path | str, project_root: Path | None = None) -> RunConfig:
    """Parse and validate a TopDown run config; relative paths resolve against ``project_root``
    (default: the current directory). Raises ``ConfigError`` naming the file and key."""
    path = Path(path)
    doc, r = parse_toml(path)
    source = r.source
    r.table(
        doc,
        "top level",
        {"run", "schema", "geography", "budget", "input", "estimation"},
        {"schema", "geography", "budget"},
    )
    base = project_root or Path.cwd()
    run = run_options(r, doc.get("run", {}), base, path.stem)
    schema = schema_section(r, doc["schema"])
    hierarchy = hierarchy_section(r, doc["geography"])
    spine = spine_option(r, doc["geography"], base)
    budget = _budget(r, doc["budget"], hierarchy)
    queries = {}
    for level in hierarchy.names:
        built = []
        for name in budget.queries_at(level):
            try:
                built.append(parse_query(name, schema))
            except ValueError as err:
                raise r.fail(f"budget.levels.{level}.queries", str(err)) from None
        queries[level] = tuple(built)
    estimation = doc.get("estimation", {})
    invariants, zeros = _estimation(r, estimation, schema, hierarchy)
    spec = _input(r, doc["input"], schema, base) if "input" in doc else None
    if spec is not None and spec.layout == "microdata":
        require_spine(r, spine, spec.layout)
    method = _estimation_method(
        r, estimation, hierarchy.leaf.name, queries[hierarchy.leaf.name], zeros, schema.n_cells
    )
    if method == "full_information":
        every = [q.cell_to_marginal for level in hierarchy.names for q in queries[level]]
        try:
            covariance_layout(schema.shape, schema.names, zeros, every)
        except ValueError as err:
            raise r.fail("estimation.method", str(err)) from None
    return RunConfig(
        source, run, schema, hierarchy, budget, queries, invariants, zeros, spec, spine, method
    )
