"""The released P.L. 94-171 tables (``[output.pl94_tables]``) computed from histograms: without
Spark, on the shipped 2018 End-to-End files, the tables computed from the histograms the reader
derives are the file's own, field by field, at every block, tract and block group; then the
Spark layer's Delta table and CSV files on a few nodes."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.io.pl94_layout import CELLS, GEOHEADER_FIELDS, RACE_LAYOUT, RECORD_KEY, SEGMENTS
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import LevelSpan
from censusdp_spark.topdown.census_tables import table_matrix, write_census_tables
from censusdp_spark.topdown.config import TopDownConfig, load_topdown_config
from censusdp_spark.topdown.pl94_tables import CENSUS_TABLES, table_fields, table_values
from censusdp_spark.topdown.readers import legacy_terms

ROOT = Path(__file__).resolve().parents[2]
PERSONS = ROOT / "conf" / "pl94_e2e_providence.toml"
UNITS = ROOT / "conf" / "pl94_e2e_providence_units.toml"
PRODUCTION = ROOT / "conf" / "pl94_2020_production.toml"
GQ_LEVELS = ["household", "correctional", "juvenile", "nursing", "other_inst", "college",
             "military", "other_noninst"]  # fmt: skip


def group_quarters_config() -> dict[str, Any]:
    """The units config read as ``table = "group_quarters"`` (persons by GQTYPE_PL), asking P5."""
    doc = tomllib.loads(UNITS.read_text())
    doc["schema"]["attributes"] = [{"name": "gq", "levels": GQ_LEVELS}]
    doc["input"]["table"] = "group_quarters"
    doc["input"]["attributes"] = {
        "gq": {"column": "GQTYPE_PL", "map": {str(i): lv for i, lv in enumerate(GQ_LEVELS)}}
    }
    doc["output"]["pl94_tables"]["tables"] = ["P5"]
    return doc


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    """Every record of the sample: its SUMLEV, GEOCODE and every table cell, as integers."""
    config = load_topdown_config(PERSONS, ROOT)
    assert config.input is not None
    files = config.input.legacy_files()

    def read(path: Path, names: tuple[str, ...]) -> pd.DataFrame:
        return pd.read_csv(path, sep="|", header=None, names=list(names), dtype=str)

    geo = read(files.geoheader, GEOHEADER_FIELDS)[["SUMLEV", "GEOCOMP", "GEOCODE"]]
    segments = [read(files.segment(n), (*RECORD_KEY, *SEGMENTS[n - 1])) for n in (1, 2, 3)]
    cells = pd.concat([s[list(s.columns[len(RECORD_KEY) :])] for s in segments], axis=1)
    return pd.concat([geo, cells[list(CELLS)].astype(np.int64)], axis=1)


def derived_histograms(config: TopDownConfig, records: pd.DataFrame) -> np.ndarray:
    """Each record's histogram over the schema's cells, as the reader derives it."""
    assert config.input is not None
    terms, index = legacy_terms(config.input)
    histograms = np.zeros((len(records), config.schema.n_cells), dtype=np.int64)
    histograms[:, index] = np.rint(records[list(CELLS)].to_numpy(np.float64) @ terms)
    return histograms


def tables_of(config: TopDownConfig, histograms: np.ndarray) -> pd.DataFrame:
    """The tables of each histogram (a row), through the sparse path the release takes."""
    assert config.pl94_tables is not None
    names, matrix = table_matrix(config.pl94_tables, config.schema)
    cells = [np.flatnonzero(h) for h in histograms]
    counts = [h[c] for h, c in zip(histograms, cells, strict=True)]
    return pd.DataFrame(table_values(cells, counts, matrix), columns=list(names))


@pytest.mark.parametrize(
    ("config", "tables"),
    [(PERSONS, ["P1", "P2", "P3", "P4"]), (UNITS, ["H1"]), (group_quarters_config(), ["P5"])],
    ids=["persons", "units", "group_quarters"],
)
def test_the_tables_of_the_derived_histograms_are_the_files_at_every_geography(
    records, config, tables
):
    """At every block, from its derived histogram; at every tract and block group, from the sum
    of its blocks' histograms (the file's records of these levels are their blocks' sums)."""
    config = load_topdown_config(config, ROOT)
    assert config.pl94_tables is not None and list(config.pl94_tables.tables) == tables
    names = [f.name for f in table_fields(tables)]
    blocks = records[records["SUMLEV"] == "750"].reset_index(drop=True)
    block_histograms = derived_histograms(config, blocks)
    computed = tables_of(config, block_histograms)
    assert len(blocks) == 569 and computed.shape[1] == len(names)
    pd.testing.assert_frame_equal(computed, blocks[names], check_dtype=False)
    for sumlev, digits in (("140", 11), ("150", 12)):
        parents = records[(records["SUMLEV"] == sumlev) & (records["GEOCOMP"] == "00")]
        summed = np.array(
            [block_histograms[blocks["GEOCODE"].str[:digits] == g].sum(axis=0)
             for g in parents["GEOCODE"]]
        )  # fmt: skip
        pd.testing.assert_frame_equal(
            tables_of(config, summed), parents[names].reset_index(drop=True), check_dtype=False
        )
    assert computed.to_numpy().sum() > 0


def test_the_state_total_of_the_blocks_is_not_the_state_records(records):
    """The sample's state record carries the whole county's 614,053 people; its 569 blocks, and
    so the released state, hold 29,225 (docs/how-it-works.md: P.L. 94-171 legacy files)."""
    config = load_topdown_config(PERSONS, ROOT)
    blocks = records[records["SUMLEV"] == "750"]
    state = tables_of(config, derived_histograms(config, blocks).sum(axis=0)[None, :])
    assert state["P0010001"].item() == 29_225
    assert records.loc[records["SUMLEV"] == "040", "P0010001"].tolist() == [614_053]


def test_the_production_schema_determines_p1_to_p5_through_its_variables_section():
    """conf/pl94_2020_production.toml (PPMF input, hhgq x votingage x hispanic x cenrace): each
    field is the sum over the histogram's axes its variables select."""
    config = load_topdown_config(PRODUCTION, ROOT)
    histogram = np.random.default_rng(15).integers(0, 5, config.schema.n_cells)
    fields = tables_of(config, histogram[None, :]).iloc[0]
    cube = histogram.reshape(8, 2, 2, 63)  # hhgq, votingage, hispanic, cenrace
    races = [f"P001{c:04d}" for c in RACE_LAYOUT.races]
    assert (fields[races].to_numpy() == cube.sum(axis=(0, 1, 2))).all()
    adult_races = [f"P003{c:04d}" for c in RACE_LAYOUT.races]
    assert (fields[adult_races].to_numpy() == cube[:, 1].sum(axis=(0, 1))).all()
    not_hispanic_adults = [f"P004{c + 2:04d}" for c in RACE_LAYOUT.races]
    assert (fields[not_hispanic_adults].to_numpy() == cube[:, 1, 0].sum(axis=0)).all()
    assert fields["P0020002"] == cube[:, :, 1].sum() and fields["P0040002"] == cube[:, 1, 1].sum()
    assert fields["P0010001"] == fields["P0020001"] == histogram.sum()
    assert fields["P0010009"] == cube[..., 6:].sum()  # two or more races: CENRACE 07-63
    by_type = cube.sum(axis=(1, 2, 3))
    p5 = [f"P00500{i:02d}" for i in (3, 4, 5, 6, 8, 9, 10)]
    assert (fields[p5].to_numpy() == by_type[1:]).all()
    assert fields["P0050001"] == by_type[1:].sum() and fields["P0050002"] == by_type[1:5].sum()
    assert len(fields) == sum(len(CENSUS_TABLES[t].fields) for t in ("P1", "P2", "P3", "P4", "P5"))


def edited(source: Path, tmp_path: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, new, 1))
    return path


TABLES = 'tables = ["P1", "P2", "P3", "P4"]'
PRODUCTION_TABLES = 'tables = ["P1", "P2", "P3", "P4", "P5"]'
HISPANIC_MAP = 'attribute = "hispanic"\nmap = { "1" = "not_hispanic", "2" = "hispanic" }'


@pytest.mark.parametrize(
    ("source", "old", "new", "key", "rule"),
    [
        (PERSONS, TABLES, 'tables = ["P1", "P5"]', "output.pl94_tables.tables",
         "P5 needs ['GQTYPE_PL'], which the schema does not hold ([input] table = 'persons' has"
         " only ['VOTING_AGE', 'CENHISP', 'CENRACE'])"),
        (PERSONS, TABLES, 'tables = ["P1", "P6"]', "output.pl94_tables.tables",
         "['P6'] are not among ['P1', 'P2', 'P3', 'P4', 'P5', 'H1']"),
        (PERSONS, TABLES, 'tables = ["P1", "P1"]', "output.pl94_tables.tables",
         "tables must be distinct"),
        (PERSONS, TABLES, f'{TABLES}\nvariables = {{ CENRACE = {{ attribute = "cenrace" }} }}',
         "output.pl94_tables.variables", "not used with [input] format = 'pl94_legacy'"),
        (UNITS, 'tables = ["H1"]', 'tables = ["P1"]', "output.pl94_tables.tables",
         "P1 needs ['CENRACE']"),
        (PRODUCTION, HISPANIC_MAP, 'attribute = "hispanic"\nmap = { "1" = "not_hispanic", "2" ='
         ' "not_hispanic" }', "output.pl94_tables.variables.CENHISP.map",
         "need each code of CENHISP ['1', '2'] mapped to its own level of hispanic"),
        (PRODUCTION, 'attribute = "hispanic"', 'attribute = "origin"',
         "output.pl94_tables.variables.CENHISP.attribute", "'origin' is not an attribute"),
        (PRODUCTION, 'attribute = "hispanic"', 'attribute = "votingage"',
         "output.pl94_tables.variables.CENHISP.attribute", "'votingage' already holds VOTING_AGE"),
        (PRODUCTION, "[output.pl94_tables.variables.CENHISP]", "[output.pl94_tables.variables.HISP]",
         "output.pl94_tables.variables", "['HISP'] are not among"),
        (PRODUCTION, "[output.pl94_tables.variables.CENHISP]\n" + HISPANIC_MAP, "",
         "output.pl94_tables.tables", "P2 needs ['CENHISP'], which the schema does not hold (map"
         " each in [output.pl94_tables.variables.<VARIABLE>])"),
        (PRODUCTION, PRODUCTION_TABLES, f'{PRODUCTION_TABLES}\nformat = "csv"',
         "output.pl94_tables", "unknown key(s) ['format']"),
    ],
)  # fmt: skip
def test_a_bad_tables_section_is_refused_naming_its_key(tmp_path, source, old, new, key, rule):
    with pytest.raises(ConfigError) as refused:
        load_topdown_config(edited(source, tmp_path, old, new), ROOT)
    assert refused.value.key == key and rule in refused.value.rule, refused.value


def test_the_variables_section_is_required_without_legacy_input():
    doc = tomllib.loads(PRODUCTION.read_text())
    del doc["output"]["pl94_tables"]["variables"]
    with pytest.raises(ConfigError, match=r"\[output\.pl94_tables\] missing required key\(s\)"):
        load_topdown_config(doc, ROOT)


def test_a_coarser_legacy_map_cannot_give_the_tables():
    """Two races summed into one level: P1 would need them apart."""
    doc = tomllib.loads(PERSONS.read_text())
    doc["schema"]["attributes"][2] = {"name": "cenrace", "levels": ["one", "more"]}
    groups = {f"{r:02d}": ("one" if r <= 6 else "more") for r in range(1, 64)}
    doc["input"]["attributes"]["cenrace"]["map"] = groups
    with pytest.raises(ConfigError) as refused:
        load_topdown_config(doc, ROOT)
    assert refused.value.key == "input.attributes.cenrace.map"
    assert "the P.L. 94-171 tables need each code of CENRACE" in refused.value.rule


def test_the_spark_tables_hold_every_node_in_delta_and_one_csv_per_level(spark, tmp_path):
    """Units H1 from long estimates: a node without estimated cells (an empty block) is a row of
    zeros; the CSV of each level is the Delta table's rows, by geocode, with a header."""
    config = load_topdown_config(UNITS, ROOT)
    config = replace(config, run=replace(config.run, output=tmp_path))
    nodes = {"nation": [""], "state": ["44"], "county": ["44007"], "tract": ["44007000101"],
             "block_group": ["440070001011"], "block": ["440070001011001", "440070001011000"]}  # fmt: skip
    geography = spark.createDataFrame(
        [(lv, g) for lv, gs in nodes.items() for g in gs], "level string, geocode string"
    )
    estimates = spark.createDataFrame(
        [(lv, gs[-1], cell, n) for lv, gs in nodes.items() for cell, n in ((0, 3), (1, 2))],
        "level string, geocode string, cell int, count bigint",
    )  # every level's last node: 3 occupied, 2 vacant; block ...001 has none
    csv = write_census_tables(spark, estimates, geography, config)
    assert csv == [f"pl94_tables_csv/{lv}.csv" for lv in nodes]
    rows = spark.read.format("delta").load(str(tmp_path / "pl94_tables")).toPandas()
    assert list(rows.columns) == ["level", "SUMLEV", "GEOCODE", "H0010001", "H0010002", "H0010003"]
    by_geocode = rows.set_index("GEOCODE")
    assert by_geocode.loc["440070001011001", ["H0010001", "H0010002", "H0010003"]].tolist() == [
        0, 0, 0
    ]  # fmt: skip
    assert by_geocode.loc["44007", ["H0010001", "H0010002", "H0010003"]].tolist() == [5, 3, 2]
    assert dict(zip(rows["level"], rows["SUMLEV"], strict=True)) == {
        "nation": "010", "state": "040", "county": "050", "tract": "140",
        "block_group": "150", "block": "750",
    }  # fmt: skip
    block = pd.read_csv(tmp_path / csv[-1], dtype={"SUMLEV": str, "GEOCODE": str})
    assert list(block.columns) == ["SUMLEV", "GEOCODE", "H0010001", "H0010002", "H0010003"]
    assert block["GEOCODE"].tolist() == ["440070001011000", "440070001011001"]
    assert block["H0010001"].tolist() == [5, 0]
    assert sorted(p.name for p in (tmp_path / "pl94_tables_csv").iterdir()) == sorted(
        f"{lv}.csv" for lv in nodes
    )
    # a retried or resumed run over what a killed attempt left writes them once, identically
    first = {p.name: p.read_bytes() for p in (tmp_path / "pl94_tables_csv").iterdir()}
    leftover = tmp_path / "pl94_tables_csv" / "_staging" / "level=block"
    leftover.mkdir(parents=True)
    (leftover / "part-00000.csv").write_text("SUMLEV,GEOCODE\n")
    (tmp_path / "pl94_tables" / "part-leftover.parquet").write_bytes(b"")
    assert write_census_tables(spark, estimates, geography, config) == csv
    assert {p.name: p.read_bytes() for p in (tmp_path / "pl94_tables_csv").iterdir()} == first
    again = spark.read.format("delta").load(str(tmp_path / "pl94_tables")).toPandas()
    key = ["level", "GEOCODE"]
    pd.testing.assert_frame_equal(
        again.sort_values(key).reset_index(drop=True), rows.sort_values(key).reset_index(drop=True)
    )
    assert not (tmp_path / "pl94_tables" / "part-leftover.parquet").exists()


def test_asking_for_tables_changes_the_outputs_not_the_measurement():
    """The tables are post-processing: a secret bound to a release without them may make one
    with them from the same noisy measurements; but they change what the release is, so a run
    started without them does not resume with them."""
    from censusdp_spark.release.runner import release_contents
    from censusdp_spark.topdown.job import ESTIMATION_KEYS, OUTPUT_KEYS

    def contents(doc: dict, tables: list[str]):
        keys = {"estimation_keys": ESTIMATION_KEYS, "output_keys": OUTPUT_KEYS}
        return release_contents("topdown", doc, "input", tables=tables, **keys)

    doc = tomllib.loads(PERSONS.read_text())
    without = {k: v for k, v in doc.items() if k != "output"}
    asked, not_asked = contents(doc, ["pl94_tables"]), contents(without, [])
    assert asked.measurement_sha256 == not_asked.measurement_sha256
    assert [key for _, key in asked.changed(not_asked.fingerprints())] == [
        "output.pl94_tables",
        "tables",
    ]
    changed = {**doc, "estimation": {"invariants": ["county"]}}
    assert contents(changed, []).measurement_sha256 != asked.measurement_sha256


def test_a_release_without_its_root_has_the_tables_of_its_levels(spark, tmp_path):
    """A state-by-state release (``top = 1``): no nation node, so no nation table."""
    config = load_topdown_config(UNITS, ROOT)
    config = replace(config, run=replace(config.run, output=tmp_path))
    nodes = {"state": ["44"], "county": ["44007"], "tract": ["44007000101"],
             "block_group": ["440070001011"], "block": ["440070001011000"]}  # fmt: skip
    geography = spark.createDataFrame(
        [(lv, g) for lv, gs in nodes.items() for g in gs], "level string, geocode string"
    )
    estimates = spark.createDataFrame(
        [(lv, gs[0], 0, 3) for lv, gs in nodes.items()],
        "level string, geocode string, cell int, count bigint",
    )
    csv = write_census_tables(spark, estimates, geography, config, LevelSpan(top=1))
    assert csv == [f"pl94_tables_csv/{lv}.csv" for lv in nodes]
