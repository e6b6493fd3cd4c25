"""Bad input gets a one-line error naming the file, row/column and rule (real Spark reads)."""

from pathlib import Path

import pytest

from censusdp_spark.model.errors import InputError
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.readers import read_blocks
from tests.helpers.blocks import GOOD, HEADER, adults, bad_row

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    return load_topdown_config(ROOT / "conf" / "ri_2010_demo.toml", ROOT)


def read(spark, demo, path: Path):
    from dataclasses import replace

    spec = replace(demo.input, path=path)
    return read_blocks(spark, spec, demo.schema, 15, None)


def csv(tmp_path: Path, rows: list[str], header: str = HEADER) -> Path:
    path = tmp_path / "blocks.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_good_rows_become_sparse_histograms(spark, demo, tmp_path):
    rows = {r["geocode"]: r for r in read(spark, demo, csv(tmp_path, GOOD)).collect()}
    assert set(rows) == {"440010301001000", "440010301001001", "440010301001002"}
    first = rows["440010301001000"]
    # cells: votingage (under18, 18plus) x hisprace; white = 1, hispanic = 0 -> cell = va*8 + race
    # cell = votingage * 8 + hisprace; white (1): 19 - 8 under 18 and 8 adults; hispanic (0): 4 adults
    assert dict(zip(first["cells"], first["counts"], strict=True)) == {1: 11, 9: 8, 8: 4}
    assert sum(first["counts"]) == 23
    assert rows["440010301001002"]["cells"] == []


@pytest.mark.parametrize(
    "rows, where, rule",
    [
        (bad_row(5, "1.5"), "row 2, column pop_white", "non-negative integer"),
        (bad_row(5, "-3"), "row 2, column pop_white", "non-negative integer"),
        (bad_row(5, "x"), "row 2, column pop_white", "non-negative integer"),
        (bad_row(14, "18"), "row 2, column pop_white - vap_white", "is negative"),
        (bad_row(0, "44001030100100"), "row 2, column GEOID", "exactly 15 digits"),
        (bad_row(0, "4400103010010A1"), "row 2, column GEOID", "exactly 15 digits"),
        ([GOOD[0], GOOD[1], GOOD[1]], "row 2, column GEOID", "duplicate geocode 440010301001001"),
        ([], "rows", "the input is empty"),
        ([GOOD[0], GOOD[1] + ",0", GOOD[2]], "row 2", "more fields than the header's 22"),
        (
            [GOOD[0], GOOD[1], GOOD[2].rsplit(",", 1)[0]],
            "row 3",
            "fewer fields than the header's 22",
        ),
        (bad_row(5, "1000000000017"), "row 2, column pop_white", "above MAX_COUNT = 1_000_000_000"),
        (bad_row(5, "99999999999999999999"), "row 2, column pop_white", "above MAX_COUNT"),
        ([adults(GOOD[0], 600_000_000), adults(GOOD[1], 600_000_000)], "rows", "above MAX_COUNT"),
    ],
    ids=[
        "not-an-integer",
        "negative",
        "text",
        "negative-cell",
        "short-geocode",
        "letter-in-geocode",
        "duplicate-geocode",
        "empty",
        "more-fields-than-the-header",
        "fewer-fields-than-the-header",
        "count-above-max-count",
        "count-past-int64",
        "total-above-max-count",
    ],
)
def test_bad_rows_are_named(spark, demo, tmp_path, rows, where, rule):
    path = csv(tmp_path, rows)
    with pytest.raises(InputError) as err:
        read(spark, demo, path)
    message = str(err.value)
    assert message.startswith(str(path)) and where in message and rule in message


def test_a_row_whose_cells_do_not_sum_to_the_declared_total_is_refused(spark, demo, tmp_path):
    """With ``[input] total = "pop"``, the mapped cells must add up to it per row."""
    with pytest.raises(
        InputError,
        match=r"blocks\.csv: row 2, column pop: the cells of input\.cells do not sum to this column",
    ):
        read(spark, demo, csv(tmp_path, bad_row(4, "18")))


def test_missing_column_is_named(spark, demo, tmp_path):
    path = csv(tmp_path, [r.rsplit(",", 1)[0] for r in GOOD], HEADER.rsplit(",", 1)[0])
    with pytest.raises(InputError, match="column vap_two: missing"):
        read(spark, demo, path)


def test_extra_column_is_named(spark, demo, tmp_path):
    path = csv(tmp_path, [r + ",1" for r in GOOD], HEADER + ",surprise")
    with pytest.raises(InputError, match="column surprise: not used by the config"):
        read(spark, demo, path)


def test_every_missing_and_unused_column_is_named_in_one_refusal(spark, demo, tmp_path):
    names = HEADER.split(",")
    keep = [i for i, name in enumerate(names) if name not in ("vap_nhpi", "vap_two")]
    header = ",".join([names[i] for i in keep] + ["surprise", "notes"])
    rows = [",".join([r.split(",")[i] for i in keep] + ["1", "x"]) for r in GOOD]
    with pytest.raises(InputError) as refused:
        read(spark, demo, csv(tmp_path, rows, header))
    message = str(refused.value)
    assert message.count("\n") == 0
    assert (
        "columns vap_nhpi, vap_two: missing (named in the config's [input]);"
        " columns surprise, notes: not used by the config; list them in input.ignore if intended"
    ) in message


def test_a_bad_geocode_is_shown_as_read(spark, demo, tmp_path):
    with pytest.raises(InputError) as refused:
        read(spark, demo, csv(tmp_path, bad_row(0, "44001030100100")))
    assert str(refused.value).endswith(
        "row 2, column GEOID: geocode must be exactly 15 digits; got '44001030100100'"
        " (14 characters)"
    )


def test_missing_file_is_named(spark, demo, tmp_path):
    with pytest.raises(InputError, match=r"nope.csv: file: not found"):
        read(spark, demo, tmp_path / "nope.csv")


def test_corrupt_parquet_is_named(spark, demo, tmp_path):
    from dataclasses import replace

    path = tmp_path / "blocks.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    spec = replace(demo.input, path=path, format="parquet")
    with pytest.raises(InputError, match=r"blocks.parquet: file: unreadable as parquet"):
        read_blocks(spark, spec, demo.schema, 15, None).collect()


def test_microdata_value_outside_the_schema_is_named(spark, tmp_path):
    config = load_topdown_config(ROOT / "conf" / "pl94_2020_production.toml", ROOT)
    lines = (
        (ROOT / "data" / "ppmf_perry_county_al_20210428_eps12-2.csv").read_text().splitlines()[:6]
    )
    parts = lines[3].split(",")
    parts[-1] = "64"  # CENRACE has 63 categories
    lines[3] = ",".join(parts)
    path = tmp_path / "ppmf.csv"
    path.write_text("\n".join(lines) + "\n")
    from dataclasses import replace

    assert config.input is not None
    with pytest.raises(
        InputError, match=r"ppmf.csv: row 3, column CENRACE: value outside the schema of cenrace"
    ):
        read_blocks(spark, replace(config.input, path=path), config.schema, 15, config.spine)


def test_microdata_is_aggregated_to_block_histograms(spark):
    config = load_topdown_config(ROOT / "conf" / "pl94_2020_production.toml", ROOT)
    assert config.input is not None
    blocks = read_blocks(spark, config.input, config.schema, 15, config.spine)
    total = (
        blocks.selectExpr("aggregate(counts, 0L, (a, b) -> a + b) AS t")
        .groupBy()
        .sum("t")
        .first()[0]
    )
    assert total == 10588 and blocks.count() == 511


def test_an_unquoted_comma_in_an_ignored_column_is_refused_not_shifted(spark, demo, tmp_path):
    # vtd "07,B" unquoted: every later value moves one column on, and block ...001's 17 people
    # (pop 17 = pop_white 17) would be read as pop_white 17 + pop_black 17 = 34.
    parts = GOOD[1].split(",")
    shifted = ",".join([*parts[:3], "07,B", *parts[4:]])
    path = csv(tmp_path, [GOOD[0], shifted, GOOD[2]])
    with pytest.raises(
        InputError, match=r"blocks.csv: row 2: has more fields than the header's 22"
    ):
        read(spark, demo, path)
    quoted = ",".join([*parts[:3], '"07,B"', *parts[4:]])
    rows = read(spark, demo, csv(tmp_path, [GOOD[0], quoted, GOOD[2]])).collect()
    assert {r["geocode"]: sum(r["counts"]) for r in rows}["440010301001001"] == 17


def test_legacy_files_become_the_252_cell_histograms_of_their_blocks(spark):
    """conf/pl94_e2e_providence.toml: every block of the geoheader, its cells summing to its
    P1 total; a block's cell is its derived count (18+ Hispanic White = P3 - P4)."""
    from censusdp_spark.io.pl94_layout import RECORD_KEY, SEGMENTS

    config = load_topdown_config(ROOT / "conf" / "pl94_e2e_providence.toml", ROOT)
    assert config.input is not None
    blocks = read_blocks(spark, config.input, config.schema, 15, None).collect()
    assert len(blocks) == 569
    histograms = {r["geocode"]: dict(zip(r["cells"], r["counts"], strict=True)) for r in blocks}
    assert sum(sum(h.values()) for h in histograms.values()) == 29_225
    files = config.input.legacy_files()
    geo = [ln.split("|") for ln in files.geoheader.read_text().splitlines()]
    segments = [files.segment(n).read_text().splitlines() for n in (1, 2)]
    names = [(*RECORD_KEY, *SEGMENTS[n]) for n in (0, 1)]
    for line, fields in enumerate(geo):
        if fields[2] != "750":
            continue
        value = {
            name: int(v)
            for n in (0, 1)
            for name, v in zip(names[n], segments[n][line].split("|"), strict=True)
            if name.startswith(("P", "H"))
        }
        histogram = histograms[fields[9]]
        assert sum(histogram.values()) == value["P0010001"]
        # cell (18plus, hispanic, White alone) = 1 * 126 + 1 * 63 + 0
        assert histogram.get(189, 0) == value["P0030003"] - value["P0040005"]
        assert histogram.get(0, 0) == value["P0020005"] - value["P0040005"]
