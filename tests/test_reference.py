"""The config reference: every key of every release's config is described, and the committed
``docs/config-reference.md`` and ``docs/schemas/`` are what the models generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from censusdp_spark.reference import KINDS, Kind, json_schema, markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REGENERATE = "regenerate with: python -m censusdp_spark.reference"


def _tables(schema: dict) -> dict[str, dict]:
    """The config's tables by definition name, the top level as "<config>"."""
    return {"<config>": schema, **schema.get("$defs", {})}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_key_of_every_table_has_a_description(kind: Kind):
    undescribed = [
        f"{table}.{key}"
        for table, definition in _tables(json_schema(kind)).items()
        for key, prop in definition.get("properties", {}).items()
        if not prop.get("description", "").strip()
    ]
    assert undescribed == []


def test_the_committed_reference_is_what_the_models_generate():
    assert (DOCS / "config-reference.md").read_text() == markdown(), REGENERATE


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_committed_json_schema_is_what_the_models_generate(kind: Kind):
    committed = json.loads((DOCS / "schemas" / f"{kind.name}.schema.json").read_text())
    assert committed == json_schema(kind), REGENERATE


@pytest.mark.parametrize(
    ("config", "sections"),
    [
        ("ri_2010_demo.toml", ["[run]", "[schema]", "[budget.levels.<name>]"]),
        # a table whose variants a key tells apart: a section per variant, its keys only
        (
            "pl94_e2e_providence.toml",
            ['[budget] (mode = "shares")', '[budget] (mode = "per_query_rho")']
            + [f"[input] ({v})" for v in ('layout = "block_counts"', 'layout = "microdata"')]
            + ['[input] (format = "pl94_legacy")'],
        ),
        ("pgsr_calm.toml", ["[groups]", "[mechanism]"]),
        ("synth_pums.toml", ["[[group]]", "[[individual]]", "[hpd_gen]"]),
    ],
)
def test_the_reference_has_a_section_per_table(config, sections):
    text = markdown()
    assert all(f"### `{section}`" in text for section in sections)


def test_a_variant_section_lists_only_the_keys_its_variant_takes():
    legacy = markdown().split('### `[input] (format = "pl94_legacy")`')[1].split("### ")[0]
    assert "| `state` |" in legacy and "| `table` |" in legacy
    assert "| `layout` |" not in legacy and "| `cells` |" not in legacy
