"""The synthetic-data job through Spark on the real reduced PUMS data, writing Delta."""

from __future__ import annotations

import contextlib
import io
import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.cli import main as synth_main
from censusdp_spark.release.runner import evaluation_dir_for
from censusdp_spark.synth.config import load_synth_config
from censusdp_spark.synth.domain import Binning, encode_tables
from censusdp_spark.synth.job import SynthSummary
from censusdp_spark.synth.spark import binning_hits, read_linked, workload_counts
from censusdp_spark.synth.workloads import (
    count_answers,
    marginal_workloads,
    relationship_workloads,
    size_workload,
    totals_of,
)
from tests.helpers.pums import duplicate_person, real_tables
from tests.helpers.release import assert_release_unchanged

ROOT = Path(__file__).resolve().parents[2]
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
def released(spark, secret, tmp_path_factory) -> tuple[Path, str]:
    """The release of the reduced config, and the summary ``censusdp synth`` printed."""
    out = tmp_path_factory.mktemp("synth") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
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
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def release(released) -> Path:
    return released[0]


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
    evaluation = delta(spark, evaluation_dir_for(release) / "table")
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
    assert [r["round"] for r in rounds] == [0] * 9 + [1, 2]  # 8 one-way marginals, the sizes
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
    assert set(noisy["round"]) == {0, 1, 2} and set(noisy["workload"]) == {
        r["measurement"] for r in rounds
    }
    assert "max_error" not in json.dumps(manifest)


def test_the_run_summary_states_the_privacy_unit_as_the_manifest_records_it(released):
    release, printed = released
    unit = json.loads((release / "manifest.json").read_text())["privacy"]["unit"]
    assert unit["neighbours"].startswith("neighbouring inputs differ in one person's individual")
    assert f"  privacy unit: {unit['neighbours']}\n" in printed
    assert f"  public (not protected): {'; '.join(unit['public'])}\n" in printed
    assert "who lives with whom (household membership)" in printed


def test_the_run_summary_says_how_many_households_were_dropped_and_why(released):
    _, printed = released
    assert "3414 households, 6349 persons in the input (public totals)" in printed
    assert (
        '799 households of more than 3 persons dropped (input.larger_households = "drop");'
        " not in the totals above"
    ) in printed


def test_a_summary_of_a_config_that_refuses_larger_households_counts_no_drop():
    summary = SynthSummary(
        output=Path("out"),
        method="mwem",
        rho=Fraction(1, 2),
        epsilon=3.0,
        delta=1e-9,
        households=10,
        individuals=20,
        elapsed_s=1.0,
    )
    assert "dropped" not in summary.text()
    summary.dropped_oversize, summary.max_members = 0, 4
    assert "  0 households of more than 4 persons dropped" in summary.text()


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


def bad_input_run(tmp_path, secret, households, persons, config_edit=lambda t: t) -> Path:
    """Write the (edited) real tables and config to ``tmp_path``, run ``censusdp synth`` on them
    and return the output folder it was asked to create."""
    households.to_csv(tmp_path / "households.csv", index=False)
    persons.to_csv(tmp_path / "persons.csv", index=False)
    conf = tmp_path / "bad.toml"
    conf.write_text(
        config_edit(
            REDUCED.read_text()
            .replace('"data/pums/persons.csv"', f'"{tmp_path / "persons.csv"}"')
            .replace('"data/pums/households.csv"', f'"{tmp_path / "households.csv"}"')
        )
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
    return out


def _orphan(h: pd.DataFrame, p: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    return h[h["SERIALNO"] != p.loc[9, "SERIALNO"]], p  # data row 10's household is gone


def _unmapped_sex(h: pd.DataFrame, p: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = p.copy()
    p.loc[7, "SEX"] = "9"
    return h, p


def _unmapped_tenure(h: pd.DataFrame, p: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    h = h.copy()
    h.loc[4, "TEN"] = "8"
    return h, p


def _two_heads(h: pd.DataFrame, p: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = p.copy()
    serial = p.loc[p["RELP"] == "1", "SERIALNO"].iloc[0]  # a household with a spouse
    p.loc[(p["SERIALNO"] == serial) & (p["RELP"] == "1"), "RELP"] = "0"
    return h, p


def _twice(p: pd.DataFrame) -> tuple[int, str]:
    """``(row, household)`` of the first row of the person listed twice (1-based)."""
    repeated = p.duplicated(["SERIALNO", "SPORDER"], keep=False).to_numpy()
    first = int(np.flatnonzero(repeated)[0])
    return first + 1, str(p["SERIALNO"].iloc[first])


def _row_of(frame: pd.DataFrame, column: str, value: str) -> int:
    return int(np.flatnonzero(frame[column].to_numpy() == value)[0]) + 1


@pytest.mark.parametrize(
    ("breaks", "where"),
    [
        (
            _orphan,
            lambda h, p: (
                f"persons.csv: row {_row_of(p, 'SERIALNO', p.loc[9, 'SERIALNO'])}, column "
                f"SERIALNO: person of household {p.loc[9, 'SERIALNO']!r}, which is missing from "
                "the household table"
            ),
        ),
        (
            _unmapped_sex,
            lambda h, p: (
                "persons.csv: row 8, column SEX: value outside the declared domain of 'sex'"
            ),
        ),
        (
            _unmapped_tenure,
            lambda h, p: (
                "households.csv: row 5, column TEN: value outside the declared domain of 'tenure'"
            ),
        ),
        (_two_heads, lambda h, p: "members of relationship = 'householder' (column RELP)"),
        (
            duplicate_person,
            lambda h, p: (
                f"persons.csv: row {_twice(p)[0]}, column SERIALNO+SPORDER: person '2' of"
                f" household {_twice(p)[1]!r} appears 2 times"
            ),
        ),
    ],
    ids=[
        "person-without-household",
        "person-value-outside-domain",
        "household-value-outside-domain",
        "two-heads",
        "person-listed-twice",
    ],
)
def test_bad_input_is_one_line_naming_file_row_and_rule_and_writes_nothing(
    spark, secret, tmp_path, capsys, breaks, where
):
    households, persons = breaks(*real_tables())
    out = bad_input_run(tmp_path, secret, households, persons)
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and where(households, persons) in err, err
    assert not out.exists()


def test_household_larger_than_m_is_an_error_unless_the_config_drops_them(
    spark, secret, tmp_path, capsys
):
    households, persons = real_tables()
    out = bad_input_run(
        tmp_path, secret, households, persons, lambda t: t.replace('larger_households = "drop"', "")
    )
    err = capsys.readouterr().err.strip()
    found = re.search(
        r"households\.csv: row (\d+), column SERIALNO: household '(\d+)' has (\d+) persons, "
        r"more than input\.max_members = 3",
        err,
    )
    assert found and "\n" not in err, err
    row, key, n = int(found[1]), found[2], int(found[3])
    assert households["SERIALNO"].iloc[row - 1] == key
    assert n == (persons["SERIALNO"] == key).sum() > 3
    assert not out.exists()


def test_a_column_declared_at_both_levels_is_refused_naming_file_and_key(
    spark, secret, tmp_path, capsys
):
    households, persons = real_tables()
    both = lambda t: t.replace('column = "SEX"', 'column = "TEN"')  # noqa: E731
    out = bad_input_run(tmp_path, secret, households, persons, both)
    err = capsys.readouterr().err.strip()
    assert "bad.toml: [group/individual] column 'TEN' is declared at both levels" in err, err
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


def test_spark_domain_rule_maps_exactly_what_the_encoding_maps(spark):
    """The Spark row rule and the pandas encoding read the same Binning; edge cases agree."""
    binnings = [
        Binning("x", values={1.0: 0, 2.0: 1, "A": 2}),
        Binning("x", values={1.0: 0, 2.0: 1}, missing=1),
        Binning("x", ranges=((-1e9, 18.0, 0), (18.0, 65.0, 1))),
    ]
    raw = ["1", " 2 ", "2.0", "A", " A", "a", "", "  ", None, "17.5", "18", "65", "-3", "x1", "3"]
    frame = spark.createDataFrame(pd.DataFrame({"x": raw}, dtype=object))
    for binning in binnings:
        codes = binning.encode(pd.Series(raw, dtype=object))
        for levels in ({0}, {1}, {0, 1, 2}):
            hits = frame.select(binning_hits(binning, levels).alias("h")).toPandas()["h"]
            assert hits.tolist() == np.isin(codes, list(levels)).tolist(), (binning, levels)


def test_the_release_is_the_recorded_one_bit_for_bit(spark, release):
    """The reduced PUMS config, HPD-Fixed, the module's fixed secret: every table as recorded
    (a refactor changes no release)."""
    assert_release_unchanged(spark, release, "synth_pums_reduced_hpd_fixed")
