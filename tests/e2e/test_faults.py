"""Faults lose nothing: a killed Python worker or a killed driver leaves the same release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from tests.helpers.cli import censusdp_with_fault
from tests.helpers.release import assert_same_tables

pytestmark = pytest.mark.slow  # the faults run the CLI in a JVM subprocess of its own


def topdown_args(quick_tract: tuple[Path, Path], secret: Path, output: Path) -> list[str]:
    """The quick tract's release (nation > tract > block): the faults are about a process and
    the run state, not the hierarchy's depth."""
    csv, config = quick_tract
    return [
        *("topdown", "--config", str(config), "--input", str(csv)),
        *("--secret-file", str(secret), "--output", str(output), "--master", "local[2]"),
    ]


def resume_in_process(
    quick_tract: tuple[Path, Path], secret: Path, output: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """``--resume`` through ``main`` in this process, on the tests' Spark session: the run
    after a fault is not about a process, only the fault is. Returns the exit code and stderr."""
    capsys.readouterr()  # what earlier steps printed
    code = main([*topdown_args(quick_tract, secret, output), "--resume"])
    return code, capsys.readouterr().err


def noisy_commits(output: Path) -> list[str]:
    return sorted(p.name for p in (output / "noisy_measurements" / "_delta_log").glob("*.json"))


def test_killed_python_worker_is_retried_with_identical_noise(
    spark, quick_tract, quick_secret, quick_reference, tmp_path
):
    """A retried task draws the same noise: the release equals the undisturbed one with the
    same secret."""
    marker = tmp_path / "worker-killed"
    out = tmp_path / "out"
    # local[2,4]: up to 4 attempts per task, as on a cluster; the hook kills the first estimation worker.
    args = [*topdown_args(quick_tract, quick_secret, out)[:-1], "local[2,4]"]
    run = censusdp_with_fault(["--kill-worker-once", str(marker)], *args)
    assert run.returncode == 0, run.stderr[-3000:]
    assert marker.exists(), "the fault hook never fired"
    assert_same_tables(spark, quick_reference, out)


@pytest.fixture(scope="module")
def killed_after_tract(quick_tract, quick_secret, tmp_path_factory) -> Path:
    """The output of a run whose driver was killed once the tract level was committed."""
    out = tmp_path_factory.mktemp("killed") / "out"
    killed = censusdp_with_fault(
        ["--kill-driver-after", "tract"], *topdown_args(quick_tract, quick_secret, out)
    )
    assert killed.returncode == 17, killed.stderr[-3000:]
    assert not (out / "manifest.json").exists() and not (out / "microdata").exists()
    return out


def copy_of(killed: Path, out: Path) -> Path:
    """The killed run's output and private folder at ``out`` (the run state names its output)."""
    shutil.copytree(killed, out)
    private = out.parent / f"{out.name}.private"
    shutil.copytree(killed.parent / f"{killed.name}.private", private)
    state = json.loads((private / "state.json").read_text())
    (private / "state.json").write_text(json.dumps({**state, "output": str(out)}))
    return private


def plain_parquet_rows(spark, table: Path) -> int:
    """What a reader that ignores the Delta log counts: every Parquet file in the folder."""
    return spark.read.option("basePath", str(table)).parquet(str(table / "level=*")).count()


def test_killed_driver_resumes_from_the_last_complete_level(
    spark, quick_tract, quick_secret, quick_reference, killed_after_tract, tmp_path, capsys
):
    out = tmp_path / "out"
    copy_of(killed_after_tract, out)
    commits_before = noisy_commits(out)
    code, err = resume_in_process(quick_tract, quick_secret, out, capsys)
    assert code == 0, err[-3000:]
    assert "estimate_nation" not in err and "estimate_tract" not in err
    assert "[censusdp] measure" not in err and "estimate_block" in err
    assert noisy_commits(out) == commits_before == ["00000000000000000000.json"]
    assert_same_tables(spark, quick_reference, out)


def test_resume_refuses_a_run_with_another_config(quick_tract, quick_secret, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = resume_in_process(quick_tract, quick_secret, out, capsys)
    assert code == 2
    assert "no run state to resume from" in err


def test_resume_removes_the_parquet_files_no_delta_commit_references(
    spark, quick_tract, quick_secret, quick_reference, killed_after_tract, tmp_path, capsys
):
    """A block write killed mid-way leaves data files outside the Delta log: a plain-Parquet
    reader would count them. The resumed run removes them before it writes."""
    out = tmp_path / "out"
    copy_of(killed_after_tract, out)
    estimates = out / "estimates"
    written = next((estimates / "level=tract").glob("*.parquet"))
    orphans = [estimates / "level=block" / "part-09999-killed.c000.snappy.parquet"]
    orphans.append(estimates / "level=tract" / "part-09998-killed.c000.snappy.parquet")
    for orphan in orphans:
        orphan.parent.mkdir(exist_ok=True)
        shutil.copy(written, orphan)
    code, err = resume_in_process(quick_tract, quick_secret, out, capsys)
    assert code == 0, err[-3000:]
    assert not any(orphan.exists() for orphan in orphans)
    assert "removed 2 uncommitted file(s) from estimates" in err
    delta_rows = spark.read.format("delta").load(str(estimates)).count()
    assert plain_parquet_rows(spark, estimates) == delta_rows
    assert_same_tables(spark, quick_reference, out)


def test_resume_redoes_a_level_the_run_state_claims_but_its_table_lacks(
    spark, quick_tract, quick_secret, quick_reference, killed_after_tract, tmp_path, capsys
):
    out = tmp_path / "out"
    private = copy_of(killed_after_tract, out)
    state = json.loads((private / "state.json").read_text())
    assert state["steps_done"][-1] == "tract"
    state["steps_done"] += ["block"]  # claimed, never written
    (private / "state.json").write_text(json.dumps(state))
    code, err = resume_in_process(quick_tract, quick_secret, out, capsys)
    assert code == 0, err[-3000:]
    assert "block is done but its table is missing or incomplete" in err
    assert "estimate_tract" not in err and "estimate_block" in err
    assert_same_tables(spark, quick_reference, out)


@pytest.mark.parametrize(
    "garbled",
    ["", "{not json", "[]", '{"release": "topdown"}', "TYPES"],
    ids=["empty", "not_json", "a_list", "missing_fields", "wrong_types"],
)
def test_a_garbled_run_state_is_one_line_naming_the_file(
    spark, quick_tract, quick_secret, tmp_path, capsys, garbled
):
    out = tmp_path / "out"
    private = tmp_path / "out.private"
    private.mkdir(mode=0o700)
    if garbled == "TYPES":
        garbled = json.dumps(
            {
                "release": "topdown",
                "output": str(out),
                "parts": {"input": {"input": "0" * 64}},
                "secret_fingerprint": "f",
                "measured": "yes",
                "steps_done": "tract",
            }
        )
    (private / "state.json").write_text(garbled)
    code = main([*topdown_args(quick_tract, quick_secret, out), "--resume"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("[censusdp]")]
    assert code == 2
    assert len(err) == 1 and str(private / "state.json") in err[0], err
    assert "unreadable run state" in err[0] and "fresh run" in err[0]
