"""benchmarks/bench_topdown.py's generated configs: the rho is replaced, ``topdown`` runs
today's config unchanged, any other method is written as ``[estimation] method`` and, while the
code does not know the key, is refused before any run."""

from __future__ import annotations

import tomllib
from pathlib import Path

import bench_topdown
import pytest

from censusdp_spark.topdown.config import load_topdown_config

ROOT = Path(__file__).resolve().parents[2]


def test_topdown_config_loads_at_the_given_rho(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(bench_topdown.config_text("hi", "10", "topdown"))
    config = load_topdown_config(path, ROOT)
    assert config.budget.total_rho == 10
    assert config.invariant_levels == ("state",)


def test_another_method_is_written_into_estimation():
    doc = tomllib.loads(bench_topdown.config_text("ri", "1/2", "full_information"))
    assert doc["estimation"]["method"] == "full_information"
    assert doc["estimation"]["invariants"] == ["state"]
    assert doc["budget"]["rho"] == "1/2"


def test_a_method_the_code_does_not_know_fails_before_any_run(tmp_path):
    bench_topdown.check_methods(["ri"], ["1/2"], ["topdown", "full_information"], tmp_path)
    with pytest.raises(SystemExit, match="bogus"):
        bench_topdown.check_methods(["ri"], ["1/2"], ["topdown", "bogus"], tmp_path)


def test_secrets_are_fixed_and_distinct():
    secrets = [bench_topdown.secret_hex(i) for i in range(3)]
    assert secrets[0] == "9c" * 32
    assert len(set(secrets)) == 3 and all(len(bytes.fromhex(s)) == 32 for s in secrets)


def test_a_method_with_passes_writes_them_into_estimation(tmp_path):
    doc = tomllib.loads(bench_topdown.config_text("ri", "1/2", "full_information@total"))
    assert doc["estimation"]["method"] == "full_information"
    assert doc["estimation"]["passes"] == ["total", "all"]
    assert (
        "passes"
        not in tomllib.loads(bench_topdown.config_text("ri", "1/2", "topdown"))["estimation"]
    )
    levels = tomllib.loads(
        bench_topdown.config_text("ri", "1/2", "topdown@total:county+block_group")
    )["estimation"]["passes"]
    assert levels == {"county": ["total", "all"], "block_group": ["total", "all"]}
    bench_topdown.check_methods(["ri"], ["1/2"], ["topdown@total", "topdown@total:tract"], tmp_path)
    with pytest.raises(SystemExit, match="votingage"):
        bench_topdown.check_methods(["ri"], ["1/2"], ["topdown@votingage"], tmp_path)
