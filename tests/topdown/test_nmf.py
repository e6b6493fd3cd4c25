"""The Census Noisy Measurement File layout (``topdown.nmf``, ``topdown.nmf_layout``): a round
trip gives back our tables exactly; the folders, files and columns are those BlueDown's reader
opens; and each rule a bad file breaks is refused in one line naming the level folder, the row
and the rule."""

from __future__ import annotations

import os
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.model.errors import ConfigError, InputError
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.measure import NOISY_SCHEMA
from censusdp_spark.topdown.nmf import read_nmf, write_nmf
from censusdp_spark.topdown.nmf_layout import exact_variance, nmf_level_names, query_key

LEVELS = ["nation", "state", "county", "tract", "block_group", "block"]
DIGITS = [0, 2, 3, 4, 5, 6]
# Two states (two State folders); state 44 with two counties, one county with two tracts.
BLOCKS = ["441111", "441112", "441211", "442111", "442121", "451111"]
QUERIES = {"total": "1/4", "agegroup * kind": "1/4", "detailed": "1/2"}


def config_doc(levels: list[str] = LEVELS, digits: list[int] = DIGITS) -> dict:
    fixed = {"nation": Fraction(1, 8), "state": Fraction(1, 8), "county": Fraction(1, 4)}
    shares = {lv: fixed.get(lv, Fraction(1, 8)) for lv in levels[:-1]}
    shares[levels[-1]] = 1 - sum(shares.values())  # the path's shares sum to 1
    return {
        "run": {"name": "nmf"},
        "schema": {
            "attributes": [
                {"name": "age", "levels": ["child", "adult", "senior"]},
                {"name": "kind", "levels": ["a", "b"]},
            ],
            "recodes": {
                "agegroup": {
                    "attribute": "age",
                    "groups": {"young": ["child"], "old": ["adult", "senior"]},
                }
            },
        },
        "geography": {
            "levels": [{"name": n, "digits": d} for n, d in zip(levels, digits, strict=True)]
        },
        "budget": {
            "rho": "3",  # a query's sigma2 is 1/(2 * 3 * share * query share), e.g. 16/3
            "levels": {lv: {"share": str(shares[lv]), "queries": dict(QUERIES)} for lv in levels},
        },
        "estimation": {"invariants": ["state"]},
    }


CONFIG = load_topdown_config(config_doc())


def histograms() -> dict[tuple[str, str], np.ndarray]:
    """Every node's true histogram (6 cells), from fixed block histograms."""
    rng = np.random.default_rng(7)
    blocks = {g: rng.integers(0, 5, size=CONFIG.schema.n_cells) for g in BLOCKS}
    out = {}
    for level in CONFIG.hierarchy.levels:
        for g, h in blocks.items():
            key = (level.name, g[: level.digits])
            out[key] = out.get(key, 0) + h
    return out


def noisy_rows() -> list[tuple]:
    """Rows in ``NOISY_SCHEMA``: the exact answers (so cell order can be checked in the file),
    every query of every node with the config's exact ``sigma2``."""
    rows = []
    for (level, geocode), h in sorted(histograms().items()):
        cells = np.flatnonzero(h)
        for q in CONFIG.queries[level]:
            answer = q.answer(cells, h[cells]).tolist()
            sigma2 = str(CONFIG.budget.sigma2_for(level, q.name))
            rows.append((level, geocode, q.name, answer, sigma2, [level]))
    return rows


def invariant_rows() -> list[tuple]:
    return [
        (lv, g, int(h.sum())) for (lv, g), h in sorted(histograms().items()) if lv in LEVELS[:2]
    ]


INVARIANTS = "level string, geocode string, inv_total bigint"


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nmf") / "nmf"
    noisy = spark.createDataFrame(noisy_rows(), NOISY_SCHEMA)
    write_nmf(spark, noisy, spark.createDataFrame(invariant_rows(), INVARIANTS), CONFIG, out)
    return out


@pytest.fixture(scope="module")
def read_back(spark, written):
    nmf = read_nmf(spark, written, CONFIG)
    return {
        "noisy": nmf.noisy,
        "rows": sorted(tuple(r) for r in nmf.noisy.collect()),
        "invariants": sorted(tuple(r) for r in nmf.invariants.collect()),
        "geography": sorted(tuple(r) for r in nmf.geography.collect()),
    }


# --- the round trip ---------------------------------------------------------------------------


def test_a_round_trip_gives_back_the_noisy_table_with_exact_variances(read_back):
    assert read_back["rows"] == sorted(
        (lv, g, q, noisy, s2, budget) for lv, g, q, noisy, s2, budget in noisy_rows()
    )
    assert "16/3" in {r[4] for r in read_back["rows"]}  # not a double: sigma2 is exact
    assert read_back["noisy"].schema.simpleString() == (
        "struct<level:string,geocode:string,query:string,noisy:array<bigint>,sigma2:string,"
        "budget_levels:array<string>>"
    )


def test_a_round_trip_gives_back_the_invariants_and_every_node(read_back):
    assert read_back["invariants"] == invariant_rows()
    assert read_back["geography"] == sorted(histograms())
    assert ("nation", "") in read_back["geography"]


# --- one state's folders ---------------------------------------------------------------------


def test_a_states_read_is_its_subtree_from_its_folders_alone(spark, written, read_back, tmp_path):
    """State 45's folders garbage and the nation's gone: state 44's read is its rows of the
    whole file's, below the root."""
    copy = tmp_path / "nmf"
    shutil.copytree(written, copy)
    shutil.rmtree(copy / "US.parquet")
    for level in ("State", "County", "Tract", "Block_Group", "Block"):
        for f in (copy / f"{level}.parquet" / "DPQuery" / "State=45").iterdir():
            f.write_bytes(b"not parquet")
    nmf = read_nmf(spark, copy, CONFIG, ("44",))

    def of_44(rows: list[tuple]) -> list[tuple]:
        return [r for r in rows if r[0] != "nation" and r[1].startswith("44")]

    assert sorted(tuple(r) for r in nmf.noisy.collect()) == of_44(read_back["rows"])
    assert sorted(tuple(r) for r in nmf.invariants.collect()) == of_44(read_back["invariants"])
    assert sorted(tuple(r) for r in nmf.geography.collect()) == of_44(read_back["geography"])


@pytest.mark.parametrize(
    ("states", "removed", "message"),
    [
        (("46",), None, "state '46': unknown: the file has no State=46 folder (2 states: 44, 45)"),
        (("4",), None, "state '4': not a state code: level state's geocodes have 2 characters"),
        (
            ("44", "45"),
            "Tract.parquet/DPQuery/State=45",
            "Tract.parquet/DPQuery/State=45: folder: missing: state 45 has no measurements at"
            " level tract (a state's run reads its folder of every level below the root)",
        ),
    ],
)
def test_a_bad_state_is_refused_in_one_line(spark, written, tmp_path, states, removed, message):
    bad = tmp_path / "bad"
    shutil.copytree(written, bad)
    if removed:
        shutil.rmtree(bad / removed)
    with pytest.raises(InputError) as err:
        read_nmf(spark, bad, CONFIG, states)
    assert "\n" not in str(err.value)
    assert message in str(err.value).replace(str(bad.absolute()) + "/", "")


def test_a_states_row_in_another_states_folder_is_refused(spark, written, tmp_path):
    def moved(df: pd.DataFrame) -> pd.DataFrame:
        df.loc[df.index[0], "geocode"] = "4511"
        return df

    bad = tmp_path / "bad"
    shutil.copytree(written, bad)
    edit(bad / "Tract.parquet/DPQuery/State=44", moved)
    with pytest.raises(InputError, match="the row is not in its State folder; State=44 holds it"):
        read_nmf(spark, bad, CONFIG, ("44",))


# --- the layout BlueDown reads ---------------------------------------------------------------


def only_file(folder: Path) -> Path:
    """What BlueDown's ``InputFormatIO.read`` does: the one file of the folder, or an error."""
    files = os.listdir(folder)
    assert len(files) == 1, files
    return folder / files[0]


def test_the_folders_are_those_bluedown_lists_with_one_file_each(written):
    assert sorted(p.name for p in written.iterdir()) == sorted(
        f"{n}.parquet" for n in ("US", "State", "County", "Tract", "Block_Group", "Block")
    )
    only_file(written / "US.parquet" / "DPQuery")  # the root: no State folder
    only_file(written / "US.parquet" / "Constraint")
    for level in ("State", "County", "Tract", "Block_Group", "Block"):
        dpq = written / f"{level}.parquet" / "DPQuery"
        assert sorted(p.name for p in dpq.iterdir()) == ["State=44", "State=45"]
        for state in ("State=44", "State=45"):
            only_file(dpq / state)
            # BlueDown lists every level's Constraint folder: there, empty below the invariants.
            constraint = written / f"{level}.parquet" / "Constraint" / state
            assert len(os.listdir(constraint)) == (1 if level == "State" else 0)


def test_the_columns_and_cell_order_are_bluedowns(written):
    df = pd.read_parquet(only_file(written / "County.parquet" / "DPQuery" / "State=44"))
    assert list(df.columns[:5]) == ["geocode", "query_name", "query_shape", "value", "variance"]
    node = df[df["geocode"] == "441"].set_index("query_name")
    assert sorted(node.index) == ["agegroup * kind_dpq", "detailed_dpq", "total_dpq"]
    shapes = {name: tuple(node.loc[name, "query_shape"]) for name in node.index}
    assert shapes == {"total_dpq": (1, 1), "agegroup * kind_dpq": (2, 2), "detailed_dpq": (3, 2)}
    # BlueDown's convention: the detailed vector reshaped (row-major) to its query_shape, summed
    # over the attributes a query drops, is that query's vector.
    detailed = np.reshape(node.loc["detailed_dpq", "value"], shapes["detailed_dpq"])
    assert node.loc["total_dpq", "value"].tolist() == [detailed.sum()]
    young, old = detailed[:1].sum(axis=0), detailed[1:].sum(axis=0)
    assert node.loc["agegroup * kind_dpq", "value"].tolist() == [*young, *old]
    sigma2 = CONFIG.budget.sigma2_for("county", "detailed")
    assert node.loc["detailed_dpq", "variance"] == float(sigma2)
    assert node.loc["detailed_dpq", "sigma2"] == str(sigma2)
    con = pd.read_parquet(only_file(written / "State.parquet" / "Constraint" / "State=45"))
    assert con[["geocode", "query_name"]].values.tolist() == [["45", "total_con"]]
    assert con["value"].iloc[0].tolist() == [int(histograms()[("state", "45")].sum())]


def test_level_names_map_by_position_and_other_shapes_are_refused():
    assert list(nmf_level_names(CONFIG).values())[-2:] == ["Block_Group", "Block"]
    five = load_topdown_config(config_doc(LEVELS[:5], DIGITS[:5]))
    with pytest.raises(ConfigError, match=r"\[geography.levels\] the NMF layout has 6 levels"):
        nmf_level_names(five)


def test_a_files_query_names_and_float_variances_are_matched_exactly():
    assert query_key(" agegroup*kind_dpq") == query_key("agegroup * kind") == "agegroup * kind"
    assert Fraction(exact_variance(0.1)) == Fraction(0.1) != Fraction(1, 10)


def test_a_census_style_file_reads_with_its_float_variances_made_exact(spark, written, tmp_path):
    """The Census's file: no ``sigma2``, float32 variances, int32 values, query names spelled
    without spaces, columns we do not read."""
    census = tmp_path / "census"
    shutil.copytree(written, census)
    for path in census.rglob("part-*"):
        if "DPQuery" in path.parts:
            df = pd.read_parquet(path).drop(columns="sigma2")
            df["variance"] = df["variance"].astype(np.float32)
            df["value"] = [np.asarray(v, dtype=np.int32) for v in df["value"]]
            df["query_name"] = df["query_name"].str.replace(" * ", "*")
            df["cenrace"] = "*"
            df.to_parquet(path, index=False)
    nmf = read_nmf(spark, census, CONFIG)
    got = sorted(tuple(r) for r in nmf.noisy.collect())
    as_float32 = {s2: exact_variance(float(np.float32(Fraction(s2)))) for *_, s2, _ in noisy_rows()}
    assert got == sorted((lv, g, q, n, as_float32[s2], b) for lv, g, q, n, s2, b in noisy_rows())
    assert as_float32["16/3"] == str(Fraction(float(np.float32(16 / 3)))) != "16/3"


# --- bad files --------------------------------------------------------------------------------


def edit(folder: Path, change) -> None:
    """Rewrite the one Parquet file of ``folder`` as ``change`` makes its rows."""
    path = only_file(folder)
    change(pd.read_parquet(path)).to_parquet(path, index=False)


def refusal(spark, written: Path, tmp_path: Path, where: str, change) -> str:
    bad = tmp_path / "bad"
    shutil.copytree(written, bad)
    if change is None:
        shutil.rmtree(bad / where)
    else:
        edit(bad / where, change)
    with pytest.raises(ValueError) as err:
        read_nmf(spark, bad, CONFIG)
    assert isinstance(err.value, InputError)
    message = str(err.value)
    assert "\n" not in message
    return message.replace(str(bad.absolute()) + "/", "")


def where(df: pd.DataFrame, geocode: str, query: str) -> pd.Series:
    return (df["geocode"] == geocode) & (df["query_name"] == query)


def short_total(df: pd.DataFrame) -> pd.DataFrame:
    df.loc[where(df, "441", "detailed_dpq"), "value"] = pd.Series(
        [np.arange(5)], index=df.index[where(df, "441", "detailed_dpq")]
    )
    return df


def set_column(geocode: str, query: str, column: str, value):
    def change(df: pd.DataFrame) -> pd.DataFrame:
        rows = where(df, geocode, query)
        df[column] = df[column].astype(object)
        df.loc[rows, column] = pd.Series([value] * rows.sum(), index=df.index[rows])
        return df

    return change


DPQ_CASES = {
    "missing_level": (
        "Block_Group.parquet/DPQuery",
        None,
        "Block_Group.parquet/DPQuery: folder: missing: level block_group has no measurements",
    ),
    "wrong_cells": (
        "County.parquet/DPQuery/State=44",
        short_total,
        "County.parquet/DPQuery: row geocode '441', query 'detailed_dpq': wrong number of cells;"
        " the row has 5, the query 6",
    ),
    "cell_order": (
        "County.parquet/DPQuery/State=44",
        set_column("442", "detailed_dpq", "query_shape", np.array([2, 3], dtype=np.int32)),
        "County.parquet/DPQuery: row geocode '442', query 'detailed_dpq': query_shape is not the"
        " config's (per schema attribute, in the config's order); the file has [2, 3], the"
        " config [3, 2]",
    ),
    "unknown_query": (
        "Tract.parquet/DPQuery/State=45",
        set_column("4511", "total_dpq", "query_name", "sex_dpq"),
        "Tract.parquet/DPQuery: row geocode '4511', query 'sex_dpq': unknown query; level tract"
        " has no query of that name",
    ),
    "zero_variance": (
        "Block.parquet/DPQuery/State=44",
        set_column("441112", "total_dpq", "variance", 0.0),
        "Block.parquet/DPQuery: row geocode '441112', query 'total_dpq': the variance must be"
        " positive; got 0.0",
    ),
    "negative_variance": (
        "US.parquet/DPQuery",
        set_column("", "detailed_dpq", "variance", -2.0),
        "US.parquet/DPQuery: row geocode '', query 'detailed_dpq': the variance must be positive",
    ),
    "duplicate": (
        "State.parquet/DPQuery/State=45",
        lambda df: pd.concat([df, df[where(df, "45", "total_dpq")]], ignore_index=True),
        "State.parquet/DPQuery: row geocode '45', query 'total_dpq': the row appears 2 times",
    ),
    "missing_query": (
        "State.parquet/DPQuery/State=45",
        lambda df: df[~where(df, "45", "total_dpq")],
        "State.parquet/DPQuery: row geocode '45': the node has 2 of its level's 3 queries"
        " (agegroup * kind, detailed); every node has all of them",
    ),
    "orphan": (
        "Tract.parquet/DPQuery/State=44",
        lambda df: df[df["geocode"] != "4412"],
        "Block_Group.parquet/DPQuery: row geocode '44121': its parent tract '4412' is not in the"
        " file",
    ),
    "geocode_length": (
        "Block.parquet/DPQuery/State=45",
        set_column("451111", "detailed_dpq", "geocode", "4511110"),
        "Block.parquet/DPQuery: row geocode '4511110', query 'detailed_dpq': geocode of the"
        " wrong length; level block has 6 digits, the geocode 7",
    ),
    "state_folder": (
        "County.parquet/DPQuery/State=45",
        lambda df: df.assign(geocode="441"),
        "County.parquet/DPQuery: row geocode '441', query 'agegroup * kind_dpq': the row is not"
        " in its State folder; State=45 holds it",
    ),
    "sigma2_disagrees": (
        "County.parquet/DPQuery/State=45",
        set_column("451", "total_dpq", "variance", 5.0),
        "County.parquet/DPQuery: row geocode '451', query 'total_dpq': sigma2 does not agree"
        " with the variance",
    ),
}


@pytest.mark.parametrize("case", DPQ_CASES, ids=list(DPQ_CASES))
def test_a_bad_measurement_file_is_refused_in_one_line(spark, written, tmp_path, case):
    folder, change, expected = DPQ_CASES[case]
    assert expected in refusal(spark, written, tmp_path, folder, change)


def test_a_file_without_a_column_of_the_layout_is_refused(spark, written, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(written, bad)
    for path in bad.rglob("part-*"):
        if "DPQuery" in path.parts:
            pd.read_parquet(path).drop(columns="query_shape").to_parquet(path, index=False)
    with pytest.raises(InputError) as err:
        read_nmf(spark, bad, CONFIG)
    assert str(err.value) == (
        f"{bad.absolute()}: column query_shape: missing (the layout has geocode, query_name,"
        " query_shape, value, variance)"
    )


def test_a_total_that_is_not_its_childrens_sum_is_refused(spark, written, tmp_path):
    total = int(histograms()[("nation", "")].sum())
    change = set_column("", "total_con", "value", np.array([total + 1]))
    message = refusal(spark, written, tmp_path, "US.parquet/Constraint", change)
    assert message == (
        f"US.parquet/Constraint: row geocode '', query 'total_con': the total {total + 1} is not"
        f" the sum {total} of its children's totals at level state"
    )


def test_a_total_given_twice_with_two_values_is_refused(spark, written, tmp_path):
    def twice(df: pd.DataFrame) -> pd.DataFrame:
        other = df.copy()
        other["value"] = [np.array([v[0] + 1]) for v in other["value"]]
        return pd.concat([df, other], ignore_index=True)

    message = refusal(spark, written, tmp_path, "State.parquet/Constraint/State=44", twice)
    assert message == (
        "State.parquet/Constraint: row geocode '44', query 'total_con': the total is given 2"
        " times with different values"
    )


# --- the writer's own refusals ----------------------------------------------------------------


def test_the_writer_refuses_a_wrong_variance_and_writes_nothing(spark, tmp_path):
    rows = noisy_rows()
    level, geocode, query, noisy, _, budget = rows[0]
    rows[0] = (level, geocode, query, noisy, "7", budget)
    out = tmp_path / "nmf"
    invariants = spark.createDataFrame(invariant_rows(), INVARIANTS)
    with pytest.raises(InputError, match="sigma2 is not the config's for the query; sigma2 7"):
        write_nmf(spark, spark.createDataFrame(rows, NOISY_SCHEMA), invariants, CONFIG, out)
    assert not out.exists()
    (out / "old").mkdir(parents=True)
    with pytest.raises(InputError, match="exists and is not empty"):
        write_nmf(spark, spark.createDataFrame(noisy_rows(), NOISY_SCHEMA), invariants, CONFIG, out)


def test_the_writer_refuses_a_run_that_bypasses_single_child_parents(spark, tmp_path):
    doc = config_doc()
    doc["budget"]["bypass_single_child"] = True
    noisy = spark.createDataFrame([], NOISY_SCHEMA)
    with pytest.raises(ConfigError, match="bypass_single_child"):
        write_nmf(spark, noisy, noisy, load_topdown_config(doc), tmp_path / "nmf")
