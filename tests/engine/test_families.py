"""map_families (many families per Python call) and the group-keyed measurement noise."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from censusdp_spark.engine.families import (
    OUTPUT_BATCH_ROWS,
    _through_pandas,
    family_starts,
    map_children,
    map_families,
)
from censusdp_spark.topdown.measure import QueryNoise, exact_marginals, noisy_group

SECRET = bytes(range(32))


def _summary(family: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "family": [family["family"].iat[0]],
            "rows": [len(family)],
            "members": [",".join(str(m) for m in family["member"])],
        }
    )


def _batch_summary(batch: pd.DataFrame) -> pd.DataFrame:
    bounds = np.append(family_starts(batch, ["family"]), len(batch))
    return pd.concat(
        [_summary(batch.iloc[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    )


@pytest.mark.parametrize("batch_rows", [1, 3, 10_000])
@pytest.mark.parametrize("batched", [False, True])
def test_every_family_is_solved_once_whole_and_sorted(spark, batch_rows, batched):
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 9, size=60)
    rows = [(f"f{f:03d}", int(m)) for f, n in enumerate(sizes) for m in rng.permutation(n)]
    df = spark.createDataFrame(rows, "family string, member int")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_rows))
    try:
        solve = _batch_summary if batched else _summary
        schema = "family string, rows long, members string"
        out = map_families(df, ["family"], ["member"], solve, schema, batched=batched).toPandas()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    out = out.sort_values("family").reset_index(drop=True)
    assert list(out["family"]) == [f"f{f:03d}" for f in range(len(sizes))]
    assert list(out["rows"]) == list(sizes)
    assert list(out["members"]) == [",".join(str(m) for m in range(n)) for n in sizes]


def test_families_stay_whole_after_a_join_that_adaptive_execution_turns_into_a_broadcast(spark):
    """The shape of every engine's family step: children joined to their parents' rows, then
    ``map_families`` on the join key. With statistics unknown (checkpointed inputs) Spark plans
    a sort-merge join, whose partitioning by the key would satisfy a plain ``repartition(key)``;
    adaptive execution then turns the join into a broadcast read locally from the map side,
    which scatters a key over several tasks. Families must still arrive whole."""
    rng = np.random.default_rng(11)
    sizes = rng.integers(1, 12, size=400)
    rows = [(f"p{f:03d}", f"p{f:03d}-{m:02d}") for f, n in enumerate(sizes) for m in range(n)]
    shuffled = [rows[i] for i in rng.permutation(len(rows))]  # a family spread over partitions
    children = (
        spark.createDataFrame(shuffled, "parent string, member string")
        .repartition(8)
        .localCheckpoint()
    )
    parents = spark.createDataFrame(
        [(f"p{f:03d}", int(n)) for f, n in enumerate(sizes)], "parent string, expected long"
    ).localCheckpoint()

    def summary(family: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "parent": [family["parent"].iat[0]],
                "rows": [len(family)],
                "expected": [family["expected"].iat[0]],
            }
        )

    families = map_families(
        children.join(parents, "parent", "left"),
        ["parent"],
        ["member"],
        summary,
        "parent string, rows long, expected long",
    )
    # The family shuffle must be in the plan, not folded into the join's.
    plan = families._jdf.queryExecution().executedPlan().toString()
    assert "REPARTITION_BY_COL" in plan
    out = families.toPandas()
    assert out["parent"].is_unique
    assert len(out) == len(sizes)
    assert (out["rows"] == out["expected"]).all()


@pytest.mark.parametrize("batch_rows", [2, 10_000])
@pytest.mark.parametrize("batched", [False, True])
def test_children_meet_their_parents_row_in_one_shuffle(spark, batch_rows, batched):
    """``map_children``: every child row carries its parent's columns (null when the parent
    has no row), parents without children are not solved, and the parents travel in the
    children's shuffle (one exchange, no join)."""
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 6, size=40)
    rows = [(f"p{f:02d}{m:02d}", int(m)) for f, n in enumerate(sizes) for m in range(n)]
    children = (
        spark.createDataFrame(
            [rows[i] for i in rng.permutation(len(rows))], "geocode string, member int"
        )
        .repartition(4)
        .localCheckpoint()
    )  # a family spread over partitions
    # p00 has no parent row; p40 and p41 have no children.
    parents = spark.createDataFrame(
        [(f"p{f:02d}", int(n)) for f, n in enumerate([*sizes, 0, 0]) if f > 0],
        "geocode string, expected long",
    )

    def summary(batch: pd.DataFrame) -> pd.DataFrame:
        bounds = np.append(family_starts(batch, ["parent"]), len(batch))
        return pd.DataFrame(
            [
                (
                    batch["parent"].iat[a],
                    b - a,
                    int(batch["parent_expected"].iat[a])
                    if batch["parent_expected"].notna().iat[a]
                    else -1,
                    ",".join(str(m) for m in batch["member"].iloc[a:b]),
                )
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ],
            columns=["parent", "rows", "expected", "members"],
        )

    families = map_children(
        children,
        parents,
        F.substring("geocode", 1, 3),
        ["member"],
        summary,
        "parent string, rows long, expected long, members string",
        batched,
    )
    plan = families._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange") == 1 and "Join" not in plan
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_rows))
    try:
        out = families.toPandas().sort_values("parent").reset_index(drop=True)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert list(out["parent"]) == [f"p{f:02d}" for f in range(len(sizes))]
    assert list(out["rows"]) == list(sizes)
    assert list(out["expected"]) == [-1, *sizes[1:]]
    assert list(out["members"]) == [",".join(map(str, range(n))) for n in sizes]


def test_family_starts_marks_key_changes():
    batch = pd.DataFrame({"a": ["x", "x", "y", "y", "y"], "b": [1, 2, 2, 2, 3]})
    assert list(family_starts(batch, ["a"])) == [0, 2]
    assert list(family_starts(batch, ["a", "b"])) == [0, 1, 2, 4]
    assert list(family_starts(batch.iloc[:0], ["a"])) == [0]


def test_a_large_result_goes_back_to_arrow_in_bounded_batches():
    """One call's result (a noise group's, millions of cells) is converted a slice at a time."""
    schema = pa.schema([("row", pa.int64()), ("cells", pa.list_(pa.int64()))])
    n = 2 * OUTPUT_BATCH_ROWS + 17

    def task(frames):
        for frame in frames:
            yield pd.DataFrame({"row": np.arange(n), "cells": [np.arange(3)] * n})
            yield frame.iloc[:0]  # an empty result yields nothing

    one = pa.RecordBatch.from_pydict({"row": [0]}, schema=pa.schema([("row", pa.int64())]))
    out = list(_through_pandas(task, schema)(iter([one])))
    assert [b.num_rows for b in out] == [OUTPUT_BATCH_ROWS, OUTPUT_BATCH_ROWS, 17]
    table = pa.Table.from_batches(out)
    assert table.column("row").to_pylist() == list(range(n))
    assert table.column("cells").to_pylist()[-1] == [0, 1, 2]


QUERIES = (
    QueryNoise("total", np.zeros(4, dtype=np.int64), 1, Fraction(9, 2)),
    QueryNoise("detailed", np.arange(4, dtype=np.int64), 4, Fraction(2)),
)


def _family(k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    cells = [np.array([0, 3], dtype=np.int32)] * k
    counts = [np.array([5, 7], dtype=np.int64)] * k
    return cells, counts


def test_exact_marginals_of_sparse_histograms():
    cells = [np.array([1, 3]), np.array([], dtype=np.int64), np.array([0])]
    counts = [np.array([2, 5]), np.array([], dtype=np.int64), np.array([4])]
    assert exact_marginals(cells, counts, QUERIES[0]).tolist() == [[7], [0], [4]]
    assert exact_marginals(cells, counts, QUERIES[1]).tolist() == [
        [0, 2, 0, 5],
        [0, 0, 0, 0],
        [4, 0, 0, 0],
    ]


def test_family_noise_is_reproducible_and_keyed_by_group():
    cells, counts = _family(3)
    first = noisy_group(SECRET, "block", "4400101", cells, counts, QUERIES)
    again = noisy_group(SECRET, "block", "4400101", cells, counts, QUERIES)
    other = noisy_group(SECRET, "block", "4400102", cells, counts, QUERIES)
    assert [a.shape for a in first] == [(3, 1), (3, 4)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.slow
def test_family_noise_has_the_stated_variance_per_query_and_no_correlation():
    """Over many groups the noise of each query has variance sigma2 and the noise of nodes sharing a
    stream is uncorrelated (a shared stream must not make nodes' draws dependent)."""
    cells, counts = _family(4)
    truth = [exact_marginals(cells, counts, q) for q in QUERIES]
    draws = [noisy_group(SECRET, "block", f"p{i}", cells, counts, QUERIES) for i in range(20_000)]
    for j, query in enumerate(QUERIES):
        noise = np.stack([d[j] - truth[j] for d in draws]).astype(np.float64)
        flat = noise.reshape(len(draws), -1)
        variance = flat.var(axis=0)
        # Var of the sample variance of 20,000 draws: about 2 sigma^4 / n -> 1% relative sd.
        assert np.all(np.abs(variance / float(query.sigma2) - 1) < 0.06)
        assert abs(flat.mean()) < 0.05
        corr = np.corrcoef(flat, rowvar=False)
        off = corr[~np.eye(corr.shape[0], dtype=bool)]
        assert np.all(np.abs(off) < 0.04)
