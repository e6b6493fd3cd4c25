"""Run configuration: a TOML file, or a mapping shaped like one, validated once, at the door.

Each release declares pydantic models that mirror its TOML (``Model``: unknown keys are errors,
types are strict, choices are ``Literal``s, fractions exact: strings like ``"293764/114921"``
or integers, floats refused). A ``ValidationError`` becomes one ``ConfigError`` naming the file,
the dotted key (``input.cells[3].expr``) and the rule. A table whose variants a key tells apart
(TopDown's ``[input]`` by ``format`` and ``layout``, its ``[budget]`` by ``mode``) is a tagged
union of models, one per ``variant``, each taking its own keys and ``refused`` the others'. The
models then convert into the frozen dataclasses the rest of the code uses, checking there the
rules that span sections.
See ``conf/ri_2010_demo.toml`` for a commented example of every section.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import partial
from pathlib import Path, PurePath
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeVar, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    StringConstraints,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import Hierarchy, Level

InputFormat = Literal["csv", "parquet", "delta"]
INPUT_FORMATS: tuple[str, ...] = get_args(InputFormat)
SpineFormat = Literal["csv", "parquet", "delta", "pipe"]  # pipe: '|'-delimited text with a header
SPINE_FORMATS: tuple[str, ...] = get_args(SpineFormat)

MIN_BUDGET, MAX_BUDGET = Fraction(1, 2**80), Fraction(2**40)
"""Every ρ and ε a config gives, and every ρ or ε it allocates to one measurement, lies in
[2⁻⁸⁰, 2⁴⁰]: the noise scale then stays below 2⁴⁰, where the samplers' int64 draws cannot
overflow (``privacy.samplers``), and every σ, ρ and ε the reports print is a finite float."""
OUTSIDE = "outside [2**-80, 2**40], where the noise is computable"

Source = Path | str | Mapping[str, Any]
"""A config: a TOML file's path or a mapping shaped like the TOML (errors name "<config>")."""
Fail = Callable[[str, str], ConfigError]
"""``fail(key, rule)``: the error for the config being loaded."""


def _exact(value: Any, bounds: bool = False) -> Fraction:
    if isinstance(value, bool | float):
        raise ValueError(f"{value!r} is a float; write an exact fraction as a string, e.g. '1/10'")
    try:
        exact = Fraction(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"{value!r} is not a fraction like '3/7' or '0.25'") from None
    if bounds and exact > 0 and not MIN_BUDGET <= exact <= MAX_BUDGET:
        raise ValueError(f"{value!r} is {OUTSIDE}")
    return exact


def _delta(value: Any) -> float:
    try:
        exact = Fraction(value if isinstance(value, str | int | float) else "x")
    except (ValueError, OverflowError):
        raise ValueError(f"{value!r} is not a number") from None
    if isinstance(value, bool) or not 0 < exact < 1 or not 0 < float(exact) < 1:
        raise ValueError(f"{value!r} must be in (0, 1)")
    return float(exact)


Exact = Annotated[Fraction, PlainValidator(_exact, json_schema_input_type=str | int)]
Budget = Annotated[
    Fraction, PlainValidator(partial(_exact, bounds=True), json_schema_input_type=str | int)
]
"""An exact ρ or ε, within [``MIN_BUDGET``, ``MAX_BUDGET``] if positive (> 0 is checked with
the rest of the accounting)."""
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
PathText = Annotated[Name, BeforeValidator(lambda v: str(v) if isinstance(v, PurePath) else v)]
Columns = Annotated[
    list[Name],
    BeforeValidator(
        lambda v: [v] if isinstance(v, str) else v, json_schema_input_type=str | list[str]
    ),
    Field(min_length=1),
]
"""A name or a non-empty list of them (columns are concatenated, in order, into a geocode)."""
PositiveInt = Annotated[int, Field(ge=1), Strict()]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False), Strict()]
"""(Both strict also in a plain dataclass, which ``Model``'s config does not reach.)"""


def check_keys(
    data: Mapping,
    allowed: set[str],
    required: set[str],
    refuse: Callable = ValueError,
    required_by: str = "",
) -> None:
    """Refuse a table with keys outside ``allowed`` or without all of ``required`` (a missing
    key's refusal ends with ``required_by``): by a ``ValueError`` (for pydantic), or
    ``refuse(rule)``, e.g. ``partial(fail, key)`` for a table whose keys depend on another
    section (the schema's attributes)."""
    unknown, missing = sorted(map(str, set(data) - allowed)), sorted(required - set(data))
    rule = f"missing required key(s) {missing}{required_by}" if missing else ""
    if rule := f"unknown key(s) {unknown}; allowed: {sorted(allowed)}" if unknown else rule:
        raise refuse(rule)


class Model(BaseModel):
    """A TOML table: strict types, unknown keys refused (with the allowed ones named)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    required_by: ClassVar[str] = ""
    """Why its required keys are required, ending their refusal: a variant's tag
    (`` (format = 'pl94_legacy')``)."""

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            keys = {f.alias or n: f for n, f in cls.model_fields.items()}
            required = {k for k, f in keys.items() if f.is_required()}
            check_keys(data, set(keys), required, required_by=cls.required_by)
        return data


def refused(rule: str) -> BeforeValidator:
    """A key one variant of a table does not take, refused with ``rule`` (which variants take
    it): declared on the variant, ``Annotated[SkipJsonSchema[None], refused(rule)] = None``, so
    every variant allows the same keys and an unknown key's refusal names them all."""

    def refuse(value: Any) -> None:
        raise ValueError(rule)

    return BeforeValidator(refuse)


VARIANT_TAGS: set[str] = set()
"""The tags of the variants of the tables told apart by a key (``variant``); pydantic puts a
variant's tag in its errors' locations, where ``config_error`` leaves it out."""


def variant(description: str) -> Tag:
    """The tag of one variant of a table, named by the key that tells it
    (``format = 'pl94_legacy'``)."""
    VARIANT_TAGS.add(description)
    return Tag(description)


def key_error(key: str, rule: str) -> PydanticCustomError:
    """An error in the key ``key`` of the table being validated: ``config_error`` names it."""
    return PydanticCustomError("key", "{rule}", {"key": key, "rule": rule})


def check_choice(data: Mapping, key: str, default: str, choices: tuple[str, ...]) -> None:
    """Refuse a table unless its ``key`` (``default`` when absent) is one of ``choices``."""
    if (value := data.get(key, default)) not in choices:
        raise key_error(key, f"{value!r} must be one of {choices}")


def choice_of(key: str, default: str, choices: tuple[str, ...]) -> BeforeValidator:
    """``check_choice`` on a table whose variants ``key`` tells apart, before its variant is
    chosen, so the refusal names every variant's choice."""

    def check(data: Any) -> Any:
        if isinstance(data, Mapping):
            check_choice(data, key, default, choices)
        return data

    return BeforeValidator(check)


@dataclass(frozen=True)
class SpineSpec:
    """The public list of leaves (blocks), fixed before any response is read.

    Every level's node set is derived from it alone: a record off the spine is refused and a
    spine leaf without records is a node with zero counts (``io.readers.on_spine``). The leaf
    geocode is ``geocode_columns`` concatenated in order; the file's other columns are not read.
    """

    path: Path
    format: SpineFormat
    geocode_columns: tuple[str, ...]
    beside_input: str | None = None
    """The configured path when it is relative to the input's (``relative_to = "input"``): a
    spine written with its input follows ``--input``."""

    def for_input(self, input_path: Path) -> SpineSpec:
        """This spine for an input at ``input_path``: moved with it when configured beside it."""
        if self.beside_input is None:
            return self
        return replace(self, path=Path(os.path.normpath(resolve(input_path, self.beside_input))))


class InputTable(Protocol):
    """An ``[input]`` spec: a dataclass with the table's ``path``."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def path(self) -> Path: ...


InputT = TypeVar("InputT", bound=InputTable)


def input_for_run(
    source: str,
    spec: InputT | None,
    spine: SpineSpec | None,
    input_path: Path | None,
    needs: str,
) -> tuple[InputT, SpineSpec | None]:
    """The ``[input]`` with ``--input`` (``input_path``) applied, and the spine that follows it;
    ``ValueError`` saying ``needs`` (which release needs what) when ``[input]`` is missing."""
    if spec is None:
        raise ValueError(f"{source}: [input] missing: {needs}")
    if input_path is not None:
        spec = replace(spec, path=input_path)
    return spec, spine.for_input(spec.path) if spine else None


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    name: str
    output: Path
    private_dir: Path
    secret_file: Path | None
    secret_env: str | None
    delta: float


class RunModel(Model):
    name: Name | None = Field(
        None,
        description="The run's name, in the manifest and the default folders. Default: the config file's stem.",
    )
    output: PathText | None = Field(
        None,
        description="The release folder: its Delta tables and manifest.json. Default: output/<name>.",
    )
    private_dir: PathText | None = Field(
        None,
        description="The run's private folder (a generated secret, resume checkpoints), owner-only and never released. Default: runs/<name>.",
    )
    secret_file: PathText | None = Field(
        None,
        description="A file holding the 64-hex-character run secret (mode 0600). Default: a secret generated into private_dir.",
    )
    secret_env: str | None = Field(
        None,
        description="An environment variable holding the run secret (64 hex characters), used before secret_file when it is set.",
    )
    delta: Annotated[float, PlainValidator(_delta, json_schema_input_type=float | str)] = Field(
        1e-10,
        description="The delta in (0, 1) at which the zCDP budget is also reported as (epsilon, delta)-DP; the noise does not depend on it.",
    )

    def options(self, base: Path, default_name: str) -> RunOptions:
        name = self.name or default_name
        output = resolve(base, self.output or f"output/{name}")
        private = resolve(base, self.private_dir or f"runs/{name}")
        secret_file = resolve(base, self.secret_file) if self.secret_file else None
        return RunOptions(
            name=name,
            output=output,
            private_dir=private,
            secret_file=secret_file,
            secret_env=self.secret_env or None,
            delta=self.delta,
        )


class SpineModel(Model):
    """A block-level table named by path, format and geocode columns (the spine, or a table
    keyed by its blocks)."""

    path: PathText = Field(description="The table's file or folder.")
    format: SpineFormat = Field(
        "csv", description="csv, parquet, delta, or pipe ('|'-delimited text with a header)."
    )
    geocode: Columns = Field(
        description="The block geocode column, or a list of columns concatenated in order."
    )
    relative_to: Literal["config", "input"] = Field(
        "config",
        description="'input': path is relative to the input's path (a spine written beside its "
        "input follows --input); 'config': relative to the config file.",
    )

    def spec(self, base: Path) -> SpineSpec:
        beside = self.path if self.relative_to == "input" else None
        return SpineSpec(resolve(base, self.path), self.format, tuple(self.geocode), beside)


class LevelModel(Model):
    name: Name = Field(description="The level's name, e.g. county.")
    digits: Annotated[int, Field(ge=0)] = Field(
        description="How many leading digits of a leaf geocode name this level's node: 0 at the root, strictly increasing down to the leaves."
    )


class GeographyModel(Model):
    levels: list[LevelModel] = Field(
        description="The hierarchy's levels, root first and leaf (block) last: [{ name, digits }, ...]."
    )
    spine: SpineModel | None = Field(
        None,
        description="The public list of leaves, fixed before any response is read: a record off it is refused and a leaf without records is a node of zero counts. Required for record-level inputs. Default: the leaves of the input.",
    )

    def hierarchy(self, fail: Fail) -> Hierarchy:
        try:
            return Hierarchy(tuple(Level(lv.name, lv.digits) for lv in self.levels))
        except ValueError as err:
            raise fail("geography.levels", str(err)) from None

    def spine_spec(self, base: Path) -> SpineSpec | None:
        return self.spine.spec(base) if self.spine else None


@dataclass(frozen=True)
class Document:
    """A config as read: ``source`` (what errors name), the TOML document (the release
    fingerprints it), its text (the manifest records it; JSON for a mapping), the directory
    relative paths resolve against and the run's default name (the file's stem)."""

    source: str = "<config>"
    doc: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    base: Path = Path()
    name: str = "config"

    @property
    def fail(self) -> Fail:
        return partial(ConfigError, self.source)

    def shown(self, path: Path) -> str:
        """``path`` as a message shows it: relative to the directory the config's paths
        resolve against when it lies inside it (``data/spine/blocks.csv``), else as it is."""
        return str(path.relative_to(self.base)) if path.is_relative_to(self.base) else str(path)


M = TypeVar("M", bound=BaseModel)


def read_config(model: type[M], config: Source, project_root: Path | None) -> tuple[Document, M]:
    """A TOML file read, or a mapping shaped like one taken (copied: later edits to it do not
    reach the config), and validated as ``model``; the first error becomes one ``ConfigError``.
    Relative paths will resolve against ``project_root``, default the current directory."""
    base, source = project_root or Path.cwd(), str(config)
    try:
        if isinstance(config, Mapping):
            doc = copy.deepcopy(dict(config))
            document = Document(doc=doc, text=json.dumps(doc, indent=2, default=str), base=base)
        else:
            text = Path(config).read_text()
            document = Document(source, tomllib.loads(text), text, base, Path(config).stem)
        return document, model.model_validate(document.doc)
    except FileNotFoundError:
        raise ConfigError(source, "-", "file not found") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(source, "-", f"not valid TOML: {err}") from None
    except ValidationError as err:
        raise config_error(document.source, err.errors()[0]) from None


RELEASE_SECTIONS: dict[str, frozenset[str]] = {
    "topdown": frozenset({"schema"}),
    "group_sizes": frozenset({"groups"}),
    "synth": frozenset({"group", "individual"}),
}
"""The sections that tell a release's config from the others' (only TopDown has ``[schema]``,
only group sizes ``[groups]``, only synth ``[[group]]`` and ``[[individual]]``)."""


def release_kind(config: Source) -> str:
    """Which release a config is for (a key of ``RELEASE_SECTIONS``), told by its sections;
    ``ConfigError`` in one line when the file is unreadable or fits no release or several."""
    source = "<config>" if isinstance(config, Mapping) else str(config)
    try:
        doc = config if isinstance(config, Mapping) else tomllib.loads(Path(config).read_text())
    except FileNotFoundError:
        raise ConfigError(source, "-", "file not found") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(source, "-", f"not valid TOML: {err}") from None
    kinds = [kind for kind, sections in RELEASE_SECTIONS.items() if sections <= set(doc)]
    if len(kinds) != 1:
        raise ConfigError(
            source,
            "-",
            "not the config of one release: TopDown's has [schema], group sizes' [groups],"
            " synth's [[group]] and [[individual]]",
        )
    return kinds[0]


_RULES = {
    "string_type": "must be a string, got {input!r}",
    "string_too_short": "must be a non-empty string, got {input!r}",
    "int_type": "must be an integer, got {input!r}",
    "float_type": "must be a number, got {input!r}",
    "bool_type": "must be true or false, got {input!r}",
    "list_type": "must be a list, got {input!r}",
    "too_short": "must be a non-empty list",
    "greater_than_equal": "{input!r} must be >= {ge}",
    "less_than_equal": "{input!r} must be at most {le}",
    "greater_than": "{input!r} must be a positive number",
    "finite_number": "{input!r} must be a finite number",
    **dict.fromkeys(("dict_type", "model_type", "dataclass_type"), "must be a table"),
}


def config_error(source: str, error: Any) -> ConfigError:
    """One pydantic error as ``ConfigError(source, dotted key, rule)``."""
    ctx = error.get("ctx") or {}
    loc, kind = [p for p in error["loc"] if p not in VARIANT_TAGS], error["type"]
    if kind == "key":
        loc, rule = [*loc, ctx["key"]], ctx["rule"]
    elif kind in ("extra_forbidden", "unexpected_keyword_argument", "missing"):
        rule = f"{'missing required' if kind == 'missing' else 'unknown'} key(s) {[loc.pop()]}"
    elif kind == "literal_error":
        choices = tuple(re.findall(r"'([^']*)'", ctx["expected"]))
        rule = f"{error['input']!r} must be one of {choices}"
    elif kind in ("value_error", "assertion_error"):
        rule = str(ctx["error"])
    else:
        rule = _RULES.get(kind, error["msg"]).format(input=error.get("input"), **ctx)
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return ConfigError(source, key or "top level", rule)


def resolve(base: Path, path: str | Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else base / p


def require_spine(fail: Fail, spine: SpineSpec | None, layout: str) -> None:
    """Record-level layouts make a node of a leaf only if it holds a record, so the released
    geography would tell which leaves are populated: they need the spine."""
    if spine is None:
        raise fail(
            "geography.spine",
            f"required with input.layout = '{layout}' (otherwise the released leaves reveal "
            "which are populated): add [geography] spine = { path = ..., geocode = ... }",
        )


def budget_in_range(fail: Fail, key: str, value: Fraction, what: str = "rho") -> None:
    """The ρ or ε allocated to one measurement keeps its noise computable (``MIN_BUDGET``)."""
    if not MIN_BUDGET <= value <= MAX_BUDGET:
        raise fail(key, f"gives one measurement a {what} {OUTSIDE}")
