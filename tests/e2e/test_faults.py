"""Faults lose nothing: a killed Python worker or a killed driver leaves the same release."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import assert_same_tables

ROOT = Path(__file__).resolve().parents[2]


def censusdp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [str(Path(sys.executable).parent / "censusdp"), *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def topdown_args(
    county_csv: Path, secret: Path, output: Path, master: str = "local[2]"
) -> list[str]:
    return [
        "topdown",
        "--config",
        "conf/ri_2010_demo.toml",
        "--input",
        str(county_csv),
        "--secret-file",
        str(secret),
        "--output",
        str(output),
        "--master",
        master,
    ]


def noisy_commits(output: Path) -> list[str]:
    return sorted(p.name for p in (output / "noisy_measurements" / "_delta_log").glob("*.json"))


def test_killed_python_worker_is_retried_with_identical_noise(
    spark, county_csv, fixed_secret, reference_release, tmp_path
):
    marker = tmp_path / "worker-killed"
    out = tmp_path / "out"
    # local[2,4]: up to 4 attempts per task, as on a cluster; the hook kills the first estimation worker.
    run = censusdp(
        *topdown_args(county_csv, fixed_secret, out, "local[2,4]"),
        env={"CENSUSDP_TEST_FAULT": f"python_worker_once:{marker}"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert marker.exists(), "the fault hook never fired"
    assert_same_tables(spark, reference_release, out)


def test_killed_driver_resumes_from_the_last_complete_level(
    spark, county_csv, fixed_secret, reference_release, tmp_path
):
    out = tmp_path / "out"
    killed = censusdp(
        *topdown_args(county_csv, fixed_secret, out),
        env={"CENSUSDP_TEST_FAULT": "driver_after_level:tract"},
    )
    assert killed.returncode == 17, killed.stderr[-3000:]
    assert not (out / "manifest.json").exists() and not (out / "microdata").exists()
    commits_before = noisy_commits(out)
    resumed = censusdp(*topdown_args(county_csv, fixed_secret, out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "estimate_tract" not in resumed.stderr and "[censusdp] measure" not in resumed.stderr
    assert "estimate_block_group" in resumed.stderr
    assert noisy_commits(out) == commits_before == ["00000000000000000000.json"]
    assert_same_tables(spark, reference_release, out)


def test_resume_refuses_a_run_with_another_config(county_csv, fixed_secret, tmp_path):
    out = tmp_path / "out"
    resumed = censusdp(*topdown_args(county_csv, fixed_secret, out), "--resume")
    assert resumed.returncode == 2
    assert "no run state to resume from" in resumed.stderr
