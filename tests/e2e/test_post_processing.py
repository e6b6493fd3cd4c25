"""Post-processing given noisy measurements: a release estimated again from its own
``noisy_measurements`` (``--noisy-format censusdp``) is the same release, row for row, with no
secret, no noise and no budget spent, even when the config's ``[budget]`` says otherwise."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from censusdp_spark.cli import main
from censusdp_spark.release.runner import NO_SECRET
from tests.helpers.release import assert_same_tables

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"


def demo_with(tmp: Path, old: str, new: str) -> Path:
    """The demo config with one line changed (its relative paths made absolute)."""
    text = DEMO.read_text()
    assert old in text, old
    path = tmp / "demo.toml"
    path.write_text(text.replace(old, new, 1).replace('"data/', f'"{ROOT}/data/'))
    return path


@pytest.fixture(scope="module")
def again(reference_release, tmp_path_factory) -> tuple[Path, str]:
    """The county's reference release estimated again from its noisy measurements with a
    config asking twice its rho: the output and what the command printed."""
    tmp = tmp_path_factory.mktemp("post_processed")
    config = demo_with(tmp, 'rho = "293764/114921"', 'rho = "587528/114921"')
    out = tmp / "again"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                *("topdown", "--config", str(config), "--output", str(out), "--variances"),
                *("--noisy-measurements", str(reference_release), "--noisy-format", "censusdp"),
            ]
        )
    assert code == 0
    return out, printed.getvalue()


def test_the_estimates_are_the_original_release_row_for_row(spark, reference_release, again):
    tables = ("noisy_measurements", "estimates", "microdata", "bottom_up", "total_variances")
    assert_same_tables(spark, reference_release, again[0], tables)


@pytest.fixture(scope="module")
def exported(reference_release, tmp_path_factory) -> Path:
    """The reference release in the Census NMF layout (``censusdp export-nmf``)."""
    nmf = tmp_path_factory.mktemp("exported") / "nmf"
    assert main(["export-nmf", "--release", str(reference_release), "--output", str(nmf)]) == 0
    return nmf


@pytest.fixture(scope="module")
def through_nmf(exported, tmp_path_factory) -> Path:
    """The reference release estimated again from its export in the NMF layout."""
    nmf = exported
    out = tmp_path_factory.mktemp("through_nmf") / "again"
    args = ["topdown", "--config", str(DEMO), "--output", str(out), "--variances"]
    assert main([*args, "--noisy-measurements", str(nmf), "--noisy-format", "census_nmf"]) == 0
    return out


def test_through_the_nmf_layout_the_estimates_are_the_original_release(
    spark, reference_release, through_nmf
):
    tables = ("noisy_measurements", "estimates", "microdata", "bottom_up", "total_variances")
    assert_same_tables(spark, reference_release, through_nmf, tables)
    manifest = json.loads((through_nmf / "manifest.json").read_text())
    assert manifest["post_processing"]["format"] == "census_nmf"
    assert manifest["post_processing"]["config_budget_not_used"] == []


def test_no_secret_no_noise_no_budget(reference_release, again):
    out, printed = again
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["secret_fingerprint"] == NO_SECRET
    processing = manifest["post_processing"]
    assert processing["rho_spent_by_this_release"] == "0"
    assert processing["noisy_measurements"] == str(reference_release)
    assert processing["format"] == "censusdp"
    private = out.parent / f"{out.name}.private"
    assert not list(private.glob("*secret*"))
    assert "no budget spent: post-processing of" in printed
    # the budget the measurements spent is the original's, whatever the config says
    original = json.loads((reference_release / "manifest.json").read_text())
    assert manifest["privacy"]["rho"] == original["privacy"]["rho"] == "293764/114921"
    assert manifest["guarantee_checks"] == original["guarantee_checks"]


def test_a_config_budget_that_disagrees_is_reported_not_used(again):
    out, printed = again
    reported = json.loads((out / "manifest.json").read_text())["post_processing"]
    lines = reported["config_budget_not_used"]
    assert lines and all("(the file's is used)" in line for line in lines)
    assert re.search(r"config \[budget\] not used: nation .*sigma2 .* in \[budget\]", printed)


def test_post_processing_refuses_what_it_cannot_hold(reference_release, tmp_path, capsys):
    """Bypassing needs each node's chain of levels, which a published file does not give: one
    line, nothing written."""
    config = demo_with(tmp_path, "[budget]\n", "[budget]\nbypass_single_child = true\n")
    out = tmp_path / "refused"
    args = ["topdown", "--config", str(config), "--output", str(out)]
    code = main(
        [*args, "--noisy-measurements", str(reference_release), "--noisy-format", "censusdp"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "bypass_single_child" in err and str(reference_release) in err
    assert not out.exists()


def test_a_folder_that_is_no_release_is_refused(tmp_path, capsys):
    out, folder = tmp_path / "out", tmp_path / "not_a_release"
    folder.mkdir()
    args = ["topdown", "--config", str(DEMO), "--output", str(out)]
    code = main([*args, "--noisy-measurements", str(folder), "--noisy-format", "censusdp"])
    assert code == 2
    assert "not a censusdp release (no manifest.json)" in capsys.readouterr().err
    assert not out.exists()


def test_evaluation_needs_the_truth(reference_release, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["topdown", "--config", str(DEMO), "--output", str(out), "--evaluate"]
    code = main(
        [*args, "--noisy-measurements", str(reference_release), "--noisy-format", "censusdp"]
    )
    assert code == 2
    assert "--evaluate compares with the truth" in capsys.readouterr().err
    assert not out.exists()


def test_a_total_the_config_holds_must_be_in_the_file(exported, tmp_path, capsys):
    """The export holds the state totals (the demo's invariants); a config that also holds the
    counties' is refused in one line naming the first county, and nothing is written."""
    config = demo_with(tmp_path, 'invariants = ["state"]', 'invariants = ["county"]')
    out = tmp_path / "out"
    args = ["topdown", "--config", str(config), "--output", str(out)]
    assert main([*args, "--noisy-measurements", str(exported)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{exported}: level county, geocode '44001': no node total in the file" in err
    assert not out.exists()


def test_another_method_from_the_file_is_that_method_s_release(
    spark, quick_tract, quick_secret, quick_reference, tmp_path
):
    """The quick tract's release (``full_information``) post-processed with ``topdown``
    equals the release made with ``topdown`` from the same secret (the same measurements: a
    change of estimation is no new measurement)."""
    csv, config = quick_tract
    topdown = tmp_path / "quick_topdown.toml"
    text = config.read_text()
    assert 'method = "full_information"' in text
    topdown.write_text(text.replace('method = "full_information"', 'method = "topdown"', 1))
    made = tmp_path / "made"
    args = ["topdown", "--config", str(topdown), "--input", str(csv), "--output", str(made)]
    assert main([*args, "--secret-file", str(quick_secret)]) == 0
    again = tmp_path / "again"
    args = ["topdown", "--config", str(topdown), "--output", str(again)]
    assert (
        main([*args, "--noisy-measurements", str(quick_reference), "--noisy-format", "censusdp"])
        == 0
    )
    assert_same_tables(spark, made, again)


def test_a_census_file_s_float_variances_are_the_config_s_exact_ones(
    spark, reference_release, exported, tmp_path
):
    """The Census's file holds each variance as a float, without our exact ``sigma2``: within
    float rounding of the config's ``sigma2`` it is read as that exact value, so the release
    is the original's, noisy table included, with no budget disagreement."""
    floats = tmp_path / "floats"
    for part in exported.rglob("*.parquet"):
        if part.is_file():
            target = floats / part.relative_to(exported)
            target.parent.mkdir(parents=True, exist_ok=True)
            table = pq.read_table(part)
            pq.write_table(
                table.drop_columns(["sigma2"]) if "sigma2" in table.column_names else table, target
            )
    for empty in exported.rglob("Constraint"):
        (floats / empty.relative_to(exported)).mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    args = ["topdown", "--config", str(DEMO), "--output", str(out), "--variances"]
    assert main([*args, "--noisy-measurements", str(floats)]) == 0
    tables = ("noisy_measurements", "estimates", "microdata", "bottom_up", "total_variances")
    assert_same_tables(spark, reference_release, out, tables)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["post_processing"]["config_budget_not_used"] == []
    assert manifest["privacy"]["rho"] == "293764/114921"
