"""The P.L. 94-171 legacy layout and its record rules, on the shipped 2018 End-to-End files
(no Spark: the rules are numpy over pandas batches, as Spark runs them)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from censusdp_spark.io.pl94_layout import (
    CELLS,
    COUNTS,
    GEOHEADER_FIELDS,
    RACE_COMBINATIONS,
    RACE_LAYOUT,
    RECORD_KEY,
    SEGMENTS,
    TABLES,
    TEXT_FIELDS,
    first_broken_record,
    record_rules,
)
from tests.helpers.pl94 import SAMPLE

MAX = 10**9
RULES = record_rules(MAX)


def read(path: Path, names: tuple[str, ...]) -> pd.DataFrame:
    return pd.read_csv(
        path, sep="|", header=None, names=list(names), dtype=str, keep_default_na=False
    )


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    """The sample's 606 records, the four files side by side, as the reader sees them."""
    geo = read(SAMPLE.geoheader, GEOHEADER_FIELDS)
    segments = [read(SAMPLE.segment(n), (*RECORD_KEY, *SEGMENTS[n - 1])) for n in (1, 2, 3)]
    for seg in segments:
        assert (seg["LOGRECNO"] == geo["LOGRECNO"]).all()
    frame = pd.concat(
        [geo[list(TEXT_FIELDS) + ["POP100"]], *[s[list(s.columns[5:])] for s in segments]], axis=1
    )
    frame.insert(0, "line", range(1, len(frame) + 1))
    return frame


def test_the_field_counts_are_those_of_every_line_of_the_sample():
    for path, fields in [
        (SAMPLE.geoheader, 97),
        *[(SAMPLE.segment(n), f) for n, f in ((1, 149), (2, 152), (3, 15))],
    ]:
        counts = {line.count("|") + 1 for line in path.read_text().splitlines()}
        assert counts == {fields}, path
    assert len(GEOHEADER_FIELDS) == 97 and GEOHEADER_FIELDS[2] == "SUMLEV"
    assert GEOHEADER_FIELDS[7] == "LOGRECNO" and GEOHEADER_FIELDS[9] == "GEOCODE"
    assert [len(s) for s in SEGMENTS] == [71 + 73, 71 + 73 + 3, 10]
    assert len(CELLS) == 301


def test_the_race_cells_follow_cenrace_order():
    assert RACE_LAYOUT.races[:6] == (3, 4, 5, 6, 7, 8)  # one race
    assert RACE_LAYOUT.two_or_more == 9
    assert RACE_LAYOUT.groups[1] == (10, tuple(range(11, 26)))  # two races: P0010011-25
    assert RACE_LAYOUT.groups[5] == (70, (71,))
    assert RACE_COMBINATIONS[6] == ("White", "Black or African American")  # CENRACE 07
    assert len(RACE_COMBINATIONS[62]) == 6  # CENRACE 63: all six


def test_the_derived_tables_have_every_combination_of_codes_once():
    for table in TABLES.values():
        combos = {tuple(c.codes[v] for v in table.variables) for c in table.cells}
        size = 1
        for codes in table.variables.values():
            size *= len(codes)
        assert len(combos) == len(table.cells) == size
    assert len(TABLES["persons"].cells) == 252
    white_adults_hispanic = next(
        c
        for c in TABLES["persons"].cells
        if c.codes == {"VOTING_AGE": "2", "CENHISP": "2", "CENRACE": "01"}
    )
    assert (white_adults_hispanic.plus, white_adults_hispanic.minus) == (
        ("P0030003",),
        ("P0040005",),
    )


def test_every_record_of_the_sample_keeps_every_rule(records):
    assert check(records) is None


def test_the_derived_persons_sum_to_the_tables(records):
    """Over the blocks: the 252 cells sum to P1's total, the 18+ cells to P3's, the Hispanic
    cells to P2's Hispanic count."""
    blocks = records[records["SUMLEV"] == "750"]
    value = {c: blocks[c].astype(int) for c in CELLS}
    total = adults = hispanic = 0
    for cell in TABLES["persons"].cells:
        n = sum(value[c].sum() for c in cell.plus) - sum(value[c].sum() for c in cell.minus)
        total += n
        adults += n if cell.codes["VOTING_AGE"] == "2" else 0
        hispanic += n if cell.codes["CENHISP"] == "2" else 0
    assert total == value["P0010001"].sum() == 29_225
    assert adults == value["P0030001"].sum()
    assert hispanic == value["P0020002"].sum()


def check(records: pd.DataFrame) -> tuple[int, int] | None:
    return first_broken_record(records, records[list(COUNTS)].to_numpy(dtype=object), RULES, MAX)


def broken(records: pd.DataFrame, line: int, column: str, value: str) -> tuple[int, str, str]:
    edited = records.copy()
    edited.loc[edited["line"] == line, column] = value
    found = check(edited)
    assert found is not None
    rule = RULES[found[1]]
    return found[0], rule.column, rule.rule


@pytest.mark.parametrize(
    ("line", "column", "value", "named", "rule"),
    [
        (40, "P0010003", "1.5", "P0010003", "count must be a non-negative integer"),
        (40, "P0010003", "-1", "P0010003", "count must be a non-negative integer"),
        (40, "P0050004", "1000000001", "P0050004", "at most MAX_COUNT"),
        (40, "P0050004", "99999999999999999999", "P0050004", "at most MAX_COUNT"),
        (40, "POP100", "", "POP100", "count must be a non-negative integer"),
        (3, "P0010004", "713", "P0010002", "must equal P0010003 + P0010004"),
        (40, "GEOCODE", "44007000101100", "GEOCODE", "GEOCODE of a block record (SUMLEV 750)"),
        (40, "BLKGRP", "2", "BLKGRP", "BLKGRP must be the first digit of its BLOCK"),
        (3, "GEOCODE", "44007000102", "GEOCODE", "tract record (SUMLEV 140)"),
        (40, "POP100", "5", "POP100", "must equal the total population P0010001"),
        (3, "P0030001", "3971", "P0030001", "must equal P0030002 + P0030009"),
    ],
)
def test_a_broken_record_is_named_by_line_column_and_rule(
    records, line, column, value, named, rule
):
    found = broken(records, line, column, value)
    assert found[:2] == (line, named) and rule in found[2], found


def test_a_p2_total_that_disagrees_with_p1_is_named(records):
    """One more not-Hispanic White person in P2, P2's own sums kept: only P2 = P1 breaks."""
    edited = records.copy()
    row = edited["line"] == 3
    for column in ("P0020001", "P0020003", "P0020004", "P0020005"):
        edited.loc[row, column] = str(int(edited.loc[row, column].iloc[0]) + 1)
    found = check(edited)
    assert found is not None
    rule = RULES[found[1]]
    assert (found[0], rule.column) == (3, "P0020001")
    assert rule.rule == "the total of P2 must equal that of P1 (P0010001)"


def test_a_negative_derived_count_is_named(records):
    """One more White adult counted not Hispanic in P4 (one fewer Hispanic adult), every table's
    own sums kept: P4 then holds more not-Hispanic White adults than P3 has White adults, so
    the derived Hispanic White adults P3 - P4 would be -1."""
    n = {c: records[c].astype(int) for c in ("P0030003", "P0040005", "P0040002", "P0020005")}
    fits = (n["P0030003"] == n["P0040005"]) & (n["P0040002"] > 0) & (n["P0020005"] > n["P0040005"])
    line = int(records.loc[fits & (records["SUMLEV"] == "750"), "line"].iloc[0])
    edited = records.copy()
    row = edited["line"] == line
    for column, step in (("P0040005", 1), ("P0040004", 1), ("P0040003", 1), ("P0040002", -1)):
        edited.loc[row, column] = str(int(edited.loc[row, column].iloc[0]) + step)
    found = check(edited)
    assert found is not None
    rule = RULES[found[1]]
    assert (found[0], rule.column) == (line, "P0040005")
    assert rule.rule == (
        "the persons count '18 and over, Hispanic, White' = P0030003 - P0040005 is negative"
    )


def test_the_earliest_line_wins_then_the_first_rule(records):
    edited = records.copy()
    edited.loc[edited["line"] == 50, "P0010001"] = "x"
    edited.loc[edited["line"] == 30, "P0020001"] = "0"
    found = check(edited)
    assert found is not None and found[0] == 30
    assert set(COUNTS) >= {"POP100"}
