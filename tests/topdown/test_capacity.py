"""The disk and memory a TopDown release needs are estimated from public quantities before any
noise, and a run beyond the output's free space or (local mode) the machine's memory is refused
in one line, leaving nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.engine.session import LocalMode, local_mode
from censusdp_spark.model.geography import LevelShape
from censusdp_spark.model.memory import parse_memory
from censusdp_spark.topdown import capacity
from censusdp_spark.topdown.capacity import CapacityError, check_disk, check_memory, estimate_disk
from censusdp_spark.topdown.config import load_topdown_config
from tests.helpers.geography import national_shapes_of

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "conf" / "national_production.toml"
NATION = {
    "nation": 1, "state": 51, "county": 3143, "tract": 84414, "block_group": 239780,
    "block": 8132968,
}  # fmt: skip
DC = {"nation": 1, "state": 1, "county": 1, "tract": 206, "block_group": 471, "block": 13919}


def test_the_estimate_counts_every_noised_cell_and_the_inner_nodes_dense_state():
    config = load_topdown_config(PRODUCTION, ROOT)
    found = estimate_disk(config, DC)
    cells = sum(n * sum(q.size for q in config.queries[lv]) for lv, n in DC.items())
    assert found.parts["noisy measurements"] == int(cells * capacity.NOISY_BYTES_PER_CELL)
    # 1,890 cells held (2,016 less the 126 of nursing x under 18), 480 packed covariances.
    inner = sum(DC.values()) - DC["block"]
    assert found.parts["bottom_up"] == inner * (1890 + 480) * 8
    assert found.parts["P.L. 94-171 tables"] == sum(DC.values()) * capacity.TABLE_BYTES_PER_NODE
    # Measured on this DC release: noisy_measurements 48 MiB, bottom_up 12 MiB.
    assert 40 * 2**20 < found.parts["noisy measurements"] < 60 * 2**20
    assert 10 * 2**20 < found.parts["bottom_up"] < 14 * 2**20


def test_a_run_beyond_the_free_space_is_refused_with_the_estimate(tmp_path):
    config = load_topdown_config(PRODUCTION, ROOT)
    with pytest.raises(CapacityError) as refused:
        check_disk(config, NATION, tmp_path / "out", free=50 * 2**30)
    message = str(refused.value)
    assert "\n" not in message and "8,132,968 blocks" in message
    assert "needs ~" in message and "50.0 GiB free" in message
    assert check_disk(config, DC, tmp_path / "out", free=50 * 2**30).total < 2**30


@pytest.mark.parametrize(
    ("measure", "answer", "refusal"),
    [
        ("free_disk", lambda path: 1, "on disk, more than the 0 MiB free"),
        ("physical_memory", lambda: 2**30, "more than the 1.0 GiB of this machine"),
    ],
    ids=["disk", "memory"],
)
def test_the_job_refuses_before_any_secret_or_write(
    spark, tmp_path, monkeypatch, capsys, measure, answer, refusal
):
    monkeypatch.setattr(capacity, measure, answer)
    out = tmp_path / "release"
    config = ROOT / "conf" / "ri_2010_demo.toml"
    args = ["topdown", "--config", str(config), "--output", str(out), "--master", "local[2]"]
    monkeypatch.delenv("CENSUSDP_SECRET", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("censusdp: error: ") and refusal in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def nation() -> list[LevelShape]:
    """The SYNTHETIC national input's geography: the largest noise group of each level is the
    tracts of the nation, the block groups of the largest state, the blocks of the largest
    county (113,042)."""
    return national_shapes_of()


def test_the_largest_call_is_the_noise_pass_of_the_largest_noise_group(nation):
    config = load_topdown_config(PRODUCTION, ROOT)
    found, words = capacity.largest_call(config, nation)
    cells = 113042 * 2603  # the blocks of the largest county, 2,603 noised cells each
    assert found == capacity.PYTHON_CALL_BYTES + capacity.NOISE_CELL_BYTES * cells
    assert words.startswith("the noise pass of 113,042 block nodes in one group")


def test_the_memory_estimate_holds_the_jvm_the_driver_and_every_worker_at_its_largest_call(
    nation,
):
    config = load_topdown_config(PRODUCTION, ROOT)
    call, _ = capacity.largest_call(config, nation)
    one = capacity.estimate_memory(config, nation, LocalMode(cores=1, heap=6 * 2**30))
    two = capacity.estimate_memory(config, nation, LocalMode(cores=2, heap=6 * 2**30))
    assert two.total - one.total == capacity.PYTHON_WORKER_BYTES + call
    assert one.parts["JVM"] == 6 * 2**30 + capacity.JVM_NATIVE_BYTES
    # The nation's production release fits this project's 24 GiB machine on two cores.
    assert 16 * 2**30 < two.total < 24 * 2**30


def test_a_run_beyond_the_machine_memory_is_refused_in_one_line_and_a_cluster_is_not_judged(
    nation,
):
    config = load_topdown_config(PRODUCTION, ROOT)
    local = LocalMode(cores=2, heap=6 * 2**30)
    with pytest.raises(CapacityError) as refused:
        check_memory(config, nation, local, available=8 * 2**30)
    message = str(refused.value)
    assert "\n" not in message and "8,132,968 blocks" in message
    assert "of memory in local mode, more than the 8.0 GiB of this machine" in message
    assert "113,042 block nodes" in message and "--master local[1]" in message
    assert check_memory(config, nation, None, available=1) is None


def test_the_session_says_its_local_cores_and_heap(spark):
    local = local_mode(spark)
    assert local == LocalMode(cores=2, heap=parse_memory(os.environ.get(
        "CENSUSDP_DRIVER_MEMORY", "6g"), "CENSUSDP_DRIVER_MEMORY"))  # fmt: skip
