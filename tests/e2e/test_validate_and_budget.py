"""``censusdp budget`` and ``censusdp validate`` understand every release's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from censusdp_spark.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "conf").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_budget_prints_the_table_of_every_shipped_config(path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["budget", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"budget of {path}")
    assert "epsilon" in out


def test_the_group_size_budget_names_each_level_share_and_scale(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["budget", "--config", "conf/pgsr_calm.toml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "total epsilon = 1 (pure DP, exact)"
    taz = next(line.split() for line in lines if line.startswith("taz"))
    assert taz == [
        "taz",
        "1/5",
        "1/5",
        "10",
        "5",
    ]  # scale 2/(1/5) for histograms, 1/(1/5) cumulative


def test_the_synth_budget_splits_rho_exactly_as_the_methods_spend_it(capsys, monkeypatch):
    from fractions import Fraction

    monkeypatch.chdir(ROOT)
    assert main(["budget", "--config", "conf/synth_pums.toml"]) == 0
    out = capsys.readouterr().out
    initial = int(out.split(" one-way measurements")[0].split()[-1])
    rounds = int(out.split(" rounds:")[0].split()[-1])
    each = Fraction(out.split("rho ")[2].split()[0])
    select = Fraction(out.split("rho ")[3].split()[0])
    measure = Fraction(out.split(" to select, ")[1].split()[0])
    assert initial * each + rounds * (select + measure) == Fraction(1, 10)


def test_a_config_of_no_release_is_one_line(tmp_path, capsys):
    path = tmp_path / "none.toml"
    path.write_text('[run]\nname = "x"\n')
    assert main(["budget", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not the config of one release" in err


def test_validate_passes_the_shipped_group_size_and_synth_inputs(spark, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("CENSUSDP_WORKER_MEMORY", raising=False)
    assert main(["validate", "--config", "conf/pgsr_calm.toml"]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "taz 930" in out and "epsilon = 1" in out
    assert "memory: dp needs ~" in out and "(limit CENSUSDP_WORKER_MEMORY = 4.0 GiB)" in out
    assert main(["validate", "--config", "conf/synth_pums_reduced.toml"]) == 0
    assert "pass every input rule" in capsys.readouterr().out


def test_validate_refuses_a_bad_group_size_input_in_one_line(spark, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    source = (ROOT / "data" / "calm" / "calm_taz_household_sizes.csv").read_text().splitlines()
    header = source[0].split(",")
    row = source[1].split(",")
    row[header.index("HHSIZE2")] = "-3"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([source[0], ",".join(row), *source[2:]]) + "\n")
    code = main(["validate", "--config", "conf/pgsr_calm.toml", "--input", str(bad)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert str(bad) in err and "row 1" in err and "HHSIZE2" in err


def test_validate_refuses_a_config_whose_n_exceeds_worker_memory_as_the_run_does(
    spark, tmp_path, capsys, monkeypatch
):
    from tests.e2e.test_bad_inputs import huge_n_config

    monkeypatch.delenv("CENSUSDP_WORKER_MEMORY", raising=False)
    config = huge_n_config(tmp_path)
    assert main(["validate", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"censusdp: error: {config}: [groups] max_size = 100,000,000: the dp ")
    assert "more than CENSUSDP_WORKER_MEMORY = 4.0 GiB" in err and "top-code" in err
    assert not (tmp_path / "private").exists()


def test_validate_refuses_a_secret_file_that_is_a_directory_in_one_line(
    spark, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(ROOT)
    secret = tmp_path / "secret.hex"
    secret.mkdir(mode=0o700)
    code = main(["validate", "--config", "conf/ri_2010_demo.toml", "--secret-file", str(secret)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("[censusdp]")]
    assert code == 2 and len(err) == 1 and str(secret) in err[0] and "not a file" in err[0], err
