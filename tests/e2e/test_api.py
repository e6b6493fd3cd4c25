"""The Python API's documented examples run as written (doctests, real Spark and Delta)."""

from __future__ import annotations

import doctest
import os
from pathlib import Path

import censusdp_spark.api

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_examples_run_on_the_shipped_data(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    failures, tried = doctest.testmod(
        censusdp_spark.api,
        extraglobs={"scratch": tmp_path, "spark": spark},
        optionflags=doctest.ELLIPSIS,
        report=True,
    )
    assert tried >= 6 and failures == 0


def test_the_package_names_its_api_without_importing_spark():
    import censusdp_spark

    assert set(censusdp_spark.__all__) == {
        "Release",
        "budget",
        "check",
        "run_group_sizes",
        "run_synth",
        "run_topdown",
    }
    assert callable(censusdp_spark.run_topdown) and os.environ is not None
