"""State-by-state post-processing (``censusdp topdown --noisy-measurements NMF --states``): a
state's run reads its ``State=`` folders alone and estimates the state as the root of its own
tree, as BlueDown's state passes do. On an NMF of three states written by ``export-nmf``: the
state's ``bottom_up`` rows are the national run's for that state, row for row (what assembling
the nation would combine); a state's estimates do not depend on the other states' folders nor
on the nation's (corrupt or missing), nor on which other states run with it; the release has no
nation row, spends no budget and its manifest names the states; a bad state code or a missing
State folder is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from censusdp_spark.cli import main
from tests.conftest import ROOT, owner_only_secret
from tests.helpers.cli import censusdp_stopped_after
from tests.helpers.release import assert_same_tables

DEMO = ROOT / "conf" / "ri_2010_demo.toml"
# Three states of real RI 2010 blocks (274 in all): one tract each, two of them relabelled.
STATES = {"44": "44001030100", "45": "44001030200", "09": "44001030700"}
TABLES = ("noisy_measurements", "estimates", "bottom_up", "microdata", "total_variances")


def three_states_csv(path: Path) -> Path:
    """The blocks of ``STATES``' tracts, each under its state's code (geocode and column)."""
    lines = (ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()
    rows = [lines[0]]
    for state, tract in STATES.items():
        for line in lines[1:]:
            if line.startswith(tract):
                geoid, _, rest = line.split(",", 2)
                rows.append(",".join([state + geoid[2:], state, rest]))
    path.write_text("\n".join(rows) + "\n")
    return path


def topdown(*args: str, config: Path = DEMO) -> list[str]:
    return ["topdown", "--config", str(config), *args]


@pytest.fixture(scope="module")
def national(tmp_path_factory) -> Path:
    """A TopDown release of the three states (the demo config: full information, the state
    totals held exact)."""
    tmp = tmp_path_factory.mktemp("three_states")
    csv = three_states_csv(tmp / "blocks.csv")
    secret = owner_only_secret(tmp_path_factory.mktemp("three_states_secret"), "3c")
    out = tmp / "release"
    args = ["--input", str(csv), "--output", str(out), "--secret-file", str(secret)]
    assert main(topdown(*args)) == 0
    return out


@pytest.fixture(scope="module")
def nmf(national, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("three_states_nmf") / "nmf"
    assert main(["export-nmf", "--release", str(national), "--output", str(out)]) == 0
    return out


def state_run(
    source: Path, out: Path, states: str, fmt: str = "census_nmf", config: Path = DEMO
) -> Path:
    """A state-by-state run (with ``total_variances`` when the config's method has them)."""
    args = ["--output", str(out), "--noisy-measurements", str(source), "--noisy-format", fmt]
    variances = ["--variances"] if config == DEMO else []
    assert main(topdown(*args, "--states", states, *variances, config=config)) == 0
    return out


@pytest.fixture(scope="module")
def rhode_island(nmf, tmp_path_factory) -> Path:
    return state_run(nmf, tmp_path_factory.mktemp("state_44") / "out", "44")


def rows(spark, release: Path, table: str, state: str | None = None):
    df = spark.read.format("delta").load(str(release / table))
    return df if state is None else df.filter(F.col("geocode").startswith(state))


def test_a_states_bottom_up_is_the_national_runs_for_that_state(spark, national, rhode_island):
    """Each state node's bottom-up fit uses its subtree alone: the per-state pass BlueDown runs
    before it combines the states at the root."""
    ours = rows(spark, rhode_island, "bottom_up")
    theirs = rows(spark, national, "bottom_up", "44").filter(F.col("level") != "nation")
    assert ours.count() == theirs.count() > 0
    assert ours.exceptAll(theirs).count() == 0


def test_the_release_is_the_states_tree_without_a_nation(spark, nmf, rhode_island):
    estimates = rows(spark, rhode_island, "estimates")
    levels = {r["level"] for r in estimates.select("level").distinct().collect()}
    assert levels == {"state", "county", "tract", "block_group", "block"}
    assert estimates.filter(~F.col("geocode").startswith("44")).count() == 0
    state = estimates.filter(F.col("level") == "state").agg(F.sum("count")).first()[0]
    lines = (ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()[1:]
    assert state == sum(int(ln.split(",")[4]) for ln in lines if ln.startswith(STATES["44"]))
    held = json.loads((rhode_island / "manifest.json").read_text())
    processing = held["post_processing"]
    assert processing["rho_spent_by_this_release"] == "0"
    assert processing["state_by_state"]["states"] == ["44"]
    assert processing["state_by_state"]["levels_released"][0] == "state"
    assert held["guarantee_checks"]["invariants_broken"] == 0
    assert held["nodes"]["state"] == 1 and "nation" not in held["nodes"]


def test_other_states_and_the_nation_are_not_read(spark, nmf, rhode_island, tmp_path):
    """The nation's folder gone, another state's block file garbage, a third state's tract
    folder missing: state 44's run is the same, row for row."""
    broken = tmp_path / "nmf"
    shutil.copytree(nmf, broken)
    shutil.rmtree(broken / "US.parquet")
    for f in (broken / "Block.parquet" / "DPQuery" / "State=45").iterdir():
        f.write_bytes(b"not parquet")
    shutil.rmtree(broken / "Tract.parquet" / "DPQuery" / "State=09")
    again = state_run(broken, tmp_path / "out", "44")
    assert_same_tables(spark, rhode_island, again, TABLES)


def test_each_state_of_a_run_is_its_own_tree(spark, nmf, rhode_island, tmp_path):
    both = state_run(nmf, tmp_path / "out", "09,44")
    for table in TABLES:
        alone = rows(spark, rhode_island, table)
        together = rows(spark, both, table, "44")
        assert alone.count() == together.count() > 0, table
        assert alone.exceptAll(together).count() == 0, table
    assert rows(spark, both, "estimates", "09").count() > 0


def stopped_and_resumed(step: str, out: Path, args: list[str]) -> list[str]:
    """The run of ``args`` (writing to ``out``) stopped once ``step`` is committed, then
    resumed: the copy, bottom-up and estimation stages the resumed run did, in order."""
    censusdp_stopped_after(step, *args)
    assert main([*args, "--resume"]) == 0
    timings = json.loads((out / "manifest.json").read_text())["timings_s"]
    return [k for k in timings if k.startswith(("copy_", "bottom_up_", "estimate_"))]


def test_a_resumed_state_run_does_again_only_what_it_had_not_committed(
    spark, nmf, rhode_island, tmp_path
):
    """A state's run stopped once its county estimates are committed, then resumed: the copy
    of the measurements, the bottom-up pass and the state and county estimates are not done
    again (the resume check reads the state's levels, not the nation's), and the release is
    the undisturbed run's, row for row."""
    out = tmp_path / "out"
    args = topdown(
        *("--output", str(out), "--noisy-measurements", str(nmf)),
        *("--noisy-format", "census_nmf", "--states", "44", "--variances"),
    )
    redone = stopped_and_resumed("county", out, args)
    assert redone == ["estimate_tract", "estimate_block_group", "estimate_block"]
    assert_same_tables(spark, rhode_island, out, TABLES)


def test_a_censusdp_release_runs_state_by_state_alike(spark, national, rhode_island, tmp_path):
    again = state_run(national, tmp_path / "out", "44", fmt="censusdp")
    assert_same_tables(spark, rhode_island, again, TABLES)


def test_the_api_runs_state_by_state_alike(spark, nmf, rhode_island, tmp_path):
    from censusdp_spark import run_topdown

    release = run_topdown(
        DEMO,
        spark=spark,
        output=tmp_path / "out",
        noisy_measurements=nmf,
        states="44",
        variances=True,
    )
    assert release.summary.levels[0] == "state"
    assert_same_tables(spark, rhode_island, tmp_path / "out", TABLES)


def test_the_census_method_runs_state_by_state_too(spark, nmf, tmp_path):
    """With ``method = "topdown"`` the state is fitted to its own answers alone, its total
    held; every guarantee holds."""
    config = tmp_path / "census_method.toml"
    text = DEMO.read_text().replace('"data/', f'"{ROOT}/data/')
    config.write_text(text.replace('method = "full_information"', 'method = "topdown"', 1))
    out = state_run(nmf, tmp_path / "out", "45", config=config)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["estimation"]["method"] == "topdown"
    assert set(manifest["guarantee_checks"].values()) == {0}
    estimates = rows(spark, out, "estimates")
    assert estimates.filter(~F.col("geocode").startswith("45")).count() == 0
    totals = estimates.groupBy("level").agg(F.sum("count").alias("n")).collect()
    assert len({r["n"] for r in totals}) == 1  # every level sums to the held state total


def refused(args: list[str], capsys) -> str:
    assert main(args) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("states", "message"),
    [
        ("99", "state '99': unknown: the file has no State=99 folder (3 states: 09, 44, 45)"),
        ("4", "state '4': not a state code: level state's geocodes have 2 characters"),
    ],
)
def test_a_bad_state_code_is_refused_in_one_line(nmf, tmp_path, capsys, states, message):
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    assert message in refused(topdown(*args, "--states", states), capsys)


def test_a_state_given_twice_is_a_usage_error(nmf, tmp_path, capsys):
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    with pytest.raises(SystemExit) as exit_:
        main(topdown(*args, "--states", "44,44"))
    assert exit_.value.code == 2
    assert "argument --states: '44,44': a state given twice" in capsys.readouterr().err


def test_a_missing_state_folder_is_refused_in_one_line(nmf, tmp_path, capsys):
    broken = tmp_path / "nmf"
    shutil.copytree(nmf, broken)
    shutil.rmtree(broken / "Block_Group.parquet" / "DPQuery" / "State=45")
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(broken)]
    line = refused(topdown(*args, "--states", "45"), capsys)
    assert "Block_Group.parquet/DPQuery/State=45" in line
    assert "missing: state 45 has no measurements at level block_group" in line
    assert not (tmp_path / "out").exists()


def test_states_without_noisy_measurements_are_refused(tmp_path, capsys):
    line = refused(topdown("--output", str(tmp_path / "out"), "--states", "44"), capsys)
    assert "--states: a state-by-state run estimates given noisy measurements" in line


# --- the nation assembled from state runs ----------------------------------------------------


def assemble(source: Path, out: Path, *parts: Path, fmt: str = "census_nmf") -> Path:
    args = ["--output", str(out), "--noisy-measurements", str(source), "--noisy-format", fmt]
    runs = [str(p) for p in parts]
    assert main(topdown(*args, "--assemble-nation", *runs, "--variances")) == 0
    return out


@pytest.fixture(scope="module")
def assembled(nmf, rhode_island, tmp_path_factory) -> tuple[Path, Path, Path]:
    """The nation assembled from two state runs (44; 09 and 45), then the three states held
    to it in one run: (the nation's release, the states' release, the run of 09 and 45)."""
    tmp = tmp_path_factory.mktemp("assembled")
    others = state_run(nmf, tmp / "states_09_45", "09,45")
    nation = assemble(nmf, tmp / "nation", rhode_island, others)
    args = ["--output", str(tmp / "states"), "--noisy-measurements", str(nmf), "--variances"]
    held = ["--states", "09,44,45", "--state-estimates", str(nation)]
    assert main(topdown(*args, *held)) == 0
    return nation, tmp / "states", others


def test_the_assembled_nation_is_the_national_run_row_for_row(
    spark, national, rhode_island, assembled
):
    """BlueDown's four passes as three kinds of run: the nation's release (nation and states)
    and the held states' release (the levels below) are the national run's release."""
    nation, states, _ = assembled
    top = F.col("level").isin("nation", "state")
    for table in ("estimates", "bottom_up"):
        ours = rows(spark, nation, table).unionByName(rows(spark, states, table).filter(~top))
        theirs = rows(spark, national, table)
        assert ours.count() == theirs.count() > 0, table
        assert ours.exceptAll(theirs).count() == 0, table
    assert_same_tables(spark, national, states, ("microdata",))
    state = F.col("level") == "state"
    held = rows(spark, states, "estimates").filter(state)
    assert held.exceptAll(rows(spark, nation, "estimates").filter(state)).count() == 0
    assert held.count() > 0
    variances = rows(spark, nation, "total_variances", "44").filter(state)
    alone = rows(spark, rhode_island, "total_variances").filter(state)
    assert variances.count() == 1 and variances.exceptAll(alone).count() == 0
    assert rows(spark, nation, "total_variances").filter(F.col("level") == "nation").count() == 1


def test_a_resumed_assembly_does_again_only_what_it_had_not_committed(
    spark, nmf, rhode_island, assembled, tmp_path
):
    """The nation's assembly stopped once the nation's estimates are committed, then resumed:
    only the states' estimates are made (the resume check reads the nation and the states),
    and the release is the undisturbed assembly's, row for row."""
    nation, _, others = assembled
    out = tmp_path / "nation"
    args = topdown(
        *("--output", str(out), "--noisy-measurements", str(nmf), "--noisy-format", "census_nmf"),
        *("--assemble-nation", str(rhode_island), str(others), "--variances"),
    )
    assert stopped_and_resumed("nation", out, args) == ["estimate_state"]
    assert_same_tables(spark, nation, out, ("estimates", "bottom_up", "total_variances"))


def test_the_assembled_nations_release_names_its_state_runs(spark, nmf, assembled):
    nation, states, _ = assembled
    manifest = json.loads((nation / "manifest.json").read_text())
    runs = manifest["post_processing"]["state_runs"]
    assert runs["states"] == ["09", "44", "45"] and len(runs["runs"]) == 2
    assert runs["levels_released"] == ["nation", "state"]
    assert manifest["post_processing"]["rho_spent_by_this_release"] == "0"
    assert set(manifest["guarantee_checks"].values()) == {0}
    assert "microdata" not in manifest["tables"]
    levels = {r["level"] for r in rows(spark, nation, "estimates").select("level").collect()}
    assert levels == {"nation", "state"}
    held = json.loads((states / "manifest.json").read_text())
    assert held["post_processing"]["state_by_state"]["state_estimates"] == str(nation)
    # the states' bottom-up rows come from the state runs: the pass is not run again
    assert "copy_bottom_up" in held["timings_s"]
    assert not any(k.startswith("bottom_up_") for k in held["timings_s"])


def test_a_state_held_to_a_nation_whose_runs_are_gone_computes_its_bottom_up_again(
    spark, nmf, assembled, tmp_path
):
    nation, states, _ = assembled
    moved = tmp_path / "nation"
    shutil.copytree(nation, moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["post_processing"]["state_runs"]["runs"][0] = str(tmp_path / "gone")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    assert main(topdown(*args, "--states", "45", "--state-estimates", str(moved))) == 0
    timings = json.loads((tmp_path / "out" / "manifest.json").read_text())["timings_s"]
    assert "bottom_up_block" in timings and "copy_bottom_up" not in timings
    for table in ("estimates", "bottom_up"):
        again = rows(spark, tmp_path / "out", table)
        assert again.count() > 0
        assert again.exceptAll(rows(spark, states, table, "45")).count() == 0, table


def test_the_api_assembles_a_nation_from_a_censusdp_release_alike(
    spark, national, rhode_island, assembled, tmp_path
):
    """The root's measurements read from the release the NMF was exported from: the same
    nation."""
    from censusdp_spark import run_topdown

    nation, _, others = assembled
    release = run_topdown(
        DEMO,
        spark=spark,
        output=tmp_path / "out",
        noisy_measurements=national,
        noisy_format="censusdp",
        assemble_nation=[rhode_island, others],
        variances=True,
    )
    assert release.summary.levels == ["nation", "state"]
    assert_same_tables(spark, nation, tmp_path / "out", ("estimates", "bottom_up"))


def test_a_nation_without_every_state_is_refused(nmf, rhode_island, tmp_path, capsys):
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    line = refused(topdown(*args, "--assemble-nation", str(rhode_island)), capsys)
    assert "no run of state 09 (the nation needs every state: 2 of 3 missing)" in line
    assert not (tmp_path / "out").exists()


def test_a_state_in_two_runs_is_refused(nmf, rhode_island, tmp_path, capsys):
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    twice = ["--assemble-nation", str(rhode_island), str(rhode_island)]
    assert "state 44 is also in" in refused(topdown(*args, *twice), capsys)


def test_a_national_release_is_not_a_state_run(nmf, national, tmp_path, capsys):
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    line = refused(topdown(*args, "--assemble-nation", str(national)), capsys)
    assert "not a state-by-state run (made without --states)" in line


def test_states_held_to_a_release_not_assembled_are_refused(nmf, national, tmp_path, capsys):
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    held = ["--states", "44", "--state-estimates", str(national)]
    line = refused(topdown(*args, *held), capsys)
    assert "not a nation assembled from state runs (made without --assemble-nation)" in line


def test_a_state_run_of_another_method_is_refused(nmf, rhode_island, tmp_path, capsys):
    config = tmp_path / "census_method.toml"
    text = DEMO.read_text().replace('"data/', f'"{ROOT}/data/')
    config.write_text(text.replace('method = "full_information"', 'method = "topdown"', 1))
    args = ["--output", str(tmp_path / "out"), "--noisy-measurements", str(nmf)]
    line = refused(topdown(*args, "--assemble-nation", str(rhode_island), config=config), capsys)
    assert "estimated with full_information" in line and "estimates with topdown" in line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--assemble-nation", "x"], "--assemble-nation: the nation's measurements come from"),
        (["--state-estimates", "x"], "--state-estimates: holds the states of a state-by-state"),
    ],
)
def test_assembly_options_without_their_partners_are_refused(tmp_path, capsys, extra, message):
    assert message in refused(topdown("--output", str(tmp_path / "out"), *extra), capsys)
