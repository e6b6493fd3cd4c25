"""``censusdp``: every command and option documented in one help style, the version, the
``group-sizes`` name and its ``pgsr`` alias, and the Spark-free ``check`` and ``budget``."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from censusdp_spark.cli import build_parser, main
from censusdp_spark.group_sizes.cli import run_group_sizes_from_args
from censusdp_spark.release.flags import HelpFormatter

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "conf").glob("*.toml"))
HEAVY = ("pyspark", "pandas", "scipy", "clarabel")


def _parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every parser under ``parser`` (itself included) by its ``prog``."""
    found = {parser.prog: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.update(_parsers(child))
    return found


PARSERS = _parsers(build_parser())


def test_every_command_is_reached():
    assert {
        "censusdp",
        "censusdp check",
        "censusdp budget",
        "censusdp validate",
        "censusdp topdown",
        "censusdp group-sizes",
        "censusdp synth",
        "censusdp generate",
        "censusdp generate national",
        "censusdp jars",
    } <= set(PARSERS)


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_every_option_has_help_in_the_one_style(prog, capsys):
    parser = PARSERS[prog]
    assert parser.formatter_class is HelpFormatter
    options = [a for a in parser._actions if a.option_strings]
    assert all(action.help for action in options), [a.dest for a in options if not a.help]
    text = parser.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_help_fits_an_80_column_terminal(prog, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    long = [line for line in PARSERS[prog].format_help().splitlines() if len(line) > 80]
    assert long == []


def test_the_top_level_help_is_plain_text(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text and ":func:" not in text
    assert "group-sizes (pgsr)" in text and "censusdp check --config" in text


def test_version_is_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"censusdp {version('censusdp-spark')}"


@pytest.mark.parametrize("name", ["group-sizes", "pgsr"])
def test_group_sizes_is_the_command_and_pgsr_its_alias(name):
    args = build_parser().parse_args([name, "--config", "c.toml", "--mechanism", "cumulative"])
    assert args.run is run_group_sizes_from_args and args.mechanism == "cumulative"


def test_help_imports_no_spark_nor_numerical_library():
    """``censusdp --help`` (and each command's) loads only the parser: no Spark, no pandas,
    scipy or clarabel."""
    code = f"""
import sys
from censusdp_spark.cli import main
for argv in (["--help"], ["topdown", "--help"], ["group-sizes", "--help"], ["synth", "--help"],
             ["validate", "--help"], ["generate", "national", "--help"], ["jars", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stderr.strip().splitlines()[-1] == "[]"
    assert "usage: censusdp" in done.stdout


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_check_says_in_one_line_what_every_shipped_config_describes(path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"{path}: a valid ")
    assert "epsilon" in out


def test_check_starts_no_spark():
    code = (
        "import sys; from censusdp_spark.cli import main;"
        " code = main(['check', '--config', 'conf/pl94_2020_production.toml']);"
        " print(code, 'pyspark' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "0 False"


@pytest.mark.parametrize(
    ("config", "edit", "key"),
    [
        ("ri_2010_demo.toml", ('rho = "293764/114921"', "rho = 2.5"), "budget.rho"),
        ("pgsr_calm.toml", ("max_size = 4", "max_size = 0"), "groups.max_size"),
        ("synth_pums_reduced.toml", ("[budget]", "[budget]\nunknown = 1"), "budget"),
    ],
)
def test_check_refuses_a_broken_config_of_each_kind_in_one_line(
    config, edit, key, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(ROOT)
    text = (ROOT / "conf" / config).read_text()
    assert edit[0] in text
    broken = tmp_path / config
    broken.write_text(text.replace(edit[0], edit[1], 1))
    assert main(["check", "--config", str(broken)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and str(broken) in captured.err and key in captured.err


@pytest.mark.parametrize(
    ("config", "total"),
    [
        ("ri_2010_demo.toml", "total rho"),
        ("pgsr_calm.toml", "total epsilon = 1 (pure DP, exact)"),
        ("synth_pums_reduced.toml", "rho = 1/10"),
    ],
)
def test_budget_prints_each_kind_its_own_accounting(config, total, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["budget", "--config", f"conf/{config}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"budget of conf/{config} ({Path(config).stem})") and total in out


def test_synth_refuses_a_domain_too_large_for_mwem_before_spark_or_any_read(tmp_path):
    """The full PUMS config's explicit domain is far above mwem.max_domain: ``censusdp synth
    --method mwem`` says so in one line, with inputs that do not exist and no Spark started."""
    text = (ROOT / "conf" / "synth_pums.toml").read_text()
    config = tmp_path / "synth_pums.toml"
    config.write_text(
        text.replace("data/pums/households.csv", str(tmp_path / "no_households.csv")).replace(
            "data/pums/persons.csv", str(tmp_path / "no_persons.csv")
        )
    )
    assert "no_households.csv" in config.read_text() and "no_persons.csv" in config.read_text()
    code = (
        "import sys; from censusdp_spark.cli import main;"
        f" code = main(['synth', '--config', {str(config)!r}, '--method', 'mwem',"
        f" '--output', {str(tmp_path / 'out')!r}]);"
        " print(code, 'pyspark' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "2 False"
    error = done.stderr.strip()
    assert error.count("\n") == 0, error
    assert error.startswith(f"censusdp: error: {config}: [mwem.max_domain] --method mwem")
    assert "~2.63e57 households, above the limit 2,000,000" in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("config", "verdict"),
    [
        ("synth_pums.toml", "~2.63e57 households, limit mwem.max_domain = 2,000,000 (too large"),
        ("synth_pums_reduced.toml", "134,976 households, limit mwem.max_domain = 2,000,000 (fits)"),
    ],
)
def test_check_and_budget_say_whether_mwem_fits_a_synth_config(
    config, verdict, capsys, monkeypatch
):
    monkeypatch.chdir(ROOT)
    assert main(["check", "--config", f"conf/{config}"]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and f"MWEM's explicit domain: {verdict}" in line
    assert main(["budget", "--config", f"conf/{config}"]) == 0
    assert f"MWEM's explicit domain: {verdict}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("config", "neighbours", "public"),
    [
        (
            "ri_2010_demo.toml",
            "neighbouring inputs differ in one person's record (its block and characteristics);"
            " the number of records is the same (bounded DP)",
            "the number of records; the leaf list (every row of the input, zero-population ones"
            " included); every node's total at state and above (invariants, released exact)",
        ),
        (
            "pgsr_calm.toml",
            "neighbouring inputs differ in one individual joining or leaving an existing group"
            " (no group is added or removed)",
            "the leaf list (every row of the input, empty ones included); G, the number of"
            " groups (every level sums to it exactly)",
        ),
        (
            "synth_pums_reduced.toml",
            "neighbouring inputs differ in one person's individual attributes ([[individual]])",
            "who lives with whom (household membership) and every household's group attributes;"
            " the numbers of households (N_G) and persons (N_I), and M = 3; which households"
            " hold more than 3 persons (dropped; their number is reported)",
        ),
    ],
)
def test_budget_states_the_privacy_unit_before_the_budget(
    config, neighbours, public, capsys, monkeypatch
):
    monkeypatch.chdir(ROOT)
    assert main(["budget", "--config", f"conf/{config}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == [f"privacy unit: {neighbours}", f"public (not protected): {public}"]


def test_the_privacy_unit_names_what_each_config_makes_public():
    """A spine, invariants, occupancy facts and structural zeros are public when configured;
    the group sizes' faithfulness = "node" makes every node's number of groups public."""
    from censusdp_spark.api import privacy_unit

    production = privacy_unit(ROOT / "conf" / "national_production.toml").public
    assert any(p.startswith("the leaf list (the spine ") for p in production)
    assert "the cells of [estimation] structural_zeros (0 by definition)" in production
    legacy = privacy_unit(ROOT / "conf" / "pl94_e2e_providence.toml").public
    assert "the leaf list (every block of the files' geoheader)" in legacy
    assert any(p.startswith("the dwelling counts [[estimation.occupancy]] reads") for p in legacy)
    calm = tomllib.loads((ROOT / "conf" / "pgsr_calm.toml").read_text())
    calm.setdefault("mechanism", {})["faithfulness"] = "node"
    assert privacy_unit(calm).public[-1].startswith("G and every node's number of groups G^r")
