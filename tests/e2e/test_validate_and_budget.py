"""``censusdp budget`` and ``censusdp validate`` understand every release's config."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from tests.helpers.group_sizes import huge_n_config

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


def test_budget_epsilon_is_the_group_size_release_s_exact_epsilon(capsys, monkeypatch):
    """As ``censusdp group-sizes --epsilon 1/2``: the total replaced, each level its share."""
    from censusdp_spark.group_sizes.config import budget_text, load_group_sizes_config, with_epsilon

    monkeypatch.chdir(ROOT)
    assert main(["budget", "--config", "conf/pgsr_calm.toml", "--epsilon", "1/2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("budget of conf/pgsr_calm.toml (pgsr_calm) at --epsilon 1/2\n")
    assert out.splitlines()[-1] == "total epsilon = 1/2 (pure DP, exact)"
    released = with_epsilon(load_group_sizes_config("conf/pgsr_calm.toml"), Fraction(1, 2))
    assert budget_text(released) in out  # what the run with --epsilon 1/2 spends
    assert main(["budget", "--config", "conf/pgsr_calm.toml", "--epsilon", "half"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[budget.epsilon] --epsilon 'half' is not an exact" in err


@pytest.mark.parametrize("delta", [None, "1e-6"])
def test_budget_epsilon_is_the_synth_release_s_epsilon_at_delta(delta, capsys, monkeypatch):
    """As ``censusdp synth --epsilon 1.5 [--delta 1e-6]``: the same ρ, rounded down."""
    from censusdp_spark.synth.config import load_synth_config
    from censusdp_spark.synth.job import SynthOptions, resolve_rho

    monkeypatch.chdir(ROOT)
    extra = [] if delta is None else ["--delta", delta]
    args = ["budget", "--config", "conf/synth_pums_reduced.toml", "--epsilon", "1.5", *extra]
    assert main(args) == 0
    out = capsys.readouterr().out
    config = load_synth_config("conf/synth_pums_reduced.toml")
    options = SynthOptions(method="hpd_fixed", epsilon=1.5, delta=None if delta is None else 1e-6)
    rho, at = resolve_rho(config, options)  # what the run spends
    assert rho != config.budget.rho and f"rho = {rho} (~" in out
    assert f"  epsilon = 1.500 at delta = {at:g}" in out


def test_budget_epsilon_is_refused_in_one_line_for_topdown(capsys, monkeypatch):
    """TopDown's run takes no --epsilon: its budget is rho per level and query."""
    monkeypatch.chdir(ROOT)
    assert main(["budget", "--config", "conf/ri_2010_demo.toml", "--epsilon", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "conf/ri_2010_demo.toml: [budget] --epsilon: TopDown's budget is rho" in captured.err


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
