"""The exact GLS reference (censusdp_spark/testing/gls_reference.py): the sparse KKT solve
equals an independent dense constrained least-squares solve over the leaves, has the closed
form on a one-cell two-level tree, and reads a release's Delta tables and input correctly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.linalg

from censusdp_spark.testing.gls_reference import (
    LevelMeasurements,
    TreeProblem,
    build_problem,
    gls_reference,
    main,
    read_delta,
    solve_gls,
    solve_gls_by_tree,
)
from censusdp_spark.topdown.config import load_topdown_config


def random_tree(rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """Parents per level (root first) and every leaf's chain of ancestors."""
    depth = int(rng.integers(2, 5))
    parents = [np.zeros(0, dtype=np.int64)]
    size = 1
    for _ in range(depth - 1):
        children = rng.integers(1, 4, size=size)  # single-child parents included
        parents.append(np.repeat(np.arange(size), children))
        size = int(children.sum())
    return parents, np.arange(size)


def random_queries(rng: np.random.Generator, m: int, leaf: bool) -> list[np.ndarray]:
    """Marginal-like 0/1 matrices (each cell in one row); the leaves always get ``detailed``."""
    mats = [np.eye(m)] if leaf else []
    for _ in range(int(rng.integers(0 if leaf else 1, 3))):
        groups = rng.integers(0, int(rng.integers(1, m + 1)), size=m)
        _, groups = np.unique(groups, return_inverse=True)
        a = np.zeros((groups.max() + 1, m))
        a[groups, np.arange(m)] = 1.0
        mats.append(a)
    return mats


def random_problem(seed: int) -> tuple[TreeProblem, list[np.ndarray]]:
    """A random tree problem and, per level, each node's leaves as a 0/1 matrix (k_l x leaves)."""
    rng = np.random.default_rng(seed)
    parents, _ = random_tree(rng)
    m = int(rng.integers(1, 6))
    n_leaves = len(parents[-1]) if len(parents) > 1 else 1
    # membership[l][v, leaf] = 1 if leaf is under node v of level l
    membership = [np.eye(n_leaves)]
    for parent in reversed(parents[1:]):
        up = np.zeros((parent.max() + 1, membership[0].shape[0]))
        up[parent, np.arange(len(parent))] = 1.0
        membership.insert(0, up @ membership[0])
    truth = rng.integers(0, 20, size=(n_leaves, m))
    invariant_depth = int(rng.integers(-1, len(parents) - 1))  # -1: no invariant
    levels = []
    for i, parent in enumerate(parents):
        k = membership[i].shape[0]
        node_truth = membership[i] @ truth
        queries = []
        for a in random_queries(rng, m, leaf=i == len(parents) - 1):
            sigma2 = float(rng.uniform(0.3, 5.0))
            y = node_truth @ a.T + rng.normal(scale=np.sqrt(sigma2), size=(k, a.shape[0]))
            queries.append((a, sigma2, y))
        levels.append(
            LevelMeasurements(
                name=f"l{i}",
                n_nodes=k,
                parent=parent,
                queries=tuple(queries),
                invariant_totals=node_truth.sum(axis=1) if i <= invariant_depth else None,
            )
        )
    return TreeProblem(tuple(levels), m), membership


def dense_gls(problem: TreeProblem, membership: list[np.ndarray]) -> np.ndarray:
    """Leaf histograms by a dense null-space solve with the leaves as the only unknowns and
    every invariant total written out (redundant ones included)."""
    m = problem.n_cells
    n_leaves = membership[-1].shape[1]
    design, target, weight = [], [], []
    cons, rhs = [], []
    for lv, member in zip(problem.levels, membership, strict=True):
        for a, sigma2, y in lv.queries:
            design.append(np.kron(member, a))  # row (v, r): sum over leaves under v of A x_leaf
            target.append(y.ravel())
            per_node = np.broadcast_to(np.asarray(sigma2, dtype=np.float64), (y.shape[0],))
            weight.append(np.repeat(1.0 / per_node, y.shape[1]))
        if lv.invariant_totals is not None:
            cons.append(np.kron(member, np.ones((1, m))))
            rhs.append(lv.invariant_totals.astype(float))
    d = np.vstack(design)
    y = np.concatenate(target)
    w = np.sqrt(np.concatenate(weight))
    if cons:
        c = np.vstack(cons)
        t = np.concatenate(rhs)
        x0 = np.linalg.lstsq(c, t, rcond=None)[0]
        null = scipy.linalg.null_space(c)
    else:
        x0 = np.zeros(n_leaves * m)
        null = np.eye(n_leaves * m)
    z = np.linalg.lstsq((w[:, None] * d) @ null, w * (y - d @ x0), rcond=None)[0]
    return (x0 + null @ z).reshape(n_leaves, m)


@pytest.mark.parametrize("solve", [solve_gls, solve_gls_by_tree])
@pytest.mark.parametrize("seed", range(100))
def test_sparse_kkt_and_tree_elimination_equal_dense_constrained_least_squares(seed, solve):
    problem, membership = random_problem(seed)
    estimates, stats = solve(problem)
    leaves = dense_gls(problem, membership)
    for est, member in zip(estimates, membership, strict=True):
        expected = member @ leaves
        scale = max(1.0, np.abs(expected).max())
        np.testing.assert_allclose(est, expected, rtol=0, atol=1e-9 * scale)
    assert stats.relative_residual < 1e-12
    assert stats.max_constraint_violation < 1e-8


@pytest.mark.parametrize("solve", [solve_gls, solve_gls_by_tree])
@pytest.mark.parametrize("invariant", [False, True])
def test_one_cell_two_level_tree_has_the_inverse_variance_closed_form(invariant, solve):
    """Root measured y0 (variance s0), k children y_i (variance s1). Up: the root's BLUE is the
    inverse-variance combination of y0 and sum(y_i) (variance k s1), or the invariant total.
    Down: equal variances split the root's discrepancy with sum(y_i) equally."""
    s0, s1 = 2.0, 3.0
    y0, y = 50.0, np.array([10.0, 14.0, 9.0, 20.0])
    k, total = len(y), 51
    one = np.ones((1, 1))
    problem = TreeProblem(
        (
            LevelMeasurements(
                "root",
                1,
                np.zeros(0, dtype=np.int64),
                ((one, s0, np.array([[y0]])),),
                np.array([total]) if invariant else None,
            ),
            LevelMeasurements(
                "leaf", k, np.zeros(k, dtype=np.int64), ((one, s1, y[:, None]),), None
            ),
        ),
        1,
    )
    (root, leaves), _ = solve(problem)
    up = float(total) if invariant else (y0 / s0 + y.sum() / (k * s1)) / (1 / s0 + 1 / (k * s1))
    assert root[0, 0] == pytest.approx(up, rel=1e-12)
    np.testing.assert_allclose(leaves[:, 0], y + (up - y.sum()) / k, rtol=1e-12)


@pytest.mark.parametrize("solve", [solve_gls, solve_gls_by_tree])
def test_an_unidentified_cell_is_reported_not_returned(solve):
    """Leaves measured only in total: their cells are not identified; the solve must refuse."""
    total = np.ones((1, 2))
    problem = TreeProblem(
        (
            LevelMeasurements(
                "root", 1, np.zeros(0, dtype=np.int64), ((np.eye(2), 1.0, np.ones((1, 2))),)
            ),
            LevelMeasurements(
                "leaf", 2, np.zeros(2, dtype=np.int64), ((total, 1.0, np.ones((2, 1))),)
            ),
        ),
        2,
    )
    with pytest.raises((ArithmeticError, RuntimeError)):
        solve(problem)


# --- reading a release ---------------------------------------------------------------------

CONFIG = """
[run]
name = "tiny"
[schema]
attributes = [
  { name = "age", levels = ["young", "old"] },
  { name = "kind", levels = ["a", "b"] },
]
[geography]
levels = [ { name = "root", digits = 0 }, { name = "mid", digits = 1 }, { name = "leaf", digits = 3 } ]
[input]
path = "{input}"
format = "csv"
layout = "block_counts"
geocode = "GEOID"
cells = [
  { age = "young", kind = "a", expr = "ya" },
  { age = "young", kind = "b", expr = "yb" },
  { age = "old", kind = "a", expr = "oa" },
  { age = "old", kind = "b", expr = "ob" },
]
[estimation]
invariants = ["mid"]
structural_zeros = [ { age = ["young"], kind = ["b"] } ]
[budget]
rho = "1"
[budget.levels.root]
share = "1/4"
queries = { "total" = "1/2", "age" = "1/2" }
[budget.levels.mid]
share = "1/4"
queries = { "kind" = "1" }
[budget.levels.leaf]
share = "1/2"
queries = { "total" = "1/5", "detailed" = "4/5" }
"""


def write_delta(path: Path, parts: dict[str, pd.DataFrame], removed: pd.DataFrame) -> None:
    """A Delta table by hand, partitioned by level: one commit adds a stale file and the
    partitions, a second removes the stale file."""
    log = path / "_delta_log"
    log.mkdir(parents=True)
    adds = []
    for name, frame in {"stale": removed, **parts}.items():
        rel = f"level={name}/part-{name}.parquet"
        (path / f"level={name}").mkdir()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path / rel)
        level = frame.attrs.get("level", name)
        adds.append({"add": {"path": rel, "partitionValues": {"level": level}}})
    (log / "00000000000000000000.json").write_text("\n".join(json.dumps(a) for a in adds))
    remove = {"remove": {"path": "level=stale/part-stale.parquet"}}
    (log / "00000000000000000001.json").write_text(json.dumps(remove))


def test_a_release_folder_gives_the_dense_gls_and_the_truth(tmp_path):
    rng = np.random.default_rng(7)
    leaves = ["011", "012", "020", "100", "101"]
    truth = rng.integers(0, 9, size=(len(leaves), 4))
    truth[:, 1] = 0  # the structural zero (young, b)
    truth[2] = 0  # an empty leaf
    csv = tmp_path / "blocks.csv"
    pd.DataFrame(
        {"GEOID": leaves, "ya": truth[:, 0], "yb": 0, "oa": truth[:, 2], "ob": truth[:, 3]}
    ).to_csv(csv, index=False)
    config_path = tmp_path / "tiny.toml"
    config_path.write_text(CONFIG.replace("{input}", str(csv)))
    config = load_topdown_config(config_path)
    nodes = {"root": [""], "mid": ["0", "1"], "leaf": leaves}
    rows = []
    for level, codes in nodes.items():
        digits = config.hierarchy.level(level).digits
        for code in codes:
            hist = truth[[i for i, g in enumerate(leaves) if g[:digits] == code]].sum(axis=0)
            for q in config.queries[level]:
                noise = rng.integers(-3, 4, size=q.size)
                rows.append((level, code, q.name, (q.answer(np.arange(4), hist) + noise).tolist()))
    noisy = pd.DataFrame(rows, columns=["level", "geocode", "query", "noisy"])
    parts = {lv: g.drop(columns="level") for lv, g in noisy.groupby("level")}
    stale = parts["leaf"].copy()
    stale.attrs["level"] = "leaf"
    write_delta(tmp_path / "release" / "noisy_measurements", parts, stale)
    assert len(read_delta(tmp_path / "release" / "noisy_measurements")) == len(noisy)

    ref = gls_reference(tmp_path / "release", config_path)
    problem, _, _, active = build_problem(config, noisy, np.array(leaves), truth)
    assert active.tolist() == [0, 2, 3]
    membership = {
        lv: np.array(
            [[float(g[: config.hierarchy.level(lv).digits] == c) for g in leaves] for c in codes]
        )
        for lv, codes in nodes.items()
    }
    dense = dense_gls(problem, [membership[lv] for lv in nodes])
    for lv in ref.levels:
        np.testing.assert_array_equal(lv.geocodes, nodes[lv.name])
        np.testing.assert_array_equal(lv.truth, membership[lv.name] @ truth)
        np.testing.assert_allclose(lv.gls[:, active], membership[lv.name] @ dense, atol=1e-9)
        assert (lv.gls[:, 1] == 0).all()
    mid = ref.level("mid")
    np.testing.assert_allclose(mid.gls.sum(axis=1), mid.truth.sum(axis=1), atol=1e-9)


def test_the_command_line_prints_each_level_and_writes_the_reference(tmp_path, monkeypatch, capsys):
    test_a_release_folder_gives_the_dense_gls_and_the_truth(tmp_path)
    ref = gls_reference(tmp_path / "release", tmp_path / "tiny.toml")
    written = tmp_path / "gls.parquet"
    argv = ["gls_reference", "--release", str(tmp_path / "release"), "--config"]
    argv += [str(tmp_path / "tiny.toml"), "--solver", "tree", "--write", str(written)]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in printed[3:]] == ["| root", "| mid", "| leaf"]
    frame = pd.read_parquet(written)
    expected = ref.frame()
    assert frame[["level", "geocode", "cell"]].equals(expected[["level", "geocode", "cell"]])
    np.testing.assert_allclose(frame["gls"], expected["gls"], atol=1e-9)  # the tree solver's
    assert (frame["truth"] == expected["truth"]).all()


def test_read_delta_replays_a_checkpoint_then_the_commits_after_it(tmp_path):
    table = tmp_path / "t"
    (table / "_delta_log").mkdir(parents=True)
    for name in ("a", "b", "c"):
        pq.write_table(pa.table({"x": [name]}), table / f"{name}.parquet")
    add = pa.struct([("path", pa.string()), ("partitionValues", pa.map_(pa.string(), pa.string()))])
    checkpoint = pa.table(
        {
            "add": pa.array(
                [{"path": "a.parquet", "partitionValues": [("level", "l0")]}, None], type=add
            ),
            "remove": pa.array(
                [None, {"path": "old.parquet"}], type=pa.struct([("path", pa.string())])
            ),
        }
    )
    pq.write_table(checkpoint, table / "_delta_log" / "00000000000000000010.checkpoint.parquet")
    # commits up to the checkpoint are ignored (their file is gone); later ones apply
    (table / "_delta_log" / "00000000000000000009.json").write_text(
        json.dumps({"add": {"path": "gone.parquet", "partitionValues": {}}})
    )
    (table / "_delta_log" / "00000000000000000011.json").write_text(
        json.dumps({"add": {"path": "b.parquet", "partitionValues": {"level": "l1"}}})
        + "\n"
        + json.dumps({"add": {"path": "c.parquet", "partitionValues": {"level": "l1"}}})
    )
    (table / "_delta_log" / "00000000000000000012.json").write_text(
        json.dumps({"remove": {"path": "c.parquet"}})
    )
    frame = read_delta(table).sort_values("x")
    assert frame["x"].tolist() == ["a", "b"]
    assert frame["level"].tolist() == ["l0", "l1"]
