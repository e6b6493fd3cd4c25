"""The geography spine: the released geography, and so every noise stream, depends
on the public block list alone, never on which blocks hold a record; real Spark, the CLI, real
PPMF and CALM data."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.group_sizes.config import load_group_sizes_config
from censusdp_spark.group_sizes.readers import read_leaf_histograms
from censusdp_spark.io.readers import read_spine
from censusdp_spark.model.config import SpineSpec
from censusdp_spark.model.errors import ConfigError, InputError
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.readers import read_blocks

ROOT = Path(__file__).resolve().parents[2]
PPMF = ROOT / "data" / "ppmf_perry_county_al_20210428_eps12-2.csv"
PPMF_SPINE = ROOT / "data" / "spine" / "ppmf_perry_county_al_blocks.csv"
CALM = ROOT / "data" / "calm" / "calm_taz_household_sizes.csv"
BLOCK_ASSIGN = (
    ROOT.parent
    / "shared"
    / "data"
    / "real"
    / "ri_2020_block_assignment"
    / "BlockAssign_ST44_RI_VTD.txt"
)
REMOVED = "011056871001011"  # a PPMF block of 3 persons, emptied in the neighbouring input
ADDED = "011056868001999"  # on the test spine only, empty until the neighbour adds one person
# ADDED's row: a household adult, not Hispanic, white; the remaining columns are ignored.
ADDED_ROW = "20210428_eps12-2_P,01,105,686800,1,1999,3,0,2,1,01"

TOPDOWN = """
[run]
name = "spine_test"
output = "{out}"
private_dir = "{private}"
[schema]
attributes = [
  {{ name = "votingage", levels = ["under18", "18plus"] }},
  {{ name = "hispanic", levels = ["not_hispanic", "hispanic"] }},
]
[geography]
levels = [
  {{ name = "nation", digits = 0 }}, {{ name = "state", digits = 2 }},
  {{ name = "county", digits = 5 }}, {{ name = "tract", digits = 11 }},
  {{ name = "block_group", digits = 12 }}, {{ name = "block", digits = 15 }},
]
{spine}
[input]
path = "{input}"
layout = "microdata"
geocode = ["TABBLKST", "TABBLKCOU", "TABTRACT", "TABBLK"]
ignore = ["VINTAGE", "TABBLKGRP", "RTYPE", "GQTYPE_PL", "CENRACE"]
[input.attributes.votingage]
column = "VOTING_AGE"
map = {{ "1" = "under18", "2" = "18plus" }}
[input.attributes.hispanic]
column = "CENHISP"
map = {{ "1" = "not_hispanic", "2" = "hispanic" }}
[estimation]
invariants = ["state"]
[budget]
rho = "1"
[budget.levels.nation]
share = "1/6"
queries = {{ "total" = "1/2", "detailed" = "1/2" }}
[budget.levels.state]
share = "1/6"
queries = {{ "total" = "1/2", "detailed" = "1/2" }}
[budget.levels.county]
share = "1/6"
queries = {{ "total" = "1/2", "detailed" = "1/2" }}
[budget.levels.tract]
share = "1/6"
queries = {{ "total" = "1/2", "detailed" = "1/2" }}
[budget.levels.block_group]
share = "1/6"
queries = {{ "total" = "1/2", "detailed" = "1/2" }}
[budget.levels.block]
share = "1/6"
queries = {{ "total" = "1/2", "detailed" = "1/2" }}
"""


def spine_line(path: Path, geocode: str = '"GEOID"', fmt: str = "csv") -> str:
    return f'spine = {{ path = "{path}", format = "{fmt}", geocode = {geocode} }}'


def write_config(folder: Path, input_csv: Path, spine: str) -> Path:
    path = folder / "topdown.toml"
    text = TOPDOWN.format(
        out=folder / "out", private=folder / "private", input=input_csv, spine=spine
    )
    path.write_text(text)
    return path


def ppmf_lines() -> list[str]:
    return PPMF.read_text().splitlines()


def block_of(line: str) -> str:
    parts = line.split(",")
    return parts[1] + parts[2] + parts[3] + parts[5]


def neighbour_lines() -> list[str]:
    """The PPMF with every person of REMOVED left out and one person added in ADDED."""
    header, *rows = ppmf_lines()
    return [header, *[r for r in rows if block_of(r) != REMOVED], ADDED_ROW]


@pytest.fixture(scope="module")
def test_spine(tmp_path_factory) -> Path:
    """The shipped PPMF spine plus ADDED, a block no PPMF record falls in."""
    path = tmp_path_factory.mktemp("spine") / "blocks.csv"
    path.write_text(PPMF_SPINE.read_text() + ADDED + "\n")
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ppmf")
    original, neighbour = folder / "original.csv", folder / "neighbour.csv"
    original.write_text(PPMF.read_text())
    neighbour.write_text("\n".join(neighbour_lines()) + "\n")
    return original, neighbour


def topdown(config: Path, secret: Path, out: Path) -> int:
    return main(
        [
            "topdown",
            "--config",
            str(config),
            "--output",
            str(out),
            "--secret-file",
            str(secret),
            "--reuse-secret",  # an experiment: one secret on neighbouring inputs, by design
            "--master",
            "local[2]",
        ]
    )


Measurements = dict[tuple[str, str, str], list[int]]


def measurements(rows: Iterable) -> Measurements:
    return {(r["level"], r["geocode"], r["query"]): list(r["noisy"]) for r in rows}


def nodes_of(m: Measurements) -> set[tuple[str, str]]:
    return {(level, geocode) for level, geocode, _ in m}


def changed_nodes(a: Measurements, b: Measurements, exempt: set[str]) -> set[tuple[str, str]]:
    """Nodes present in both whose noisy answers differ, other than those whose geocode is a
    prefix of a block in ``exempt`` (the changed blocks and their ancestors)."""
    return {
        (level, geocode)
        for (level, geocode, query), noisy in a.items()
        if (level, geocode, query) in b
        and b[(level, geocode, query)] != noisy
        and not any(block.startswith(geocode) for block in exempt)
    }


@pytest.fixture(scope="module")
def spine_secret(tmp_path_factory) -> Path:
    """This module's own secret: the session's ``fixed_secret`` is the county's, and a first
    release here would bind it to the PPMF, refusing the county's reference release after it."""
    path = tmp_path_factory.mktemp("spine_secret") / "secret.hex"
    path.write_text("5c" * 32 + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def spine_runs(spark, inputs, test_spine, spine_secret, tmp_path_factory) -> tuple[Path, Path]:
    """The same config and secret on the PPMF and on its neighbour, both on the test spine."""
    outs = []
    for name, input_csv in zip(("original", "neighbour"), inputs, strict=True):
        folder = tmp_path_factory.mktemp(name)
        config = write_config(folder, input_csv, spine_line(test_spine))
        assert topdown(config, spine_secret, folder / "out") == 0
        outs.append(folder / "out")
    return outs[0], outs[1]


def read_measurements(spark, out: Path) -> Measurements:
    return measurements(spark.read.format("delta").load(str(out / "noisy_measurements")).collect())


def test_on_a_spine_a_block_emptied_or_filled_changes_no_geocode_and_no_other_noise(
    spark, spine_runs
):
    a, b = (read_measurements(spark, out) for out in spine_runs)
    assert nodes_of(a) == nodes_of(b)
    levels = {level for level, _ in nodes_of(a)}
    assert (
        len(levels) == 6 and ("block", REMOVED) in nodes_of(a) and ("block", ADDED) in nodes_of(a)
    )
    assert sum(1 for level, _ in nodes_of(a) if level == "block") == 512
    assert not changed_nodes(a, b, {REMOVED, ADDED})
    # The changed nodes' noise is the same too: their noisy totals move by the true change.
    removed = sum(1 for r in ppmf_lines()[1:] if block_of(r) == REMOVED)
    for level, digits in (("block", 15), ("block_group", 12), ("tract", 11), ("county", 5)):
        for block, change in ((REMOVED, -removed), (ADDED, 1)):
            key = (level, block[:digits], "total")
            both = block[:digits] == ADDED[:digits] == REMOVED[:digits]
            expected = 1 - removed if both else change
            assert b[key][0] - a[key][0] == expected, key


def test_without_a_spine_the_same_change_moves_the_geography_and_other_nodes_noise(
    spark, inputs, test_spine, fixed_secret, tmp_path
):
    """Today's path (the blocks are those holding a record): the test above would fail."""
    from censusdp_spark.engine.hierarchy import node_histograms
    from censusdp_spark.privacy.streams import load_or_create_secret
    from censusdp_spark.topdown.measure import measure

    config = load_topdown_config(write_config(tmp_path, inputs[0], spine_line(test_spine)), ROOT)
    assert config.input is not None
    secret = load_or_create_secret(fixed_secret, None, tmp_path)
    runs = []
    for input_csv in inputs:
        spec = replace(config.input, path=input_csv)
        nodes = node_histograms(read_blocks(spark, spec, config.schema, 15, None), config.hierarchy)
        runs.append(measurements(measure(nodes, config, secret).collect()))
    a, b = runs
    assert nodes_of(a) != nodes_of(b)
    assert ("block", REMOVED) in nodes_of(a) - nodes_of(b)
    assert ("block", ADDED) in nodes_of(b) - nodes_of(a)
    assert changed_nodes(a, b, {REMOVED, ADDED})


def test_a_record_off_the_spine_is_refused_and_nothing_is_written(
    spark, inputs, fixed_secret, tmp_path, capsys
):
    config = write_config(tmp_path, inputs[1], spine_line(PPMF_SPINE))  # ADDED is not on it
    out = tmp_path / "release"
    assert topdown(config, fixed_secret, out) == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1, message
    row = neighbour_lines().index(ADDED_ROW)  # the header is line 0: data rows count from 1
    assert message.startswith(f"censusdp: error: {inputs[1]}: row {row}, column TABBLKST+"), message
    assert f"geocode {ADDED} is not on the spine {PPMF_SPINE}" in message
    assert not out.exists() and not (tmp_path / "release.private").exists()
    assert not (tmp_path / "out").exists() and not (tmp_path / "private").exists()


@pytest.mark.parametrize(
    ("rows", "where", "rule"),
    [
        (
            ["011056868001000", "011056868001003", "011056868001000"],
            "row 1, column GEOID",
            "duplicate geocode 011056868001000",
        ),
        (["011056868001000", "01105686800100"], "row 2, column GEOID", "exactly 15 digits"),
        (["011056868001000", "0110568680010003"], "row 2, column GEOID", "exactly 15 digits"),
        (["01105686800A000"], "row 1, column GEOID", "exactly 15 digits"),
        (["011056868001000", "0110568680 1000"], "row 2, column GEOID", "exactly 15 digits"),
        ([], "rows", "the spine is empty"),
    ],
    ids=["duplicate", "short", "long", "letter", "space", "empty"],
)
def test_a_bad_spine_row_is_named_with_the_spine_file(spark, tmp_path, rows, where, rule):
    path = tmp_path / "spine.csv"
    path.write_text("\n".join(["GEOID", *rows]) + "\n")
    with pytest.raises(InputError) as err:
        read_spine(spark, SpineSpec(path, "csv", ("GEOID",)), 15)
    message = str(err.value)
    assert message.startswith(f"{path}: {where}: ") and rule in message, message


def test_a_bad_spine_is_refused_through_the_cli_before_anything_is_written(
    spark, inputs, fixed_secret, tmp_path, capsys
):
    spine = tmp_path / "spine.csv"
    spine.write_text(PPMF_SPINE.read_text() + "011056868001000\n")  # the first block again
    config = write_config(tmp_path, inputs[0], spine_line(spine))
    assert topdown(config, fixed_secret, tmp_path / "release") == 2
    message = capsys.readouterr().err.strip()
    assert message == (
        f"censusdp: error: {spine}: row 1, column GEOID: duplicate geocode 011056868001000"
    )
    assert not (tmp_path / "release").exists()


def test_a_missing_spine_column_is_named(spark, tmp_path):
    with pytest.raises(
        InputError, match=r"ppmf_perry_county_al_blocks.csv: column BLOCKID: missing"
    ):
        read_spine(spark, SpineSpec(PPMF_SPINE, "csv", ("BLOCKID",)), 15)


def test_the_ri_2020_spine_is_the_block_assignment_files_block_list(spark):
    """The shipped spine equals BLOCKID of the Census file read as pipe-delimited text."""
    shipped = read_spine(
        spark, SpineSpec(ROOT / "data" / "spine" / "ri_2020_blocks.csv", "csv", ("BLOCKID",)), 15
    )
    census = read_spine(spark, SpineSpec(BLOCK_ASSIGN, "pipe", ("BLOCKID",)), 15)
    assert shipped.count() == 25649
    assert shipped.exceptAll(census).count() == 0 and census.exceptAll(shipped).count() == 0
    prefixes = shipped.selectExpr("substr(geocode, 1, 12) AS bg", "substr(geocode, 1, 11) AS tract")
    assert prefixes.select("bg").distinct().count() == 792
    assert prefixes.select("tract").distinct().count() == 250


def test_a_spine_geocode_can_be_composed_of_columns(spark):
    spec = SpineSpec(CALM, "csv", ("county", "tract", "block_group", "taz"))
    leaves = {r["geocode"] for r in read_spine(spark, spec, 16).collect()}
    assert len(leaves) == 930 and "0030001000030304" in leaves


@pytest.mark.parametrize(
    ("spine", "key", "rule"),
    [
        ("", "geography.spine", "required with input.layout = 'microdata'"),
        ('spine = { path = "x.csv" }', "geography.spine", "missing required key(s) ['geocode']"),
        (
            'spine = { path = "x.csv", geocode = "G", format = "tsv" }',
            "geography.spine.format",
            "must be one of",
        ),
        ('spine = { path = "x.csv", geocode = [] }', "geography.spine.geocode", "non-empty list"),
        (
            'spine = { path = "x.csv", geocode = "G", sep = "|" }',
            "geography.spine",
            "unknown key(s) ['sep']",
        ),
    ],
    ids=["absent", "no-geocode", "format", "empty-geocode", "unknown-key"],
)
def test_spine_config_rules(tmp_path, spine, key, rule):
    with pytest.raises(ConfigError) as err:
        load_topdown_config(write_config(tmp_path, PPMF, spine), ROOT)
    assert err.value.key == key and rule in err.value.rule, str(err.value)
    assert "\n" not in str(err.value)


def test_microdata_without_a_spine_is_refused_by_the_cli_in_one_line(tmp_path, capsys):
    config = write_config(tmp_path, PPMF, "")
    assert main(["validate", "--config", str(config)]) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith(f"censusdp: error: {config}: [geography.spine] required")
    assert "add [geography] spine" in message and len(message.splitlines()) == 1


# --- the group-size release on the same spine -------------------------------------------------

PGSR = """
[run]
name = "spine_pgsr"
output = "{out}"
private_dir = "{private}"
[geography]
levels = [
  {{ name = "region", digits = 0 }}, {{ name = "county", digits = 3 }},
  {{ name = "tract", digits = 9 }}, {{ name = "block_group", digits = 12 }},
  {{ name = "taz", digits = 16 }},
]
{spine}
[groups]
max_size = 4
topcode = true
[input]
path = "{input}"
layout = "households"
geocode = "taz"
household = "hh"
size = "size"
[budget]
epsilon = "1"
"""
CALM_SPINE = f'spine = {{ path = "{CALM}", geocode = ["county", "tract", "block_group", "taz"] }}'
EMPTIED = "003000100003"  # a CALM block group whose households the neighbour leaves out


def calm_households(skip_prefix: str | None) -> str:
    """One row per household from the real CALM TAZ size counts (size 4 = "4 or more")."""
    lines = ["taz,hh,size"]
    with CALM.open() as f:
        for row in csv.DictReader(f):
            taz = row["county"] + row["tract"] + row["block_group"] + row["taz"]
            if skip_prefix and taz.startswith(skip_prefix):
                continue
            for size in range(1, 5):
                lines += [
                    f"{taz},{taz}-{size}-{i},{size}" for i in range(int(row[f"HHSIZE{size}"]))
                ]
    return "\n".join(lines) + "\n"


def pgsr_config(folder: Path, households: str, spine: str = CALM_SPINE) -> Path:
    input_csv = folder / "households.csv"
    input_csv.write_text(households)
    path = folder / "pgsr.toml"
    path.write_text(
        PGSR.format(out=folder / "out", private=folder / "private", input=input_csv, spine=spine)
    )
    return path


def test_pgsr_leaves_are_the_spine_empty_ones_with_zero_counts(spark, tmp_path):
    config = load_group_sizes_config(pgsr_config(tmp_path, calm_households(EMPTIED)), ROOT)
    assert config.input is not None
    leaves = {
        r["geocode"]: list(r["counts"])
        for r in read_leaf_histograms(
            spark, config.input, config.groups, 16, config.spine
        ).collect()
    }
    assert len(leaves) == 930
    emptied = [g for g in leaves if g.startswith(EMPTIED)]
    assert emptied and all(leaves[g] == [] for g in emptied)
    assert sum(sum(c) for c in leaves.values()) == 62041 - sum(
        1 for ln in calm_households(None).splitlines()[1:] if ln.startswith(EMPTIED)
    )


def test_pgsr_households_off_the_spine_are_refused(spark, tmp_path):
    households = calm_households(None) + "9990001000030304,stray,2\n"
    config = load_group_sizes_config(pgsr_config(tmp_path, households), ROOT)
    assert config.input is not None
    row = len(households.splitlines()) - 1
    with pytest.raises(InputError) as err:
        read_leaf_histograms(spark, config.input, config.groups, 16, config.spine)
    assert str(err.value).startswith(f"{config.input.path}: row {row}, column taz: ")
    assert "geocode 9990001000030304 is not on the spine" in str(err.value)


def test_pgsr_households_without_a_spine_are_refused(tmp_path):
    with pytest.raises(
        ConfigError, match=r"\[geography.spine\] required with input.layout = 'households'"
    ):
        load_group_sizes_config(pgsr_config(tmp_path, "taz,hh,size\n", spine=""), ROOT)


def test_pgsr_on_a_spine_releases_the_same_geocodes_without_one_regions_households(
    spark, fixed_secret, tmp_path
):
    released = []
    for name, households in (
        ("full", calm_households(None)),
        ("emptied", calm_households(EMPTIED)),
    ):
        folder = tmp_path / name
        folder.mkdir()
        config = pgsr_config(folder, households)
        args = [
            "pgsr",
            "--config",
            str(config),
            "--secret-file",
            str(fixed_secret),
            "--reuse-secret",  # an experiment: one secret on neighbouring inputs, by design
            "--output",
            str(folder / "out"),
        ]
        assert main(args) == 0
        sizes = spark.read.format("delta").load(str(folder / "out" / "group_sizes")).collect()
        noisy = spark.read.format("delta").load(str(folder / "out" / "noisy_measurements"))
        released.append(({(r["level"], r["geocode"], r["size"]) for r in sizes}, noisy.collect()))
    (sizes_a, noisy_a), (sizes_b, noisy_b) = released
    assert sizes_a == sizes_b
    nodes = {(level, geocode) for level, geocode, _ in sizes_a}
    assert sum(1 for level, _ in nodes if level == "taz") == 930
    assert {size for _, _, size in sizes_a} == {1, 2, 3, 4}
    a = {(r["level"], r["geocode"], r["measurement"]): list(r["noisy"]) for r in noisy_a}
    b = {(r["level"], r["geocode"], r["measurement"]): list(r["noisy"]) for r in noisy_b}
    assert a.keys() == b.keys() and {(level, geocode) for level, geocode, _ in a} == nodes
    moved = {key[1] for key in a if a[key] != b[key]}
    assert moved and all(EMPTIED.startswith(g) or g.startswith(EMPTIED) for g in moved)


def test_a_block_count_input_on_a_spine_gains_its_empty_blocks_and_loses_none(spark, tmp_path):
    demo = load_topdown_config(ROOT / "conf" / "ri_2010_demo.toml", ROOT)
    assert demo.input is not None
    header, *rows = (ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()[:4]
    blocks_csv = tmp_path / "blocks.csv"
    blocks_csv.write_text("\n".join([header, *rows]) + "\n")
    codes = [r.split(",")[0] for r in rows]
    spine = tmp_path / "spine.csv"
    spine.write_text("\n".join(["GEOID", *codes, "440010301009999"]) + "\n")
    spec = replace(demo.input, path=blocks_csv)
    read = read_blocks(spark, spec, demo.schema, 15, SpineSpec(spine, "csv", ("GEOID",)))
    leaves = {r["geocode"]: list(r["counts"]) for r in read.collect()}
    assert set(leaves) == {*codes, "440010301009999"} and leaves["440010301009999"] == []
    short = tmp_path / "short.csv"
    short.write_text("\n".join(["GEOID", *codes[:2]]) + "\n")
    with pytest.raises(InputError) as err:
        read_blocks(spark, spec, demo.schema, 15, SpineSpec(short, "csv", ("GEOID",)))
    assert str(err.value).startswith(f"{blocks_csv}: row 3, column GEOID: geocode {codes[2]}")
