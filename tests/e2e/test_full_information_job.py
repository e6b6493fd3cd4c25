"""``[estimation] method = "full_information"`` end to end on one real RI county, through the CLI:
the guarantees, the ``bottom_up`` table, resume, and an estimate that uses what was measured
below each node (closer to the exact whole-tree GLS than TopDown's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sparse
from scipy.sparse.linalg import LinearOperator, cg

from censusdp_spark.cli import main
from censusdp_spark.release.runner import evaluation_dir_for
from censusdp_spark.topdown.config import load_topdown_config
from tests.helpers.cli import censusdp_stopped_after
from tests.helpers.release import TOPDOWN_GUARANTEES_HELD, assert_same_tables, with_method

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"


@pytest.fixture(scope="module")
def fi_config(tmp_path_factory) -> Path:
    text = DEMO.read_text()
    path = tmp_path_factory.mktemp("config") / "ri_full_information.toml"
    path.write_text(with_method(text, "full_information"))
    return path


@pytest.fixture(scope="module")
def topdown_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "ri_topdown.toml"
    path.write_text(with_method(DEMO.read_text(), "topdown"))
    return path


def fi_args(config: Path, county_csv: Path, secret: Path, output: Path) -> list[str]:
    return [
        "topdown",
        "--config",
        str(config),
        "--input",
        str(county_csv),
        "--output",
        str(output),
        "--secret-file",
        str(secret),
        "--master",
        "local[2]",
    ]


@pytest.fixture(scope="module")
def fi_release(reference_release) -> Path:
    """The demo's own method is ``full_information``: the tests' shared county release (with
    ``--evaluate`` and ``--variances``) is this method's release of the county."""
    assert 'method = "full_information"' in DEMO.read_text()
    return reference_release


@pytest.fixture(scope="module")
def topdown_release(spark, topdown_config, county_csv, fixed_secret, tmp_path_factory) -> Path:
    """The same county and secret with ``method = "topdown"``: the same noisy measurements."""
    out = tmp_path_factory.mktemp("topdown") / "out"
    assert main([*fi_args(topdown_config, county_csv, fixed_secret, out), "--evaluate"]) == 0
    return out


def table(spark, path: Path):
    return spark.read.format("delta").load(str(path))


def test_guarantees_hold_and_the_bottom_up_table_is_written(spark, fi_release):
    manifest = json.loads((fi_release / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == TOPDOWN_GUARANTEES_HELD
    assert "bottom_up" in manifest["tables"]
    rows = table(spark, fi_release / "bottom_up").toPandas()
    counts = rows.groupby("level").size().to_dict()
    assert counts == {lv: manifest["nodes"][lv] for lv in counts} and len(counts) == 6
    leaves = rows[rows.level == "block"]
    # The top-down pass fits the leaves to their own answers: nothing reads their mean.
    assert leaves.covariance.isna().all() and leaves["mean"].isna().all()
    inner = rows[rows.level != "block"]
    assert (inner.covariance.map(len) == 16 * 17 // 2).all()
    exact = dict(zip(rows.level, rows.exact_total, strict=True))
    assert exact["nation"] and exact["state"] and not exact["county"] and not exact["block"]


def test_total_variances_are_the_bottom_up_variances(spark, fi_release):
    config = load_topdown_config(DEMO, ROOT)
    variances = table(spark, fi_release / "total_variances").toPandas()
    by_level = variances.groupby("level")["variance"]
    assert (by_level.max()[["nation", "state"]] == 0.0).all()
    # A block measured by "total" and "detailed": 1^T (w_t 1 1^T + w_d I)^{-1} 1 = n / (w_d + n w_t).
    w_total, w_detailed = (
        1.0 / float(config.budget.sigma2_for("block", q)) for q in ("total", "detailed")
    )
    blocks = variances[variances.level == "block"]["variance"]
    assert np.allclose(blocks, 16 / (w_detailed + 16 * w_total), rtol=1e-12)
    # Everything measured below a node only adds information: a county's total is known better
    # than from its own total query.
    county = float(by_level.max()["county"])
    assert 0 < county < float(config.budget.sigma2_for("county", "total"))
    assert len(variances) == table(spark, fi_release / "bottom_up").count()


def test_variances_need_full_information(
    topdown_config, county_csv, fixed_secret, tmp_path, capsys
):
    args = fi_args(topdown_config, county_csv, fixed_secret, tmp_path / "out")
    assert main([*args, "--variances"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "[estimation.method] --variances needs" in err


def whole_tree_gls_totals(spark, release: Path, digits: int) -> dict[str, float]:
    """Node totals at the level with ``digits`` of the exact GLS estimate from every noisy
    measurement of the run, solved independently of the project's estimators: unknowns are
    all the blocks' histograms, rows ``Q_q (sum of the blocks under a node)`` weighted by
    ``1 / sigma^2``, normal equations by conjugate gradients, and the invariant state total as
    one exact constraint (``x = x0 + N^{-1} 1 (T - 1^T x0) / (1^T N^{-1} 1)``)."""
    config = load_topdown_config(DEMO, ROOT)
    noisy = table(spark, release / "noisy_measurements").toPandas()
    leaves = np.sort(noisy[noisy.level == "block"].geocode.unique())
    k, n = len(leaves), config.schema.n_cells
    rows, answers, weights = [], [], []
    for level in config.hierarchy.levels:
        measured = noisy[noisy.level == level.name]
        nodes = np.sort(measured.geocode.unique())
        index = {g: i for i, g in enumerate(nodes)}
        member = sparse.csr_matrix(
            (np.ones(k), ([index[g[: level.digits]] for g in leaves], np.arange(k))),
            shape=(len(nodes), k),
        )
        for q in config.queries[level.name]:
            query = sparse.csr_matrix(
                (np.ones(n), (q.cell_to_marginal, np.arange(n))), shape=(q.size, n)
            )
            rows.append(sparse.kron(member, query, format="csr"))
            by_node = measured[measured["query"] == q.name].set_index("geocode").loc[nodes]
            answers.append(np.concatenate(by_node.noisy.to_numpy()).astype(float))
            sigma2 = float(config.budget.sigma2_for(level.name, q.name))
            weights.append(np.full(len(nodes) * q.size, 1.0 / sigma2))
    g = sparse.vstack(rows).tocsr()
    y, w = np.concatenate(answers), np.concatenate(weights)
    normal = LinearOperator((k * n, k * n), matvec=lambda v: g.T @ (w * (g @ v)))
    unconstrained, info = cg(normal, g.T @ (w * y), rtol=1e-12, maxiter=20_000)
    assert info == 0
    spread, info = cg(normal, np.ones(k * n), rtol=1e-12, maxiter=20_000)
    assert info == 0
    state_total = table(spark, release / "estimates").filter("level = 'state'").toPandas()
    x = unconstrained + spread * (state_total["count"].sum() - unconstrained.sum()) / spread.sum()
    totals: dict[str, float] = {}
    for leaf, value in zip(leaves, x.reshape(k, n).sum(axis=1), strict=True):
        totals[leaf[:digits]] = totals.get(leaf[:digits], 0.0) + float(value)
    return totals


def released_totals(spark, release: Path, level: str) -> dict[str, int]:
    rows = table(spark, release / "estimates").filter(f"level = '{level}'").toPandas()
    return rows.groupby("geocode")["count"].sum().to_dict()


def test_tract_totals_are_closer_to_the_whole_tree_gls_than_topdown(
    spark, fi_release, topdown_release
):
    gls = whole_tree_gls_totals(spark, fi_release, digits=11)

    def distance(release: Path) -> float:
        released = released_totals(spark, release, "tract")
        return float(np.mean([abs(released.get(g, 0) - v) for g, v in gls.items()]))

    # Same secret, so the same noisy measurements: only the estimator differs.
    assert_same_tables(spark, fi_release, topdown_release, tables=("noisy_measurements",))
    # TopDown's tracts see only their own measurements under the county (about 1.3 persons
    # from the GLS here); full information, within rounding of it.
    assert distance(fi_release) < 0.6 < 1.0 < distance(topdown_release)


def test_county_detail_is_more_accurate_than_topdown(spark, fi_release, topdown_release):
    def county_detailed_l1(release: Path) -> float:
        rows = table(spark, evaluation_dir_for(release) / "table").filter(
            "method != 'block_by_block' AND level = 'county' AND query = 'detailed'"
        )
        return float(rows.first()["value"])

    assert county_detailed_l1(fi_release) < 0.5 * county_detailed_l1(topdown_release)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("killed_after", "redone", "kept"),
    [("block", ["block", "tract"], []), ("tract", ["nation"], ["block", "tract"])],
)
def test_killed_driver_resumes_the_bottom_up_pass_where_it_stopped(
    spark, quick_tract, quick_secret, quick_reference, tmp_path, capsys, killed_after, redone, kept
):
    """Killed after the leaves' commit, before their parents', the resumed run redoes the
    leaves and their parents in one pass (the leaves' rows hold no mean to start the parents
    from); killed after the tracts', it goes on from the nation. The tables are the same
    either way. The run is stopped in this process where a kill leaves the same tables and run
    state (``tests/e2e/test_faults.py`` kills a driver's process); the resumed one runs here
    too. On the quick tract (nation > tract > block, the demo's method): the pass's wiring, not
    the hierarchy's depth."""
    csv, config = quick_tract
    out = tmp_path / "out"
    args = fi_args(config, csv, quick_secret, out)
    censusdp_stopped_after(f"bottom_up_{killed_after}", *args)
    capsys.readouterr()
    code = main([*args, "--resume"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert not [lv for lv in kept if f"bottom_up_{lv}:" in err]
    assert all(f"bottom_up_{lv}:" in err for lv in redone)
    assert "estimate_block" in err
    assert_same_tables(
        spark,
        quick_reference,
        out,
        tables=("noisy_measurements", "bottom_up", "estimates", "microdata"),
    )


def test_a_leaf_query_set_that_does_not_identify_cells_is_one_line(
    fi_config, county_csv, fixed_secret, tmp_path, capsys
):
    config = tmp_path / "unidentified.toml"
    config.write_text(
        fi_config.read_text().replace(
            'queries = { "total" = "1/10", "detailed" = "9/10" }',
            'queries = { "total" = "1/10", "votingage" = "9/10" }',
        )
    )
    out = tmp_path / "out"
    assert main(fi_args(config, county_csv, fixed_secret, out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unidentified.toml: [estimation.method]" in err
    assert '"full_information" needs' in err and "[budget.levels.block.queries]" in err
    assert not out.exists()


@pytest.mark.slow
def test_the_2016_cell_production_schema_runs_with_compact_covariances(spark, tmp_path):
    """The shipped production config on its Perry County PPMF: 4 packed 15 x 15 blocks per
    inner node in ``bottom_up`` (not 2,016 x 2,016), the guarantees hold, the Spark
    ``total_variances`` are the compact covariances' ``1^T C 1``, and its P1-P5 tables are
    consistent with the estimates."""
    from censusdp_spark.topdown.bottom_up import config_layout
    from censusdp_spark.topdown.solvers.symmetric_covariance import SymmetricMatrix

    production = ROOT / "conf" / "pl94_2020_production.toml"
    config_path = tmp_path / "pl94_fi.toml"
    config_path.write_text(with_method(production.read_text(), "full_information"))
    secret = tmp_path / "secret.hex"  # its own: a secret makes one release of one input
    secret.write_text("c0" * 32 + "\n")
    secret.chmod(0o600)
    out = tmp_path / "out"
    args = ["topdown", "--config", str(config_path), "--output", str(out), "--secret-file"]
    assert main([*args, str(secret), "--master", "local[2]", "--variances"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["guarantee_checks"].values()) == {0}
    layout = config_layout(load_topdown_config(config_path, ROOT))
    assert layout is not None and layout.n_cells == 1890
    rows = table(spark, out / "bottom_up").toPandas()
    inner = rows[rows.level != "block"]
    assert (inner.covariance.map(len) == 4 * 15 * 16 // 2).all()
    assert (inner["mean"].map(len) == 1890).all() and rows["mean"].isna().sum() == len(rows) - len(
        inner
    )
    variances = table(spark, out / "total_variances").toPandas()
    variance = variances.set_index(["level", "geocode"])["variance"]
    for level, geocode, packed, exact in zip(
        inner.level, inner.geocode, inner.covariance, inner.exact_total, strict=True
    ):
        expected = SymmetricMatrix.unpack(layout, np.asarray(packed)).total_variance()
        assert variance[(level, geocode)] == (0.0 if exact else pytest.approx(expected, rel=1e-9))
    assert (variances[variances.level == "block"]["variance"] > 0).all()
    # P1-P5 from the schema's attributes through [output.pl94_tables.variables] (PPMF input)
    tables = table(spark, out / "pl94_tables").toPandas()
    assert manifest["pl94_tables"]["tables"] == ["P1", "P2", "P3", "P4", "P5"]
    estimates = table(spark, out / "estimates").groupBy("geocode").sum("count").toPandas()
    totals = dict(zip(estimates["geocode"], estimates["sum(count)"], strict=True))
    assert dict(zip(tables["GEOCODE"], tables["P0010001"], strict=True)) == {
        g: totals.get(g, 0) for g in tables["GEOCODE"]
    }
    assert (tables["P0010001"] == tables["P0020001"]).all()
    assert (tables["P0050001"] == tables["P0050002"] + tables["P0050007"]).all()
    assert (tables["P0050001"] <= tables["P0010001"]).all()
