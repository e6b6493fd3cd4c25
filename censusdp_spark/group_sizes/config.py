"""Group-size release (PGSR) configuration: a TOML file validated once, at the door.

Sections: ``[run]`` and ``[geography]`` as for TopDown; ``[groups]`` the largest size N (and
whether it is top-coded, "N or more"); ``[input]`` the table of households or of per-leaf size
counts; ``[budget]`` a pure-DP ε (an exact fraction) and optional per-level shares (default: an
even split over the levels, as in the paper); ``[mechanism]`` the default post-processing and the
norm of its objective and the definition of faithfulness (``"level"``, the paper's, or
``"node"``). Unknown keys are errors. See ``conf/pgsr_calm.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

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
from censusdp_spark.privacy.accounting import BudgetError, PureDpSplit, split_epsilon

MECHANISMS = ("dp", "relaxed", "cumulative")
NORMS = ("l2", "l1")
# "level": every level sums to the public G (the paper's and the definition; with
# consistency, the root's sum alone). "node": every node sums to its own G^r (Kuo et al.'s
# stricter invariant; makes every G^r public).
FAITHFULNESS = ("level", "node")
LAYOUTS = ("households", "size_counts")


@dataclass(frozen=True)
class GroupSizes:
    max_size: int  # N: sizes are 1..N
    topcode: bool  # size N stands for "N or more"


@dataclass(frozen=True)
class GroupInputSpec:
    """Where the groups come from.

    ``size_counts``: one row per leaf, ``size_columns[i]`` holding the number of groups of size
    ``i + 1``; every row is a leaf of the public spine, empty ones included. ``households``: one
    row per household with its ``size_column``, or one row per member with a ``member_column``
    quantity summed per ``household_column``; the leaves are those holding a household, so
    this layout needs ``[geography] spine``, from which the leaves are then taken.
    """

    path: Path
    format: str
    layout: str
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


@dataclass(frozen=True)
class PgsrConfig:
    source: str
    run: RunOptions
    hierarchy: Hierarchy
    groups: GroupSizes
    budget: PureDpSplit
    mechanism: str  # the default; the command line may choose another
    norm: str  # objective of the dp and cumulative post-processing ("l2" as in the paper)
    faithfulness: str  # "level" (sums per level = G) or "node" (sums per node = G^r)
    input: GroupInputSpec | None
    spine: SpineSpec | None = None


def _groups(r: ConfigReader, doc: Any) -> GroupSizes:
    doc = r.table(doc, "groups", {"max_size", "topcode"}, {"max_size"})
    size = doc["max_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise r.fail("groups.max_size", f"must be an integer >= 1, got {size!r}")
    topcode = doc.get("topcode", False)
    if not isinstance(topcode, bool):
        raise r.fail("groups.topcode", f"must be true or false, got {topcode!r}")
    return GroupSizes(size, topcode)


def _input(r: ConfigReader, doc: Any, groups: GroupSizes, base: Path) -> GroupInputSpec:
    keys = {
        "path",
        "format",
        "layout",
        "geocode",
        "size_columns",
        "household",
        "size",
        "member_quantity",
        "ignore",
    }
    doc = r.table(doc, "input", keys, {"path", "layout", "geocode"})
    fmt = doc.get("format", "csv")
    if fmt not in INPUT_FORMATS:
        raise r.fail("input.format", f"{fmt!r} must be one of {INPUT_FORMATS}")
    layout = doc["layout"]
    if layout not in LAYOUTS:
        raise r.fail("input.layout", f"{layout!r} must be one of {LAYOUTS}")
    path = Path(r.string(doc["path"], "input.path"))
    common: dict[str, Any] = {
        "path": path if path.is_absolute() else base / path,
        "format": fmt,
        "layout": layout,
        "geocode_columns": column_names(r, doc["geocode"], "input.geocode"),
        "ignore": tuple(r.string(c, "input.ignore") for c in doc.get("ignore", [])),
    }
    if layout == "size_counts":
        for key in ("household", "size", "member_quantity"):
            if key in doc:
                raise r.fail(f"input.{key}", "only for layout = 'households'")
        if "size_columns" not in doc:
            raise r.fail("input", "missing required key 'size_columns' (layout = 'size_counts')")
        columns = column_names(r, doc["size_columns"], "input.size_columns")
        if len(columns) != groups.max_size or len(set(columns)) != len(columns):
            raise r.fail(
                "input.size_columns",
                f"must name {groups.max_size} distinct columns (sizes 1..{groups.max_size}), got {list(columns)}",
            )
        return GroupInputSpec(**common, size_columns=columns)
    if "size_columns" in doc:
        raise r.fail("input.size_columns", "only for layout = 'size_counts'")
    if "household" not in doc:
        raise r.fail("input", "missing required key 'household' (layout = 'households')")
    if ("size" in doc) == ("member_quantity" in doc):
        raise r.fail(
            "input",
            "give exactly one of 'size' (a row per household) or 'member_quantity' (a row per member)",
        )
    return GroupInputSpec(
        **common,
        household_column=r.string(doc["household"], "input.household"),
        size_column=r.string(doc["size"], "input.size") if "size" in doc else None,
        member_column=r.string(doc["member_quantity"], "input.member_quantity")
        if "member_quantity" in doc
        else None,
    )


def _budget(r: ConfigReader, doc: Any, hierarchy: Hierarchy) -> PureDpSplit:
    doc = r.table(doc, "budget", {"epsilon", "levels"}, {"epsilon"})
    epsilon = r.fraction(doc["epsilon"], "budget.epsilon")
    if "levels" in doc:
        levels = r.table(doc["levels"], "budget.levels", set(hierarchy.names), set(hierarchy.names))
        shares = {lv: r.fraction(levels[lv], f"budget.levels.{lv}") for lv in hierarchy.names}
    else:
        shares = {lv: Fraction(1, len(hierarchy.names)) for lv in hierarchy.names}
    try:
        return split_epsilon(epsilon, shares)
    except BudgetError as err:
        raise ConfigError(r.source, "budget", str(err)) from None


def _mechanism(r: ConfigReader, doc: Any) -> tuple[str, str, str]:
    doc = r.table(doc, "mechanism", {"default", "norm", "faithfulness"})
    default = doc.get("default", "dp")
    if default not in MECHANISMS:
        raise r.fail("mechanism.default", f"{default!r} must be one of {MECHANISMS}")
    norm = doc.get("norm", "l2")
    if norm not in NORMS:
        raise r.fail("mechanism.norm", f"{norm!r} must be one of {NORMS}")
    faithfulness = doc.get("faithfulness", "level")
    if faithfulness not in FAITHFULNESS:
        raise r.fail("mechanism.faithfulness", f"{faithfulness!r} must be one of {FAITHFULNESS}")
    return default, norm, faithfulness


def load_pgsr_config(path: Path | str, project_root: Path | None = None) -> PgsrConfig:
    """Parse and validate a PGSR config; relative paths resolve against ``project_root``
    (default: the current directory). Raises ``ConfigError`` naming the file and the key."""
    path = Path(path)
    doc, r = parse_toml(path)
    r.table(
        doc,
        "top level",
        {"run", "geography", "groups", "input", "budget", "mechanism"},
        {"geography", "groups", "budget"},
    )
    run_doc = doc.get("run", {})
    if isinstance(run_doc, dict) and "delta" in run_doc:
        raise r.fail("run.delta", "not used: the group-size release is pure epsilon-DP")
    base = project_root or Path.cwd()
    run = run_options(r, run_doc, base, path.stem)
    hierarchy = hierarchy_section(r, doc["geography"])
    spine = spine_option(r, doc["geography"], base)
    groups = _groups(r, doc["groups"])
    budget = _budget(r, doc["budget"], hierarchy)
    mechanism, norm, faithfulness = _mechanism(r, doc.get("mechanism", {}))
    spec = _input(r, doc["input"], groups, base) if "input" in doc else None
    if spec is not None and spec.layout == "households":
        require_spine(r, spine, spec.layout)
    return PgsrConfig(
        r.source, run, hierarchy, groups, budget, mechanism, norm, faithfulness, spec, spine
    )
