"""The config reference, generated from the config models so it cannot drift from them.

``python -m censusdp_spark.reference [DOCS]`` writes ``DOCS/config-reference.md`` (every
section and key of each release's config: type, default and description) and
``DOCS/schemas/<kind>.schema.json`` (the JSON Schema pydantic derives from the same models, for
editors and validators); ``DOCS`` defaults to ``docs``. A test checks the committed files are
what this writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from censusdp_spark.group_sizes.config import PgsrModel
from censusdp_spark.synth.config import SynthModel
from censusdp_spark.topdown.config import TopDownModel

JsonSchema = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """One release's config: its models and how a reader recognises and runs it."""

    name: str
    title: str
    model: type[BaseModel]
    intro: str


KINDS = (
    Kind(
        "topdown",
        "TopDown",
        TopDownModel,
        "Run by `censusdp topdown`; told by its `[schema]` section. Commented examples:"
        " `conf/ri_2010_demo.toml`, `conf/pl94_2020_production.toml`.",
    ),
    Kind(
        "group_sizes",
        "Group sizes",
        PgsrModel,
        "Run by `censusdp group-sizes`; told by its `[groups]` section. Commented example:"
        " `conf/pgsr_calm.toml`.",
    ),
    Kind(
        "synth",
        "Synthetic data",
        SynthModel,
        "Run by `censusdp synth`; told by its `[[group]]` and `[[individual]]` tables."
        " Commented examples: `conf/synth_pums.toml`, `conf/synth_pums_reduced.toml`.",
    ),
)

# Each file linked, not the folder: the docs site (mkdocs, strict) refuses a link to a folder.
SCHEMA_LINKS = ", ".join(f"[`{kind.name}`](schemas/{kind.name}.schema.json)" for kind in KINDS)

HEADER = f"""\
# Config reference

Generated from the config models by `python -m censusdp_spark.reference`; do not edit by hand.
JSON Schemas of the same models, in `schemas/`: {SCHEMA_LINKS}.

A config is a TOML file. Every key below is checked when the config is read (`censusdp check
--config CONF` does only that): an unknown key, a wrong type or a broken rule is one error
naming the file, the key and the rule. Budgets (rho, epsilon, shares) are exact fractions,
written as strings such as `"1/10"` or integers, never floats. Relative paths are read from
the current directory. `[run]` is the same for every release.
"""


def json_schema(kind: Kind) -> JsonSchema:
    """The JSON Schema of ``kind``'s config, as pydantic derives it from the models."""
    schema = kind.model.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": f"censusdp {kind.title} config",
    }


def markdown() -> str:
    """``config-reference.md``: every release's sections and keys."""
    parts = [HEADER]
    for kind in KINDS:
        parts.append(f"## {kind.title}\n\n{kind.intro}\n")
        schema = json_schema(kind)
        for section, definition in _sections(schema, schema, ""):
            parts.append(_section_text(section, definition))
    return "\n".join(parts)


def _sections(
    root: JsonSchema, schema: JsonSchema, path: str, variant: str = ""
) -> Iterator[tuple[str, JsonSchema]]:
    """Each table of the config, top-down: its TOML header (with the ``variant`` it describes,
    for a table whose variants a key tells apart) and its definition."""
    properties = schema.get("properties", {})
    if path:
        yield f"{path} ({variant})" if variant else path, schema
    for key, prop in properties.items():
        dotted = f"{path.strip('[]')}.{key}".lstrip(".")
        for option in _plain(prop).get("oneOf", [prop]):
            header = _table_header(dotted, _plain(option))
            if header is not None:
                definition = _definition(root, header[1])
                label = definition["title"] if option is not prop else ""
                yield from _sections(root, definition, header[0], label)


def _table_header(dotted: str, prop: JsonSchema) -> tuple[str, str] | None:
    """The TOML header of a key holding a table, and its definition's reference; or None."""
    if "$ref" in prop:
        return f"[{dotted}]", prop["$ref"]
    if prop.get("type") == "array" and "$ref" in prop.get("items", {}):
        return f"[[{dotted}]]", prop["items"]["$ref"]
    if prop.get("type") == "object" and "$ref" in prop.get("additionalProperties", {}):
        return f"[{dotted}.<name>]", prop["additionalProperties"]["$ref"]
    return None


def _definition(root: JsonSchema, ref: str) -> JsonSchema:
    definition: JsonSchema = root["$defs"][ref.rsplit("/", 1)[-1]]
    return definition


def _plain(prop: JsonSchema) -> JsonSchema:
    """``prop`` without an ``anyOf`` with null (an optional key)."""
    options = [o for o in prop.get("anyOf", []) if o.get("type") != "null"]
    return options[0] if len(options) == 1 else prop


def _section_text(section: str, definition: JsonSchema) -> str:
    required = set(definition.get("required", []))
    rows = [
        "| key | type | default | description |",
        "|---|---|---|---|",
        *(
            f"| `{key}` | {_cell(_type_text(prop))} | {_cell(_default(key, prop, required))}"
            f" | {_cell(prop['description'])} |"
            for key, prop in definition["properties"].items()
        ),
    ]
    return f"### `{section}`\n\n" + "\n".join(rows) + "\n"


def _type_text(prop: JsonSchema) -> str:
    if "$ref" in prop:
        return "table"
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "anyOf" in prop:
        options = [o for o in prop["anyOf"] if o.get("type") != "null"]
        return " or ".join(_type_text(o) for o in options)
    kind = prop.get("type")
    if kind == "array":
        return f"list of {_type_text(prop.get('items', {}))}"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"table of {_type_text(values)}" if isinstance(values, dict) else "table"
    return str(kind) if kind else "any"


def _default(key: str, prop: JsonSchema, required: set[str]) -> str:
    if key in required:
        return "required"
    if "default" not in prop or prop["default"] is None:
        return "none"
    if isinstance(prop["default"], dict) and "$ref" in _plain(prop):
        return "its keys' defaults"
    return f"`{json.dumps(prop['default'])}`"


def _cell(text: str) -> str:
    """Text safe in a Markdown table cell: no column break, no HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def write(docs: Path) -> list[Path]:
    """Write the reference and the schemas under ``docs``; the paths written."""
    (docs / "schemas").mkdir(parents=True, exist_ok=True)
    written = [docs / "config-reference.md"]
    written[0].write_text(markdown())
    for kind in KINDS:
        path = docs / "schemas" / f"{kind.name}.schema.json"
        path.write_text(json.dumps(json_schema(kind), indent=2) + "\n")
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    for path in write(Path(argv[0] if argv else "docs")):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
