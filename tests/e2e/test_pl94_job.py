"""TopDown persons and units end to end on the real P.L. 94-171 legacy files (the 2018
End-to-End prototype for Providence County, RI), through the CLI:
``conf/pl94_e2e_providence.toml`` and ``conf/pl94_e2e_providence_units.toml``, with their
released P.L. 94-171 tables."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from censusdp_spark.api import run_topdown
from censusdp_spark.cli import main
from censusdp_spark.io.pl94_layout import GEOHEADER_FIELDS, GQ_TYPES, RECORD_KEY, SEGMENTS
from censusdp_spark.model.errors import InputError
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.pl94_tables import table_fields
from censusdp_spark.topdown.readers import read_blocks
from tests.helpers.pl94 import SAMPLE
from tests.helpers.release import OCCUPANCY_GUARANTEES_HELD

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "conf" / "pl94_e2e_providence.toml"
UNITS = ROOT / "conf" / "pl94_e2e_providence_units.toml"
GQ = ROOT / "conf" / "pl94_e2e_providence_gq.toml"
BLOCK_POPULATION = 29_225  # the sample's 569 blocks (its state record says 614,053: the county's)
DIGITS = {"nation": 0, "state": 2, "county": 5, "tract": 11, "block_group": 12, "block": 15}


def run(config: Path, tmp_path: Path, secret: str) -> Path:
    secret_file = tmp_path / "secret.hex"
    secret_file.write_text(secret * 32 + "\n")
    secret_file.chmod(0o600)
    out = tmp_path / "out"
    args = ["--config", str(config), "--output", str(out), "--secret-file", str(secret_file)]
    assert main(["topdown", *args]) == 0
    return out


def released_tables(spark, out: Path, tables: list[str]) -> pd.DataFrame:
    """The Delta table ``pl94_tables``, checked against its CSV copies and across levels: one
    row per node, every level's fields summing to its parent's, field by field."""
    fields = [f.name for f in table_fields(tables)]
    rows = spark.read.format("delta").load(str(out / "pl94_tables")).toPandas()
    assert list(rows.columns) == ["level", "SUMLEV", "GEOCODE", *fields]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "pl94_tables" in manifest["tables"]
    assert manifest["pl94_tables"] == {
        "tables": tables, "csv": [f"pl94_tables_csv/{lv}.csv" for lv in DIGITS]
    }  # fmt: skip
    for level, digits in DIGITS.items():
        csv = pd.read_csv(
            out / "pl94_tables_csv" / f"{level}.csv", dtype=str, keep_default_na=False
        )
        here = rows[rows["level"] == level].drop(columns="level").sort_values("GEOCODE")
        assert list(csv.columns) == ["SUMLEV", "GEOCODE", *fields]
        assert csv.to_numpy().tolist() == here.astype(str).to_numpy().tolist(), level
        assert (here["GEOCODE"].str.len() == digits).all()
    levels = list(DIGITS)
    for parent, child in zip(levels, levels[1:], strict=False):
        children = rows[rows["level"] == child]
        summed = children.groupby(children["GEOCODE"].str[: DIGITS[parent]])[fields].sum()
        parents = rows[rows["level"] == parent].set_index("GEOCODE")[fields]
        pd.testing.assert_frame_equal(summed.sort_index(), parents.sort_index(), check_names=False)
    return rows


def file_blocks(segment: int) -> pd.DataFrame:
    """The sample's block records: GEOCODE and the cells of ``segment``, as integers."""
    geo = pd.read_csv(
        SAMPLE.geoheader, sep="|", header=None, names=list(GEOHEADER_FIELDS), dtype=str
    )
    names = [*RECORD_KEY, *SEGMENTS[segment - 1]]
    cells = pd.read_csv(SAMPLE.segment(segment), sep="|", header=None, names=names, dtype=str)
    blocks = pd.concat([geo[["SUMLEV", "GEOCODE"]], cells[list(SEGMENTS[segment - 1])]], axis=1)
    blocks = blocks[blocks["SUMLEV"] == "750"].set_index("GEOCODE")
    return blocks.drop(columns="SUMLEV").astype("int64")


@pytest.mark.slow
def test_the_providence_config_releases_every_block_with_every_guarantee(spark, tmp_path):
    out = run(CONFIG, tmp_path, "c3")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == OCCUPANCY_GUARANTEES_HELD
    assert manifest["nodes"] == {
        "nation": 1, "state": 1, "county": 1, "tract": 7, "block_group": 28, "block": 569
    }  # fmt: skip
    assert manifest["privacy"]["rho"] == "293764/114921"
    noisy = spark.read.format("delta").load(str(out / "noisy_measurements"))
    measured = noisy.where("level = 'block' AND query = 'detailed'").select("geocode")
    assert measured.distinct().count() == 569  # the 215 empty blocks too: the geoheader's spine
    estimates = spark.read.format("delta").load(str(out / "estimates"))
    totals = {r["level"]: r["t"] for r in estimates.groupBy("level").agg({"count": "sum"})
              .withColumnRenamed("sum(count)", "t").collect()}  # fmt: skip
    assert set(totals.values()) == {BLOCK_POPULATION}  # the state total is invariant
    microdata = spark.read.format("delta").load(str(out / "microdata"))
    assert microdata.count() == BLOCK_POPULATION
    assert set(microdata.columns) == {"geocode", "votingage", "hispanic", "cenrace"}
    # P1-P4 of every node, post-processing of the estimates; the released state's P1 total is
    # its blocks' 29,225 (the file's state record carries the whole county's 614,053)
    tables = released_tables(spark, out, ["P1", "P2", "P3", "P4"])
    assert len(tables) == 1 + 1 + 1 + 7 + 28 + 569
    state = tables[tables["level"] == "state"].iloc[0]
    assert (state["SUMLEV"], state["GEOCODE"], state["P0010001"]) == ("040", "44", BLOCK_POPULATION)
    assert (tables["P0010001"] == tables["P0020001"]).all()
    assert (tables["P0030001"] == tables["P0040001"]).all()
    assert (tables["P0010001"] == tables["P0010002"] + tables["P0010009"]).all()
    assert (tables["P0030001"] <= tables["P0010001"]).all()
    per_node = estimates.groupBy("geocode").agg({"count": "sum"}).collect()
    node_totals = {r["geocode"]: r["sum(count)"] for r in per_node}  # nodes with a non-zero cell
    released = tables.set_index("GEOCODE")["P0010001"].to_dict()
    assert released == {g: node_totals.get(g, 0) for g in released}  # every node, the empty ones 0
    # [[estimation.occupancy]]: the 211 blocks with no housing units and no group-quarters
    # population (an occupied facility) get no persons; the file's 4 other empty blocks may.
    dwellings = file_blocks(2)["H0010001"] + file_blocks(3)["P0050001"]
    unoccupied = dwellings.index[dwellings == 0]
    assert len(unoccupied) == 211
    assert all(released[g] == 0 for g in unoccupied)
    # its bounds: at least one person per GQ type with persons (an occupied facility), at
    # most 99 a housing unit and 99,999 a facility
    facilities = (file_blocks(3)[[cell for _, cell, _ in GQ_TYPES]] > 0).sum(axis=1)
    assert (facilities > 0).sum() > 0
    assert all(released[g] >= facilities[g] for g in facilities.index)
    units = file_blocks(2)["H0010001"]
    assert all(released[g] <= 99 * units[g] + 99_999 * facilities[g] for g in units.index)


@pytest.mark.slow
def test_the_providence_units_config_releases_h1_with_the_block_totals_exact(spark, tmp_path):
    """H1 of every node from the units release: each block's housing units (invariant) are the
    file's H0010001, occupied plus vacant."""
    out = run(UNITS, tmp_path, "c4")
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["guarantee_checks"].values()) == {0}
    tables = released_tables(spark, out, ["H1"])
    assert (tables["H0010001"] == tables["H0010002"] + tables["H0010003"]).all()
    blocks = tables[tables["level"] == "block"].set_index("GEOCODE")
    truth = file_blocks(2)
    assert len(blocks) == len(truth) == 569
    assert (blocks["H0010001"] == truth.loc[blocks.index, "H0010001"]).all()
    assert tables.loc[tables["level"] == "state", "H0010001"].item() == truth["H0010001"].sum()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["topdown", "full_information"])
def test_group_quarters_types_hold_their_facilities_bounds(spark, tmp_path, method):
    """P5 as its own histogram (``table = "group_quarters"``: in households and the seven GQ
    types) with one occupancy group per type: households only where the block has housing
    units, each GQ type only where the file has that type's population (an occupied
    facility), and then at least one person (the 2020 lower bound, one a facility; the legacy
    files count no facilities), at most 99,999; households at most 99 a housing unit. The
    release holds all of it at every block, and the guarantees check counts nothing broken."""
    doc = tomllib.loads(GQ.read_text())
    levels = ["household", *[f"gq{code}" for code, _, _ in GQ_TYPES]]
    assert doc["schema"]["attributes"][0]["levels"] == levels
    doc["estimation"]["method"] = method
    doc["input"]["path"] = str(ROOT / doc["input"]["path"])
    doc["run"]["private_dir"] = str(tmp_path / "private")
    secret = tmp_path / "secret.hex"
    secret.write_text("c5" * 32 + "\n")
    secret.chmod(0o600)
    out = tmp_path / "out"
    run_topdown(doc, spark=spark, output=out, secret_file=secret)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == OCCUPANCY_GUARANTEES_HELD
    estimates = spark.read.format("delta").load(str(out / "estimates")).toPandas()
    blocks = estimates[estimates["level"] == "block"]
    released = (
        blocks.pivot_table(index="geocode", columns="cell", values="count", aggfunc="sum")
        .reindex(index=file_blocks(2).index, columns=range(len(levels)))
        .fillna(0)
    )
    units, gq = file_blocks(2)["H0010001"], file_blocks(3)
    assert (released.loc[units == 0, 0] == 0).all() and (units == 0).sum() > 0
    for g, (_, cell, _) in enumerate(GQ_TYPES, start=1):
        assert (released.loc[gq[cell] == 0, g] == 0).all()
        assert (released.loc[gq[cell] > 0, g] >= 1).all(), cell  # the lower bound
    assert (released[0] <= 99 * units).all()
    assert (gq[[cell for _, cell, _ in GQ_TYPES]] > 0).to_numpy().sum() > 0
    # P5 in the Census's shape, consistent across levels, with each type's bound at every block
    tables = released_tables(spark, out, ["P5"])
    p5 = tables[tables["level"] == "block"].set_index("GEOCODE").loc[gq.index]
    for _, cell, _ in GQ_TYPES:
        assert (p5.loc[gq[cell] > 0, cell] >= 1).all() and (p5.loc[gq[cell] == 0, cell] == 0).all()
    assert (tables["P0050001"] == tables["P0050002"] + tables["P0050007"]).all()


UNITS_GQ = ROOT / "conf" / "pl94_e2e_providence_units_gq.toml"
UNITS_BY_TYPE = ROOT / "data" / "pl94_e2e_providence_units_by_type.csv"


@pytest.mark.slow
def test_the_units_by_type_release_holds_every_blocks_units_and_facilities_exactly(spark, tmp_path):
    """The DAS's units schema (occupied, vacant, seven GQ facility types) on the block table
    derived from the Providence file: each block's housing units and facilities of each type
    are held exactly by equal ``at_least`` and ``at_most``; only occupancy is estimated."""
    table = pd.read_csv(UNITS_BY_TYPE, dtype={"GEOID": str}).set_index("GEOID")
    h1, p5 = file_blocks(2), file_blocks(3)
    assert (table["OCCUPIED"] + table["VACANT"] == h1.loc[table.index, "H0010001"]).all()
    assert (table["OCCUPIED"] == h1.loc[table.index, "H0010002"]).all()
    for t, (_, cell, _) in enumerate(GQ_TYPES, start=1):
        assert (table[f"FAC_GQ{t}"] == (p5.loc[table.index, cell] > 0)).all()
    out = run(UNITS_GQ, tmp_path, "c6")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == OCCUPANCY_GUARANTEES_HELD
    estimates = spark.read.format("delta").load(str(out / "estimates")).toPandas()
    released = (
        estimates[estimates["level"] == "block"]
        .pivot_table(index="geocode", columns="cell", values="count", aggfunc="sum")
        .reindex(index=table.index, columns=range(9))
        .fillna(0)
        .astype(int)
    )
    assert (released[0] + released[1] == table["OCCUPIED"] + table["VACANT"]).all()
    for t in range(1, 8):
        assert (released[1 + t] == table[f"FAC_GQ{t}"]).all()
    assert (released[0] != table["OCCUPIED"]).any()  # the occupancy split is noisy
    state = estimates[estimates["level"] == "state"].groupby("cell")["count"].sum()
    assert state.get(0, 0) + state.get(1, 0) == table[["OCCUPIED", "VACANT"]].to_numpy().sum()


@pytest.mark.parametrize(
    ("bound", "rule"),
    [
        ({"at_least": "H0010001"}, "persons of estimation.occupancy[0], below"),
        ({"at_most": "H0010001"}, "persons of estimation.occupancy[0], above"),
    ],
)
def test_bounds_the_file_breaks_are_refused_naming_the_block(spark, bound, rule):
    """A bound the legacy file's own persons do not meet (one person per housing unit; at most
    one per unit) is refused before anything runs, naming the folder, a block and the rule."""
    doc = tomllib.loads(CONFIG.read_text())
    doc["estimation"]["occupancy"] = [{"where": "H0010001 + P0050001", **bound}]
    doc["input"]["path"] = str(ROOT / doc["input"]["path"])
    config = load_topdown_config(doc, ROOT)
    assert config.input is not None
    with pytest.raises(InputError) as refused:
        read_blocks(spark, config.input, config.schema, 15, config.spine, config.occupancy)
    message = str(refused.value)
    assert str(config.input.path) in message and "block 44" in message and rule in message
    assert "\n" not in message
