"""The synthetic-data job through Spark on the real reduced PUMS data, writing Delta."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.cli import main as synth_main
from censusdp_spark.engine.synth import read_linked, workload_counts
from censusdp_spark.synth.config import load_synth_config
from censusdp_spark.synth.domain import encode_tables
from censusdp_spark.synth.workloads import (
    count_answers,
    marginal_workloads,
    relationship_workloads,
    size_workload,
    totals_of,
)

ROOT = Path(__file__).resolve().parents[1]
REDUCED = ROOT / "conf" / "synth_pums_reduced.toml"


def run(*args: str) -> int:
    return synth_main(["synth", "--config", str(REDUCED), *args])


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret.hex"
    path.write_text("c3" * 32 + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def release(spark, secret, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "out"
    code = run(
        "--method",
        "hpd_fixed",
        "--rho",
        "1/2",
        "--rounds",
        "2",
        "--output",
        str(out),
        "--secret-file",
        str(secret),
        "--evaluate",
    )
    assert code == 0
    return out


def delta(spark, path: Path) -> pd.DataFrame:
    return spark.read.format("delta").load(str(path)).toPandas()


def test_spark_partial_sums_equal_the_driver_answers_on_the_real_data(spark):
    config = load_synth_config(ROOT / "conf" / "synth_pums.toml", ROOT)
    domain, spec = config.domain, config.input
    workloads = (
        marginal_workloads(domain, 2) + size_workload(domain) + relationship_workloads(domain, 2)
    )
    counted = workload_counts(
        read_linked(spark, spec, domain), domain, workloads, spec.household_id, spec.member_order
    )
    encoded = encode_tables(
        domain,
        pd.read_csv(spec.households, dtype=str),
        pd.read_csv(spec.persons, dtype=str),
        spec.household_id,
        spec.member_order,
    )
    np.testing.assert_array_equal(
        counted.counts, count_answers(encoded.households, domain, workloads)
    )
    assert counted.totals == totals_of(encoded.households, domain)
    assert counted.dropped_oversize == encoded.dropped_oversize == 2  # the two 12-person households


def test_job_writes_synthetic_tables_evaluation_and_manifest(spark, release):
    for table in (
        "synthetic_households",
        "synthetic_persons",
        "noisy_measurements",
        "evaluation/table",
    ):
        assert (release / table / "_delta_log").is_dir(), table
    households = delta(spark, release / "synthetic_households")
    persons = delta(spark, release / "synthetic_persons")
    assert len(households) == 3414 and set(households.columns) >= {
        "household_id",
        "tenure",
        "income",
        "members",
    }
    assert len(persons) == households["members"].sum()
    heads = persons[persons["member"] == 1]
    assert (heads["relationship"] == "householder").all() and len(heads) == 3414
    evaluation = delta(spark, release / "evaluation" / "table")
    assert set(zip(evaluation["target"], evaluation["query_class"], strict=True)) == {
        ("model", "Q_G"),
        ("model", "Q_I"),
        ("tables", "Q_G"),
        ("tables", "Q_I"),
        ("tables", "Q_R"),
    }
    assert (evaluation["max_error"] < 0.5).all()


def test_manifest_accounts_rho_per_round_exactly_and_holds_no_truth(spark, release):
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["method"] == "hpd_fixed" and manifest["privacy"]["rho"] == "1/2"
    rounds = manifest["budget"]
    assert [r["round"] for r in rounds] == [1, 2]
    assert sum(Fraction(r["rho_select"]) + Fraction(r["rho_measure"]) for r in rounds) == Fraction(
        1, 2
    )
    assert manifest["public_totals"] == {
        "households": 3414,
        "individuals": 6349,
        "max_members": 3,
        "households_dropped_over_max_members": 799,
    }
    noisy = delta(spark, release / "noisy_measurements")
    assert set(noisy["round"]) == {1, 2} and set(noisy["workload"]) == {
        r["measurement"] for r in rounds
    }
    assert "max_error" not in json.dumps(manifest)


def test_secret_never_reaches_the_output(release, secret):
    hexsecret = secret.read_text().strip()
    for path in release.rglob("*"):
        if path.is_file():
            assert hexsecret.encode() not in path.read_bytes(), path


def test_existing_output_is_kept_without_overwrite(spark, release, secret, capsys):
    before = sorted(p.name for p in release.iterdir())
    assert (
        run("--method", "independent", "--output", str(release), "--secret-file", str(secret)) == 2
    )
    assert "output exists; pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in release.iterdir()) == before


def test_unmapped_input_value_is_one_line_and_writes_nothing(spark, secret, tmp_path, capsys):
    persons = pd.read_csv(ROOT / "data" / "pums" / "persons.csv", dtype=str)
    persons.loc[7, "SEX"] = "9"
    persons.to_csv(tmp_path / "persons.csv", index=False)
    conf = tmp_path / "bad.toml"
    conf.write_text(
        REDUCED.read_text()
        .replace('"data/pums/persons.csv"', f'"{tmp_path / "persons.csv"}"')
        .replace('"data/pums/households.csv"', f'"{ROOT / "data" / "pums" / "households.csv"}"')
    )
    out = tmp_path / "out"
    code = synth_main(
        [
            "synth",
            "--config",
            str(conf),
            "--method",
            "independent",
            "--output",
            str(out),
            "--secret-file",
            str(secret),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert (
        "\n" not in err
        and "persons.csv: column SEX: 1 value(s) map to no level of 'sex' (e.g. 9)" in err
    )
    assert not out.exists()


@pytest.mark.slow
def test_same_secret_reproduces_the_released_tables(spark, release, secret, tmp_path):
    again = tmp_path / "again"
    assert (
        run(
            "--method",
            "hpd_fixed",
            "--rho",
            "1/2",
            "--rounds",
            "2",
            "--output",
            str(again),
            "--secret-file",
            str(secret),
        )
        == 0
    )
    for table in ("synthetic_households", "synthetic_persons", "noisy_measurements"):
        a = (
            delta(spark, release / table)
            .sort_values(list(delta(spark, release / table).columns))
            .reset_index(drop=True)
        )
        b = delta(spark, again / table).sort_values(list(a.columns)).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)
