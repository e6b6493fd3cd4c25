"""Occupancy from a block table of dwelling counts (``[estimation] dwellings``): the
person/unit consistency for microdata input on a spine. Real Spark and Delta, the real Perry
County PPMF with its spine widened by empty blocks; the dwelling counts are made up per block
from the file (households where it has household persons, facilities where it has group
quarters persons), as a housing file beside the persons would give them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.model.errors import InputError
from censusdp_spark.testing.faults import FailAfter, InjectedFault
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.job import TopDownOptions
from censusdp_spark.topdown.job import run_topdown as run_job
from censusdp_spark.topdown.readers import OCCUPIED, read_blocks
from tests.helpers.release import OCCUPANCY_GUARANTEES_HELD

ROOT = Path(__file__).resolve().parents[2]
PPMF = ROOT / "data" / "ppmf_perry_county_al_20210428_eps12-2.csv"
PPMF_SPINE = ROOT / "data" / "spine" / "ppmf_perry_county_al_blocks.csv"
EMPTY = "011056868001997"  # on the test spine only: no dwelling at all
VACANT = "011056868001998"  # on the test spine only: housing units, nobody in them
LEVELS = [("nation", 0), ("state", 2), ("county", 5), ("tract", 11), ("block_group", 12),
          ("block", 15)]  # fmt: skip
HOUSEHOLD, GQ = 0, 1  # the hhgq levels (cells 2 h + v)


def ppmf_blocks() -> pd.DataFrame:
    """Persons in households and in group quarters per PPMF block."""
    people = pd.read_csv(PPMF, dtype=str)
    block = people["TABBLKST"] + people["TABBLKCOU"] + people["TABTRACT"] + people["TABBLK"]
    gq = people["GQTYPE_PL"] != "0"
    return pd.DataFrame({"household": ~gq, "gq": gq}).groupby(block).sum()


def dwellings_table(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per spine block: ``HU`` housing units (one per three household persons, at least one
    where there is any), ``GQ`` occupied facilities (one where there are GQ persons), and a
    column the config does not read."""
    table = pd.DataFrame(
        {
            "GEOID": blocks.index,
            "HU": (blocks["household"] + 2) // 3,
            "GQ": (blocks["gq"] > 0).astype(int),
            "NOTE": "made up",
        }
    )
    extra = pd.DataFrame({"GEOID": [EMPTY, VACANT], "HU": [0, 4], "GQ": [0, 0], "NOTE": "x"})
    return pd.concat([table, extra], ignore_index=True)


def config(folder: Path, dwellings: Path, spine: Path) -> dict:
    per_level = {"total": "1/2", "detailed": "1/2"}
    return {
        "run": {"name": "dwellings_test", "private_dir": str(folder / "private")},
        "schema": {
            "attributes": [
                {"name": "hhgq", "levels": ["household", "gq"]},
                {"name": "votingage", "levels": ["under18", "18plus"]},
            ]
        },
        "geography": {
            "levels": [{"name": n, "digits": d} for n, d in LEVELS],
            "spine": {"path": str(spine), "geocode": "GEOID"},
        },
        "input": {
            "path": str(PPMF),
            "layout": "microdata",
            "geocode": ["TABBLKST", "TABBLKCOU", "TABTRACT", "TABBLK"],
            "ignore": ["VINTAGE", "TABBLKGRP", "RTYPE", "CENHISP", "CENRACE"],
            "attributes": {
                "hhgq": {
                    "column": "GQTYPE_PL",
                    "map": {"0": "household", **{str(t): "gq" for t in range(1, 8)}},
                },
                "votingage": {"column": "VOTING_AGE", "map": {"1": "under18", "2": "18plus"}},
            },
        },
        "estimation": {
            "method": "full_information",
            "invariants": ["state"],
            "occupancy": [
                {"cells": {"hhgq": ["household"]}, "where": "HU", "at_most": "99 * HU"},
                {
                    "cells": {"hhgq": ["gq"]},
                    "where": "GQ",
                    "at_least": "GQ",
                    "at_most": "99999 * GQ",
                },
            ],
            "dwellings": {"path": str(dwellings), "geocode": "GEOID"},
        },
        "budget": {
            "rho": "1",
            "levels": {n: {"share": "1/6", "queries": per_level} for n, _ in LEVELS},
        },
    }


@pytest.fixture(scope="module")
def spine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spine") / "blocks.csv"
    path.write_text(PPMF_SPINE.read_text() + EMPTY + "\n" + VACANT + "\n")
    return path


@pytest.fixture(scope="module")
def dwellings() -> pd.DataFrame:
    return dwellings_table(ppmf_blocks())


def write(table: pd.DataFrame, folder: Path) -> Path:
    path = folder / "dwellings.csv"
    table.to_csv(path, index=False)
    return path


@pytest.mark.slow
def test_microdata_on_a_spine_holds_the_dwellings_of_every_block(
    spark, tmp_path, spine, dwellings, secret_file
):
    doc = config(tmp_path, write(dwellings, tmp_path), spine)
    out = tmp_path / "out"
    options = TopDownOptions(output=out, secret_file=secret_file, variances=True)
    run_job(spark, load_topdown_config(doc), options)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == OCCUPANCY_GUARANTEES_HELD
    estimates = spark.read.format("delta").load(str(out / "estimates")).toPandas()
    blocks = estimates[estimates["level"] == "block"]
    kind = blocks["cell"] // 2  # hhgq of the cell: 0 household, 1 gq
    per_block = (
        blocks.pivot_table(index="geocode", columns=kind, values="count", aggfunc="sum")
        .reindex(index=dwellings["GEOID"], columns=[HOUSEHOLD, GQ])
        .fillna(0)
    )
    hu, gq = dwellings.set_index("GEOID")["HU"], dwellings.set_index("GEOID")["GQ"]
    assert (gq == 0).sum() > 400 and (hu == 0).sum() > 0
    assert (per_block.loc[hu == 0, HOUSEHOLD] == 0).all()
    assert (per_block.loc[gq == 0, GQ] == 0).all()
    assert (per_block[GQ] >= gq).all() and (per_block[HOUSEHOLD] <= 99 * hu).all()  # the bounds
    assert per_block.loc[EMPTY].sum() == 0 and per_block.loc[VACANT, GQ] == 0
    assert per_block[GQ].sum() > 0 and per_block[HOUSEHOLD].sum() > 0
    assert estimates[estimates["level"] == "state"]["count"].sum() == 10_588  # invariant
    held_in_bottom_up(spark, out, hu, gq)


def held_in_bottom_up(spark, out: Path, hu: pd.Series, gq: pd.Series) -> None:
    """The bottom-up pass holds the occupancy zeros exactly: a block's cells of a group its
    dwellings do not allow are 0 in ``bottom_up``, and so are a block group's where none of
    its blocks allows them; a block's total variance is 0 where no cell is allowed and
    smaller where one group is held than where none is."""
    rows = spark.read.format("delta").load(str(out / "bottom_up")).toPandas()
    # The leaves' means are not stored (the top-down pass fits the leaves to their answers);
    # their held zeros show in their parents': a block group whose blocks all rule a group
    # out has exactly 0 there, which a leaf's non-zero mean in it would break.
    assert rows.loc[rows.level == "block", "mean"].isna().all()
    mean = {(r.level, r.geocode): np.asarray(r.mean) for r in rows.itertuples()}
    gq_cells = [2, 3]  # cell = 2 hhgq + votingage
    by_group = gq.groupby(gq.index.str[:12]).max()
    without = by_group.index[by_group == 0]
    assert len(without) > 0
    for group in without:
        assert not mean[("block_group", group)][gq_cells].any()
    assert mean[("block_group", by_group.index[by_group > 0][0])][gq_cells].any()
    variances = spark.read.format("delta").load(str(out / "total_variances")).toPandas()
    variance = variances.set_index(["level", "geocode"])["variance"]
    both = hu.index[(hu > 0) & (gq > 0)][0]
    assert variance[("block", EMPTY)] == 0.0
    assert 0.0 < variance[("block", VACANT)] < variance[("block", both)]


def edits() -> list[tuple[str, object, str, str]]:
    """(what is changed, the change, where the refusal names, its rule)."""
    return [
        ("drop column", "GQ", "column GQ", "missing (named in estimation.occupancy[1].where)"),
        ("set", (3, "HU", "-1"), "row 4, column HU", "count must be a non-negative integer"),
        ("set", (5, "GEOID", "01105"), "row 6, column GEOID", "geocode must be exactly 15 digits"),
        ("set", (7, "GEOID", None), "row 7, column GEOID", "duplicate geocode"),
        ("append", "011056868001996", "row 514, column GEOID", "is not a block of the input"),
        ("drop row", 10, "rows", "has no row (every block needs its dwelling counts)"),
        ("no units", "HU", "row {row}", "holds persons of estimation.occupancy[0], whose where"),
        ("facilities", "GQ", "block {block}", "persons of estimation.occupancy[1], below"
         " estimation.occupancy[1].at_least = 'GQ'"),
    ]  # fmt: skip


@pytest.mark.parametrize(("edit", "change", "where", "rule"), edits())
def test_a_bad_dwellings_table_is_refused_naming_its_row_and_rule(
    spark, tmp_path, spine, dwellings, edit, change, where, rule
):
    table = dwellings.astype({"HU": str, "GQ": str})
    if edit == "drop column":
        table = table.drop(columns=[change])
    elif edit == "set":
        row, column, value = change
        table.loc[row, column] = table.loc[row - 1, column] if value is None else value
    elif edit == "no units":  # the first block with household persons
        row = int((table[change] != "0").to_numpy().argmax())
        table.loc[row, change] = "0"
        where = where.format(row=row + 1)
    elif edit == "facilities":  # a block with more facilities than persons in them
        people = ppmf_blocks()["gq"]
        block = people.index[people > 0][0]
        row = int((table["GEOID"] == block).to_numpy().argmax())
        table.loc[row, change] = str(people[block] + 1)
        where = where.format(block=block)
    elif edit == "append":
        table = pd.concat([table, pd.DataFrame({"GEOID": [change], "HU": ["1"], "GQ": ["0"]})])
    else:
        table = table.drop(index=change)
    path = write(table, tmp_path)
    run = load_topdown_config(config(tmp_path, path, spine))
    with pytest.raises(InputError) as refused:
        assert run.input is not None
        read_blocks(
            spark, run.input, run.schema, 15, run.spine, run.occupancy, run.dwellings
        ).collect()
    message = str(refused.value)
    assert str(path) in message and where in message and rule in message, message
    assert "\n" not in message


def test_each_block_gets_the_bits_of_the_groups_its_dwellings_allow(spark, tmp_path, spine):
    table = dwellings_table(ppmf_blocks())
    run = load_topdown_config(config(tmp_path, write(table, tmp_path), spine))
    assert run.input is not None
    blocks = read_blocks(spark, run.input, run.schema, 15, run.spine, run.occupancy, run.dwellings)
    bits = {r["geocode"]: r[OCCUPIED] for r in blocks.select("geocode", OCCUPIED).collect()}
    expected = (table["HU"] > 0).astype(int) + 2 * (table["GQ"] > 0).astype(int)
    assert bits == dict(zip(table["GEOID"], expected, strict=True))


@pytest.mark.slow
def test_block_groups_recomputed_from_the_written_blocks_hold_the_same_zeros(
    spark, tmp_path, spine, dwellings, secret_file
):
    """Killed after the blocks' commit, the resumed run computes the block groups one level at
    a time from the written blocks, whose occupancy bits it joins again: the same rows as the
    pair pass wrote before the kill (its block groups' rows are in the table, uncommitted in
    the run's log), zeros included."""
    doc = config(tmp_path, write(dwellings, tmp_path), spine)
    out = tmp_path / "out"
    first = TopDownOptions(output=out, secret_file=secret_file)
    with pytest.raises(InjectedFault):  # stopped where a killed driver leaves the same state
        run_job(spark, load_topdown_config(doc), first, FailAfter("bottom_up_block"))

    def block_groups() -> pd.DataFrame:
        rows = spark.read.format("delta").load(str(out / "bottom_up"))
        rows = rows.filter("level = 'block_group'").toPandas()
        return rows.sort_values("geocode").reset_index(drop=True)

    def versions() -> int:
        return spark.sql(f"DESCRIBE HISTORY delta.`{out / 'bottom_up'}`").count()

    paired, written = block_groups(), versions()
    options = TopDownOptions(output=out, secret_file=secret_file, resume=True)
    run_job(spark, load_topdown_config(doc), options)
    alone = block_groups()
    assert versions() > written  # the block groups (and the levels above) were written again
    assert list(alone["geocode"]) == list(paired["geocode"]) and len(alone) > 0
    for one, other in zip(alone["mean"], paired["mean"], strict=True):
        assert np.allclose(one, other, rtol=1e-9, atol=1e-9)
        assert np.array_equal(np.asarray(one) == 0.0, np.asarray(other) == 0.0)
    gq = dwellings.set_index("GEOID")["GQ"]
    by_group = gq.groupby(gq.index.str[:12]).max()
    held = alone[alone["geocode"].isin(by_group.index[by_group == 0])]
    assert len(held) > 0 and all(not np.asarray(m)[[2, 3]].any() for m in held["mean"])
