"""The "Bring your own data" tutorial, done as a user would: its config saved as the page says,
in a fresh folder holding only the tutorial's data; every command of the page run there; its
reading recipe run on the release those commands made."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from censusdp_spark.cli import main

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "bring-your-own-data.md"
TRANSCRIPT = re.compile(r"^\$ censusdp (.*)\n((?:(?!\$ ).*\n)*)", re.MULTILINE)
COUNTY_POPULATION = 49_875  # Bristol County, RI, Census 2010


WORKED_EXAMPLE = "## A worked example"
"""The heading of the page's section run here (the next ``## `` heading ends it)."""


def _blocks(language: str) -> list[str]:
    """The fenced blocks of ``language`` of the page's worked example, in order."""
    section = TUTORIAL.read_text().split(WORKED_EXAMPLE, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


def test_the_page_holds_one_config_two_transcripts_one_run_and_one_recipe():
    (config,) = _blocks("toml")
    assert config.startswith("# my_release.toml")
    assert len(_blocks("console")) == 2 and len(_blocks("bash")) == 1
    assert len(_blocks("python")) == 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A new folder with the tutorial's data and the page's config saved in it."""
    folder = tmp_path_factory.mktemp("tutorial")
    shutil.copytree(ROOT / "data" / "tutorial", folder / "data" / "tutorial")
    (folder / "my_release.toml").write_text(_blocks("toml")[0])
    return folder


@pytest.mark.parametrize("block", [0, 1], ids=["check", "budget"])
def test_the_transcripts_are_what_the_commands_print(block, folder, capsys):
    ((command, printed),) = TRANSCRIPT.findall(_blocks("console")[block])
    with contextlib.chdir(folder):
        assert main(shlex.split(command)) == 0
    assert capsys.readouterr().out == printed, f"rerun: censusdp {command}"


@pytest.fixture(scope="module")
def released(folder, spark) -> Path:
    """The folder after the page's run commands, each in process, in order."""
    commands = [ln for ln in _blocks("bash")[0].splitlines() if ln.strip()]
    assert [c.split()[:2] for c in commands] == [["censusdp", "validate"], ["censusdp", "topdown"]]
    with contextlib.chdir(folder):
        for command in commands:
            assert main(shlex.split(command)[1:]) == 0, command
    return folder


def test_the_run_writes_the_release_the_page_describes(released):
    release = released / "output" / "my_release"
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["run"] == "my_release" and manifest["for_release"] is True
    assert manifest["nodes"] == {"county": 1, "tract": 11, "block_group": 38, "block": 1092}
    assert set(manifest["guarantee_checks"].values()) == {0}
    assert (released / "runs" / "my_release" / "run_secret").exists()


def test_the_reading_recipe_runs_and_prints_what_the_page_says(released, capsys):
    with contextlib.chdir(released):
        exec(_blocks("python")[0], {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("{") and set(eval(lines[0]).values()) == {0}
    assert lines[1].split() == ["hispanic", "hispanic", "not_hispanic"]
    assert len(lines) == 2 + 1 + 11 + 1  # header lines, the 11 tracts, the block sum
    assert lines[-1] == str(COUNTY_POPULATION)
