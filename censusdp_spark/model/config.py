"""Run configuration: a TOML file validated once, at the door, into typed objects.

Unknown keys are errors; fractions are exact (strings like ``"293764/114921"`` or integers;
floats are refused where exactness matters). Nothing downstream re-parses strings.
See ``conf/ri_2010_demo.toml`` for a commented example of every section.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import Hierarchy, Level

INPUT_FORMATS = ("csv", "parquet", "delta")


SPINE_FORMATS = ("csv", "parquet", "delta", "pipe")  # pipe: '|'-delimited text with a header


@dataclass(frozen=True)
class SpineSpec:
    """The public list of leaves (blocks), fixed before any response is read.

    Every level's node set is derived from it alone: a record off the spine is refused and a
    spine leaf without records is a node with zero counts (``io.spine``). The leaf geocode is
    ``geocode_columns`` concatenated in order; the file's other columns are not read.
    """

    path: Path
    format: str
    geocode_columns: tuple[str, ...]


@dataclass(frozen=True)
class RunOptions:
    name: str
    output: Path
    private_dir: Path
    secret_file: Path | None
    secret_env: str | None
    delta: float


class ConfigReader:
    """Walks a parsed TOML document, recording the path for error messages."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, rule: str) -> ConfigError:
        return ConfigError(self.source, key, rule)

    def table(
        self,
        doc: Any,
        key: str,
        allowed: set[str],
        required: frozenset[str] | set[str] = frozenset(),
    ) -> dict:
        if not isinstance(doc, dict):
            raise self.fail(key, "must be a table")
        unknown = set(doc) - allowed
        if unknown:
            raise self.fail(key, f"unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        missing = set(required) - set(doc)
        if missing:
            raise self.fail(key, f"missing required key(s) {sorted(missing)}")
        return doc

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value.strip()

    def fraction(self, value: Any, key: str) -> Fraction:
        if isinstance(value, bool | float):
            raise self.fail(
                key, f"{value!r} is a float; write an exact fraction as a string, e.g. '1/10'"
            )
        if isinstance(value, int):
            return Fraction(value)
        if isinstance(value, str):
            try:
                return Fraction(value.strip())
            except (ValueError, ZeroDivisionError):
                raise self.fail(key, f"{value!r} is not a fraction like '3/7' or '0.25'") from None
        raise self.fail(key, f"{value!r} is not a fraction")


def hierarchy_section(r: ConfigReader, doc: Any) -> Hierarchy:
    doc = r.table(doc, "geography", {"levels", "spine"}, {"levels"})
    levels = []
    for i, lv in enumerate(doc["levels"]):
        key = f"geography.levels[{i}]"
        lv = r.table(lv, key, {"name", "digits"}, {"name", "digits"})
        if not isinstance(lv["digits"], int) or lv["digits"] < 0:
            raise r.fail(f"{key}.digits", f"must be a non-negative integer, got {lv['digits']!r}")
        levels.append(Level(r.string(lv["name"], f"{key}.name"), lv["digits"]))
    try:
        return Hierarchy(tuple(levels))
    except ValueError as err:
        raise r.fail("geography.levels", str(err)) from None


def column_names(r: ConfigReader, value: Any, key: str) -> tuple[str, ...]:
    """A column name or a non-empty list of them (concatenated, in order, into a geocode)."""
    if isinstance(value, str):
        return (r.string(value, key),)
    if not isinstance(value, list) or not value:
        raise r.fail(key, "must be a column name or a non-empty list of them")
    return tuple(r.string(v, f"{key}[{i}]") for i, v in enumerate(value))


def spine_option(r: ConfigReader, geography: dict, base: Path) -> SpineSpec | None:
    """``[geography] spine = { path, format, geocode }``, if given (``hierarchy_section`` has
    checked that ``geography`` is a table)."""
    if "spine" not in geography:
        return None
    doc = r.table(geography["spine"], "geography.spine", {"path", "format", "geocode"})
    missing = {"path", "geocode"} - set(doc)
    if missing:
        raise r.fail(
            "geography.spine",
            f"missing required key(s) {sorted(missing)}: "
            "spine = { path = <block list>, geocode = <column or [columns]> }",
        )
    fmt = doc.get("format", "csv")
    if fmt not in SPINE_FORMATS:
        raise r.fail("geography.spine.format", f"{fmt!r} must be one of {SPINE_FORMATS}")
    path = Path(r.string(doc["path"], "geography.spine.path"))
    return SpineSpec(
        path if path.is_absolute() else base / path,
        fmt,
        column_names(r, doc["geocode"], "geography.spine.geocode"),
    )


def require_spine(r: ConfigReader, spine: SpineSpec | None, layout: str) -> None:
    """Record-level layouts make a node of a leaf only if it holds a record, so the released
    geography would tell which leaves are populated: they need the spine."""
    if spine is None:
        raise r.fail(
            "geography.spine",
            f"required with input.layout = '{layout}' (otherwise the released leaves reveal "
            "which are populated): add [geography] spine = { path = ..., geocode = ... }",
        )


def run_options(r: ConfigReader, doc: Any, base: Path, default_name: str) -> RunOptions:
    doc = r.table(
        doc, "run", {"name", "output", "private_dir", "secret_file", "secret_env", "delta"}
    )
    name = r.string(doc.get("name", default_name), "run.name")
    delta = doc.get("delta", 1e-10)
    if isinstance(delta, str):
        try:
            delta = float(Fraction(delta))
        except ValueError:
            raise r.fail("run.delta", f"{delta!r} is not a number") from None
    if not isinstance(delta, float | int) or not 0 < delta < 1:
        raise r.fail("run.delta", f"{delta!r} must be in (0, 1)")

    def path(key: str, default: str | None) -> Path | None:
        value = doc.get(key, default)
        if value in (None, ""):
            return None
        p = Path(r.string(value, f"run.{key}"))
        return p if p.is_absolute() else base / p

    output = path("output", f"output/{name}")
    private = path("private_dir", f"runs/{name}")
    assert output is not None and private is not None
    env = doc.get("secret_env")
    return RunOptions(name, output, private, path("secret_file", None), env or None, float(delta))


def parse_toml(path: Path | str) -> tuple[dict[str, Any], ConfigReader]:
    """Read a TOML config file; the reader reports errors against this file."""
    source = str(path)
    try:
        doc = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(source, "-", "file not found") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(source, "-", f"not valid TOML: {err}") from None
    return doc, ConfigReader(source)
