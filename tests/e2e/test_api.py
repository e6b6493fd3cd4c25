"""The Python API: its documented examples run as written (doctests, real Spark and Delta), the
package lists it, and a release opened from its folder reads back decoded."""

from __future__ import annotations

import doctest
import inspect
import json
import pydoc
import subprocess
import sys
import types
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import censusdp_spark.api
from censusdp_spark import open_release
from censusdp_spark.topdown.config import load_topdown_config
from tests.helpers.release import TOPDOWN_GUARANTEES_HELD

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


def test_help_lists_the_public_api_with_its_docstrings():
    import censusdp_spark

    assert set(censusdp_spark.__all__) == {
        "Release",
        "budget",
        "check",
        "open_release",
        "optimize_budget",
        "run_group_sizes",
        "run_synth",
        "run_topdown",
    }
    text = pydoc.render_doc(censusdp_spark, renderer=pydoc.plaintext)
    assert "censusdp-spark: differentially private" in text
    for name in censusdp_spark.__all__:
        summary = inspect.getdoc(getattr(censusdp_spark, name)).splitlines()[0]
        assert name in text and summary in text, name


def test_importing_the_package_starts_no_spark():
    code = "import sys, censusdp_spark; print('pyspark' in sys.modules, 'pandas' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False False"


def test_open_release_reads_the_manifest_and_names_the_tables(reference_release):
    release = open_release(reference_release)
    manifest = json.loads((reference_release / "manifest.json").read_text())
    assert release.manifest == manifest and release.kind == "topdown"
    assert release.tables == {name: reference_release / name for name in manifest["tables"]}
    assert {"noisy_measurements", "estimates", "microdata"} <= set(release.tables)
    assert release.checks == TOPDOWN_GUARANTEES_HELD and release.for_release
    assert release.budget["rho"] == manifest["privacy"]["rho"]
    spent = sum(Fraction(entry["rho"]) for entry in release.budget["entries"])
    assert spent == Fraction(release.budget["rho"])


def test_to_pandas_decodes_the_estimates_cells_into_labelled_attributes(reference_release):
    """Block estimates summed by the decoded labels equal the microdata's persons by label."""
    release = open_release(reference_release)
    estimates = release.to_pandas("estimates")
    assert {"geocode", "cell", "count", "votingage", "hisprace"} <= set(estimates.columns)
    schema = load_topdown_config(ROOT / "conf" / "ri_2010_demo.toml").schema
    assert (estimates["cell"] == schema.cell_of(_level_indices(estimates, schema))).all()
    blocks = estimates[estimates["level"] == "block"]
    by_label = blocks.groupby(["votingage", "hisprace"])["count"].sum()
    persons = release.to_pandas("microdata").groupby(["votingage", "hisprace"]).size()
    assert by_label[by_label > 0].sort_index().equals(persons.sort_index().astype("int64"))


def test_to_pandas_decodes_alike_with_deltalake_or_spark(reference_release, spark, monkeypatch):
    """The ``deltalake`` reader's numpy decoding gives what Spark's does (here a stand-in for
    the package, reading the same Delta table)."""
    release = open_release(reference_release)
    by_spark = release.to_pandas("estimates")
    stand_in = types.ModuleType("deltalake")
    stand_in.DeltaTable = lambda path: types.SimpleNamespace(  # type: ignore[attr-defined]
        to_pandas=lambda: spark.read.format("delta").load(path).toPandas()
    )
    monkeypatch.setitem(sys.modules, "deltalake", stand_in)
    by_deltalake = release.to_pandas("estimates")
    key = ["geocode", "cell"]
    left = by_spark.sort_values(key).reset_index(drop=True)
    right = by_deltalake.sort_values(key).reset_index(drop=True)
    assert list(left.columns) == list(right.columns)
    assert left.astype(str).equals(right.astype(str))


def test_spark_reads_a_table_with_the_same_columns(reference_release, spark):
    release = open_release(reference_release)
    frame = release.spark("estimates", spark)
    assert frame.columns == list(release.to_pandas("estimates").columns)
    assert release.spark("noisy_measurements", spark).columns == (
        spark.read.format("delta").load(str(reference_release / "noisy_measurements")).columns
    )


def test_open_release_refuses_a_folder_without_manifest_or_an_unknown_table(
    reference_release, tmp_path
):
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        open_release(tmp_path)
    with pytest.raises(KeyError, match="no table 'persons'; its tables: "):
        open_release(reference_release).to_pandas("persons")


def _level_indices(frame, schema):
    return np.stack(
        [frame[a.name].map(a.levels.index).to_numpy() for a in schema.attributes], axis=1
    )
