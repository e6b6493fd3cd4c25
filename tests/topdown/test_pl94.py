"""The P.L. 94-171 legacy reader on the shipped 2018 End-to-End files and on edited copies:
every refusal is one ``InputError`` naming the file, the line, the column and the rule."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from censusdp_spark.io.pl94_layout import (
    CELLS,
    LegacyFiles,
)
from censusdp_spark.model.config import SpineSpec
from censusdp_spark.model.errors import InputError
from censusdp_spark.topdown.pl94 import read_legacy
from tests.helpers.pl94 import (
    SAMPLE,
    Edit,
    copy_of_sample,
    edit_line,
    field,
    lines,
    plus,
    to,
)

CHECKED = ("140", "150")  # the sample's state and county records are the whole county's


def test_the_shipped_files_give_their_569_blocks_with_every_cell(spark):
    read = read_legacy(spark, SAMPLE, CHECKED).toPandas()
    blocks = pd.DataFrame(read["values"].tolist(), columns=list(CELLS), index=read["geocode"])
    geo = [ln.split("|") for ln in lines(SAMPLE.geoheader)]
    listed = {f[field(0, "GEOCODE")] for f in geo if f[field(0, "SUMLEV")] == "750"}
    assert set(blocks.index) == listed and len(blocks) == 569
    assert blocks["P0010001"].sum() == 29_225 and (blocks["P0010001"] == 0).sum() == 215
    assert blocks["H0010001"].sum() == blocks["H0010002"].sum() + blocks["H0010003"].sum()
    # A block's cells are its segments' fields on the geoheader's line.
    at = next(i for i, f in enumerate(geo) if f[field(0, "GEOCODE")] == "440070001011000")
    seg2 = lines(SAMPLE.segment(2))[at].split("|")
    assert blocks.loc["440070001011000", "P0040005"] == int(seg2[field(2, "P0040005")])


def test_the_state_record_carries_the_county_total_not_the_sum_of_the_blocks(spark):
    """The state record (line 1) says 614,053 people, the whole county's; the sample's 569
    blocks hold 29,225. Checking every summary level (the default) refuses the sample there;
    its tracts and block groups are the sums of their blocks."""
    state = lines(SAMPLE.segment(1))[0].split("|")
    assert int(state[field(1, "P0010001")]) == 614_053
    with pytest.raises(InputError) as refused:
        read_legacy(spark, SAMPLE)
    assert str(refused.value) == (
        f"{SAMPLE.segment(1)}: line 1, column P0010001: this state record (SUMLEV 040) is not"
        " the sum of its blocks in the file (input.summary_levels checks ['040', '050', '140',"
        " '150']; a level whose blocks are not all in the file cannot be checked)"
    )


def drop_last_line(n: int) -> Edit:
    def edit(files: LegacyFiles, folder: Path) -> None:
        path = files.file(n)
        path.write_text("\n".join(lines(path)[:-1]) + "\n")

    return edit


def swap_lines(n: int, a: int, b: int) -> Edit:
    def edit(files: LegacyFiles, folder: Path) -> None:
        path = files.file(n)
        text = lines(path)
        text[a - 1], text[b - 1] = text[b - 1], text[a - 1]
        path.write_text("\n".join(text) + "\n")

    return edit


def extra_field(n: int, line: int) -> Edit:
    def edit(files: LegacyFiles, folder: Path) -> None:
        path = files.file(n)
        text = lines(path)
        text[line - 1] += "|0"
        path.write_text("\n".join(text) + "\n")

    return edit


def swap_housing_units(files: LegacyFiles, folder: Path) -> None:
    """H1 of the first block of tract 000101 and of the first of tract 000102 swapped: every
    record stays consistent in itself, but the tracts' sums change."""
    geo = [ln.split("|") for ln in lines(files.geoheader)]
    path = files.segment(2)
    text = [ln.split("|") for ln in lines(path)]
    h1 = [field(2, f"H00100{i:02d}") for i in (1, 2, 3)]

    def blocks_of(tract: str) -> list[int]:
        return [i for i, f in enumerate(geo)
                if f[field(0, "SUMLEV")] == "750" and f[field(0, "TRACT")] == tract]  # fmt: skip

    a = next(i for i in blocks_of("000101") if text[i][h1[0]] != "0")
    b = next(i for i in blocks_of("000102") if text[i][h1[0]] != text[a][h1[0]])
    for i in h1:
        text[a][i], text[b][i] = text[b][i], text[a][i]
    path.write_text("\n".join("|".join(f) for f in text) + "\n")


NO_HISPANIC_WHITE_ADULT = 155
"""A block line of the sample with no Hispanic White adult (P0030003 = P0040005), some
Hispanic adult (P0040002 > 0) and some not-Hispanic White child (P0020005 > P0040005)."""


def hispanic_adults_below_zero(files: LegacyFiles, folder: Path) -> None:
    """One adult moved from Hispanic to not-Hispanic White in P4 only (P4 stays consistent in
    itself): its not-Hispanic White adults then exceed all of P3's White adults."""
    path = files.segment(2)
    text = lines(path)
    fields = text[NO_HISPANIC_WHITE_ADULT - 1].split("|")
    value = {name: int(fields[field(2, name)]) for name in ("P0030003", "P0040005", "P0040002")}
    assert value["P0030003"] == value["P0040005"] and value["P0040002"] > 0
    for name, step in (("P0040005", 1), ("P0040004", 1), ("P0040003", 1), ("P0040002", -1)):
        fields[field(2, name)] = str(int(fields[field(2, name)]) + step)
    text[NO_HISPANIC_WHITE_ADULT - 1] = "|".join(fields)
    path.write_text("\n".join(text) + "\n")


def duplicate_block(files: LegacyFiles, folder: Path) -> None:
    """Line 41's block renamed as line 40's (GEOCODE and BLOCK)."""
    path = files.geoheader
    text = [ln.split("|") for ln in lines(path)]
    for name in ("GEOCODE", "BLOCK", "GEOID"):
        text[40][field(0, name)] = text[39][field(0, name)]
    path.write_text("\n".join("|".join(f) for f in text) + "\n")


BLOCK_LINE = 38  # the first block record of the sample
CASES: dict[str, tuple[Edit, int, str]] = {
    "segment-shorter-than-the-geoheader": (
        drop_last_line(3),
        3,
        "lines: 605 records; the geoheader",
    ),
    "record-in-a-segment-not-in-the-geoheader": (
        edit_line(2, 10, {"LOGRECNO": to("100")}),
        2,
        "line 10, column LOGRECNO: logical record 100 is not in the geoheader",
    ),
    "logrecno-out-of-order": (
        swap_lines(1, 11, 12),
        1,
        "line 12, column LOGRECNO: out of order: the logical record number is not above the"
        " previous line's",
    ),
    "p2-total-disagrees-with-p1": (
        edit_line(1, 3, dict.fromkeys(("P0020001", "P0020003", "P0020004", "P0020005"), plus(1))),
        1,
        "line 3, column P0020001: the total of P2 must equal that of P1 (P0010001)",
    ),
    "line-with-an-extra-field": (
        extra_field(0, 5),
        0,
        "line 5: has 98 fields; the geographic header of the legacy layout has 97",
    ),
    "segment-number-wrong": (
        edit_line(3, 1, {"CIFSN": to("02")}),
        3,
        "line 1, column CIFSN: must be '03' in segment 3 (are the segment files swapped?)",
    ),
    "count-not-an-integer": (
        edit_line(2, 50, {"P0030007": to("1.5")}),
        2,
        "line 50, column P0030007: count must be a non-negative integer",
    ),
    "derived-count-negative": (
        hispanic_adults_below_zero,
        2,
        f"line {NO_HISPANIC_WHITE_ADULT}, column P0040005: the persons count '18 and over,"
        " Hispanic, White' = P0030003 - P0040005 is negative",
    ),
    "tract-not-the-sum-of-its-blocks": (
        swap_housing_units,
        2,
        "line 3, column H0010001: this tract record (SUMLEV 140) is not the sum of its blocks",
    ),
    "block-listed-twice": (
        duplicate_block,
        0,
        "line 41, column GEOCODE: block 440070001011002 is listed twice (also on line 40)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_file_set_is_refused_naming_file_line_column_and_rule(spark, tmp_path, case):
    edit, n, where_and_rule = CASES[case]
    files = copy_of_sample(tmp_path)
    edit(files, tmp_path)
    with pytest.raises(InputError) as refused:
        read_legacy(spark, files, CHECKED)
    message = str(refused.value)
    assert message.startswith(f"{files.file(n)}: "), message
    assert where_and_rule in message, message
    assert "\n" not in message


def test_a_block_off_the_spine_is_refused_at_its_geoheader_line(spark, tmp_path):
    geo = [ln.split("|") for ln in lines(SAMPLE.geoheader)]
    blocks = [f[field(0, "GEOCODE")] for f in geo if f[field(0, "SUMLEV")] == "750"]
    spine = tmp_path / "spine.csv"
    spine.write_text("\n".join(["GEOID", *blocks[:5], *blocks[6:]]) + "\n")
    with pytest.raises(InputError) as refused:
        read_legacy(spark, SAMPLE, CHECKED, SpineSpec(spine, "csv", ("GEOID",)))
    assert str(refused.value) == (
        f"{SAMPLE.geoheader}: line {BLOCK_LINE + 5}, column GEOCODE: block {blocks[5]} is not on"
        f" the spine {spine} (every block of the geoheader must be on it)"
    )
    # A spine block without a record is a node with zero counts.
    spine.write_text("\n".join(["GEOID", *blocks, "440070001019999"]) + "\n")
    read = read_legacy(spark, SAMPLE, CHECKED, SpineSpec(spine, "csv", ("GEOID",))).toPandas()
    assert len(read) == 570
    assert sum(read.set_index("geocode").loc["440070001019999", "values"]) == 0
