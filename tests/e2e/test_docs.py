"""The documents: every relative link resolves, and the recipes of "Reading a release" run as
written on a real release."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")
RECIPE = re.compile(r"```python\n(.*?)```", re.DOTALL)
DEMO_OUTPUT = "output/ri_2010_demo"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_resolves(document: Path):
    targets = [t for t in LINK.findall(document.read_text()) if "://" not in t]
    missing = [t for t in targets if not (document.parent / t).exists()]
    assert missing == []


def _recipes() -> list[str]:
    return RECIPE.findall((ROOT / "docs" / "reading-a-release.md").read_text())


def test_reading_a_release_has_recipes_for_pandas_deltalake_and_spark():
    text = "\n".join(_recipes())
    assert "to_pandas(" in text and "from deltalake import" in text and ".spark(" in text


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda r: r.splitlines()[-1][:40])
def test_the_recipes_run_on_a_real_release(recipe: str, reference_release, spark, capsys):
    if "deltalake" in recipe and importlib.util.find_spec("deltalake") is None:
        pytest.skip("the deltalake package is not installed")
    exec(recipe.replace(DEMO_OUTPUT, str(reference_release)), {})
