"""Config reading shared by every release: each shipped config loads, a config built in Python
loads as the file it mirrors, and pydantic's errors become one line naming file, key and rule."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from censusdp_spark.group_sizes.config import load_group_sizes_config
from censusdp_spark.model.config import release_kind
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.release.runner import release_contents
from censusdp_spark.synth.config import load_synth_config
from censusdp_spark.topdown.config import load_topdown_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"
CONFIGS = sorted((ROOT / "conf").glob("*.toml"))


LOADERS = {
    "topdown": load_topdown_config,
    "group_sizes": load_group_sizes_config,
    "synth": load_synth_config,
}


def loader_for(path: Path):
    """The loader of a config, told by its sections (``release_kind``)."""
    return LOADERS[release_kind(path)]


def test_a_config_of_no_release_or_of_two_is_refused_in_one_line(tmp_path):
    both = tmp_path / "both.toml"
    both.write_text("[schema]\n[groups]\n")
    for config in (both, {"run": {}}):
        with pytest.raises(ConfigError, match="not the config of one release"):
            release_kind(config)


def test_every_shipped_config_is_found():
    assert len(CONFIGS) >= 9


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    config = loader_for(path)(path, ROOT)
    assert config.source == str(path) and config.run.name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_config_built_in_python_loads_as_the_file_it_mirrors(path):
    loader = loader_for(path)
    from_file = loader(path, ROOT)
    from_dict = loader(tomllib.loads(path.read_text()), ROOT)
    assert from_dict.source == "<config>"
    # the run's default name is the file's stem; every shipped config names its run
    assert replace(from_dict, source=from_file.source) == from_file
    assert loader(from_file) is from_file


def test_a_config_built_in_python_fingerprints_as_the_file_it_mirrors():
    from_file = load_topdown_config(DEMO, ROOT)
    from_dict = load_topdown_config(tomllib.loads(DEMO.read_text()), ROOT)
    assert release_contents("topdown", from_dict.document.doc, "x", tables=[]) == (
        release_contents("topdown", DEMO.read_text(), "x", tables=[])
    )
    assert from_file.document.text == DEMO.read_text()


def test_relative_paths_of_a_dict_resolve_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_topdown_config(tomllib.loads(DEMO.read_text()))
    assert config.input is not None
    assert config.input.path == tmp_path / "data" / "ri_2010_blocks_pl.csv"
    assert config.run.output == tmp_path / "output" / "ri_2010_demo"


def test_a_dict_config_is_copied_at_the_door():
    doc = tomllib.loads(DEMO.read_text())
    config = load_topdown_config(doc, ROOT)
    doc["budget"]["rho"] = "1"
    assert config.document.doc["budget"]["rho"] == "293764/114921"


@pytest.mark.parametrize(
    ("edit", "key", "rule"),
    [
        (lambda d: d["input"]["cells"][3].update(expr=7), "input.cells[3].expr", "must be a string"),
        (lambda d: d["budget"]["levels"]["county"].update(share=0.1), "budget.levels.county.share", "is a float"),
        (lambda d: d["geography"]["levels"][1].update(digits=-2), "geography.levels[1].digits", "-2 must be >= 0"),
        (lambda d: d["input"].update(format="xlsx"), "input.format", "'xlsx' must be one of ('csv', 'parquet', 'delta', 'pl94_legacy')"),
        (lambda d: d["geography"].pop("levels"), "geography", "missing required key(s) ['levels']"),
        (lambda d: d.update(extra={}), "top level", "unknown key(s) ['extra']; allowed: ["),
        (lambda d: d.update(schema=[]), "schema", "must be a table"),
        (lambda d: d["run"].update(delta="1e-400"), "run.delta", "'1e-400' must be in (0, 1)"),
    ],
)  # fmt: skip
def test_a_dict_config_error_names_the_dotted_key_and_the_rule(edit, key, rule):
    doc = tomllib.loads(DEMO.read_text())
    edit(doc)
    with pytest.raises(ConfigError) as err:
        load_topdown_config(doc, ROOT)
    assert (err.value.source, err.value.key) == ("<config>", key)
    assert rule in err.value.rule and "\n" not in str(err.value), str(err.value)


def test_rho_1e_minus_400_is_refused_by_the_budget_command_in_one_line(tmp_path):
    """``censusdp budget`` gave the OverflowError traceback of float(1/ρ) for ρ = 1e-400."""
    path = tmp_path / "tiny.toml"
    path.write_text(DEMO.read_text().replace('rho = "293764/114921"', 'rho = "1e-400"', 1))
    done = subprocess.run(
        [sys.executable, "-m", "censusdp_spark.cli", "budget", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{path}: [budget.rho] '1e-400' is outside [2**-80, 2**40]" in done.stderr


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('rho = "293764/114921"', 'rho = "1e400"', "budget.rho"),
        ('rho = "293764/114921"', 'rho = "1e-23"', "budget.levels.nation.queries.votingage"),
        ('share = "165/4099"', 'share = "1e-30"', "budget"),  # the shares no longer sum to 1
    ],
)
def test_every_rho_keeps_the_noise_computable(tmp_path, old, new, key):
    """Every ρ, given or allocated to one query, lies in [2**-80, 2**40] (σ below 2**40)."""
    path = tmp_path / "edited.toml"
    path.write_text(DEMO.read_text().replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load_topdown_config(path, ROOT)
    assert err.value.key == key


def test_the_group_size_and_synth_budgets_are_bounded_too(tmp_path):
    calm = tomllib.loads((ROOT / "conf" / "pgsr_calm.toml").read_text())
    calm["budget"]["epsilon"] = "1e-30"
    with pytest.raises(ConfigError, match=r"\[budget.epsilon\] '1e-30' is outside"):
        load_group_sizes_config(calm, ROOT)
    pums = tomllib.loads((ROOT / "conf" / "synth_pums.toml").read_text())
    pums["budget"]["rho"] = "1e-400"
    with pytest.raises(ConfigError, match=r"\[budget.rho\] '1e-400' is outside"):
        load_synth_config(pums, ROOT)
