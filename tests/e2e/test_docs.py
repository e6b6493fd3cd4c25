"""The documents: every relative link resolves, every page is in the site's nav, the transcripts
of ``censusdp check`` and ``budget`` are what those commands print, and the recipes of "Reading
a release" run as written on a real release."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from censusdp_spark.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")
RECIPE = re.compile(r"```python\n(.*?)```", re.DOTALL)
DEMO_OUTPUT = "output/ri_2010_demo"
CONSOLE = re.compile(r"```console\n(.*?)```", re.DOTALL)
# A command of a transcript that needs neither Spark nor data, and the lines it printed.
TRANSCRIPT = re.compile(r"^\$ censusdp ((?:check|budget) .*)\n((?:(?!\$ ).*\n)*)", re.MULTILINE)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_resolves(document: Path):
    targets = [t for t in LINK.findall(document.read_text()) if "://" not in t]
    missing = [t for t in targets if not (document.parent / t).exists()]
    assert missing == []


def _nav_pages(nav: object) -> list[str]:
    """Every page a mkdocs ``nav`` names, at any depth."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    return []


def _site_nav() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    try:
        import yaml
    except ImportError:  # the pages named in nav entries, "- Title: page.md"
        return re.findall(r"^\s*-\s*[^:\n]+:\s*(\S+\.md)\s*$", text, re.MULTILINE)
    return _nav_pages(yaml.safe_load(text)["nav"])


def test_every_page_is_in_the_site_nav():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    nav = _site_nav()
    assert sorted(pages - set(nav)) == []
    assert sorted(set(nav) - pages) == []


def test_the_docs_build_in_the_test_command_is_strict():
    """``--quiet`` would silence the warnings strict mode counts: the build would pass anything."""
    (build,) = [
        ln for ln in (ROOT / "scripts" / "test.sh").read_text().splitlines() if "mkdocs build" in ln
    ]
    assert "--strict" in build and "--quiet" not in build and " -q" not in build


def _transcripts() -> list:
    """Every ``censusdp check``/``budget`` of the docs' console blocks, with what it printed
    (but the tutorial's, run in a folder of its own by ``test_tutorial.py``)."""
    return [
        pytest.param(command, printed, id=f"{page.name}: {command}")
        for page in sorted((ROOT / "docs").glob("*.md"))
        if page.name != "bring-your-own-data.md"
        for block in CONSOLE.findall(page.read_text())
        for command, printed in TRANSCRIPT.findall(block)
    ]


@pytest.mark.parametrize(("command", "printed"), _transcripts())
def test_the_transcripts_are_what_the_commands_print(command, printed, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(shlex.split(command)) == 0
    assert capsys.readouterr().out == printed, f"rerun: censusdp {command}"


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
