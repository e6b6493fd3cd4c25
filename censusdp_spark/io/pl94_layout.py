"""The P.L. 94-171 legacy layout (2020 and 2010 redistricting files) and its record rules.

Pure Python and numpy, no Spark: the fields of the four files, the tables' structure, the
histograms derived exactly from the tables (:data:`TABLES`), and the rules every record of a
correct file keeps (:func:`record_rules`, the record keys, the same records in all four files),
evaluated batch by batch by :func:`first_failures` (``topdown.pl94`` reads the files and runs it
inside Spark).

Sources: the field names are those of the Census Bureau's import scripts for the 2020 files
(``2020PL_R_import_scripts.zip``, ``pl_all_4_2020_dar.r``; the same order as the "2020 Census
State Redistricting Data (Public Law 94-171) Summary File" technical documentation), and the
field counts (97, 149, 152, 15) hold on every line of the shipped 2018 End-to-End sample.
The 63 race cells of P1-P4 follow the order of CENRACE 01-63 (one race, then each combination
of two, ..., six races, in the order White, Black, AIAN, Asian, NHPI, Some Other Race): the DAS
schema's ``cenrace`` levels and the PPMF's ``CENRACE`` codes have the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import combinations
from math import comb
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

GEOHEADER_FIELDS = (
    "FILEID", "STUSAB", "SUMLEV", "GEOVAR", "GEOCOMP", "CHARITER", "CIFSN", "LOGRECNO", "GEOID",
    "GEOCODE", "REGION", "DIVISION", "STATE", "STATENS", "COUNTY", "COUNTYCC", "COUNTYNS",
    "COUSUB", "COUSUBCC", "COUSUBNS", "SUBMCD", "SUBMCDCC", "SUBMCDNS", "ESTATE", "ESTATECC",
    "ESTATENS", "CONCIT", "CONCITCC", "CONCITNS", "PLACE", "PLACECC", "PLACENS", "TRACT",
    "BLKGRP", "BLOCK", "AIANHH", "AIHHTLI", "AIANHHFP", "AIANHHCC", "AIANHHNS", "AITS",
    "AITSFP", "AITSCC", "AITSNS", "TTRACT", "TBLKGRP", "ANRC", "ANRCCC", "ANRCNS", "CBSA",
    "MEMI", "CSA", "METDIV", "NECTA", "NMEMI", "CNECTA", "NECTADIV", "CBSAPCI", "NECTAPCI",
    "UA", "UATYPE", "UR", "CD116", "CD118", "CD119", "CD120", "CD121", "SLDU18", "SLDU22",
    "SLDU24", "SLDU26", "SLDU28", "SLDL18", "SLDL22", "SLDL24", "SLDL26", "SLDL28", "VTD",
    "VTDI", "ZCTA", "SDELM", "SDSEC", "SDUNI", "PUMA", "AREALAND", "AREAWATR", "BASENAME",
    "NAME", "FUNCSTAT", "GCUNI", "POP100", "HU100", "INTPTLAT", "INTPTLON", "LSADC", "PARTFLAG",
    "UGA",
)  # fmt: skip
"""The 97 fields of the 2020 legacy geographic header, in order."""
assert len(GEOHEADER_FIELDS) == 97

RECORD_KEY = ("FILEID", "STUSAB", "CHARITER", "CIFSN", "LOGRECNO")
"""The first five fields of every segment."""

FILE_ID = "PLST"
"""``FILEID`` of every record of a P.L. 94-171 file (2010 and 2020)."""


def table_cells(table: str, n: int) -> tuple[str, ...]:
    """``P0010001`` ... : the cell names of a table (``P001``) of ``n`` cells."""
    return tuple(f"{table}{i:04d}" for i in range(1, n + 1))


SEGMENTS: tuple[tuple[str, ...], ...] = (
    table_cells("P001", 71) + table_cells("P002", 73),
    table_cells("P003", 71) + table_cells("P004", 73) + table_cells("H001", 3),
    table_cells("P005", 10),
)
"""The table cells of segments 1, 2 and 3, in order, after the record key."""
CELLS = tuple(c for segment in SEGMENTS for c in segment)

RACES = (
    "White", "Black or African American", "American Indian and Alaska Native", "Asian",
    "Native Hawaiian and Other Pacific Islander", "Some Other Race",
)  # fmt: skip
RACE_COMBINATIONS = tuple(combo for k in range(1, 7) for combo in combinations(RACES, k))
"""The 63 races of CENRACE 01-63, in its order (one race, then two, ..., in the order of
``RACES``); the race cells of P1-P4 come in this same order."""
assert len(RACE_COMBINATIONS) == 63


@dataclass(frozen=True)
class RaceLayout:
    """Where the cells of a race table (P1's numbering) are: the ``total``, the ``one_race``
    and ``two_or_more`` subtotals, each number of races' subtotal with its race cells, and the
    63 race cells in CENRACE order."""

    total: int
    one_race: int
    two_or_more: int
    groups: tuple[tuple[int, tuple[int, ...]], ...]  # (subtotal, its race cells), 1 to 6 races
    races: tuple[int, ...]


def _race_layout() -> RaceLayout:
    cell, groups = 2, []  # 1 is the total; 2 "Population of one race:"
    for k in range(1, 7):
        if k == 2:
            cell += 1  # "Population of two or more races:" (9), then "two races:" (10)
        subtotal = cell
        groups.append((subtotal, tuple(range(subtotal + 1, subtotal + 1 + comb(6, k)))))
        cell = subtotal + comb(6, k) + 1
    races = tuple(c for _, cells in groups for c in cells)
    return RaceLayout(1, groups[0][0], groups[0][0] + 7, tuple(groups), races)


RACE_LAYOUT = _race_layout()
assert RACE_LAYOUT.races[-1] == 71 and len(RACE_LAYOUT.races) == 63
HISPANIC_SHIFT = 2
"""P2 and P4 are P1 and P3 two cells on: their cells 2 and 3 are Hispanic and not Hispanic, and
cell ``c + 2`` is P1's cell ``c`` among the not Hispanic."""


def race_cell(table: str, cell: int) -> str:
    """The name of P1-numbered ``cell`` of race table ``table`` (``P001``-``P004``); in P2 and P4
    it is the not-Hispanic cell."""
    shift = HISPANIC_SHIFT if table in ("P002", "P004") else 0
    return f"{table}{cell + shift:04d}"


SUMMARY_LEVELS: Mapping[str, tuple[str, int]] = {
    "040": ("state", 2),
    "050": ("county", 5),
    "140": ("tract", 11),
    "150": ("block group", 12),
}
"""The summary levels of the block hierarchy: name and digits of their ``GEOCODE``. A record
of these levels (geographic component ``00``) must equal the sum of its blocks, cell by cell."""
BLOCK_LEVEL, BLOCK_DIGITS = "750", 15
WHOLE = "00"  # GEOCOMP of a whole geography (not a geographic component)


@dataclass(frozen=True)
class DerivedCell:
    """One cell of a derived histogram: the variables' codes and its value from the table cells,
    sum of ``plus`` minus sum of ``minus``; ``label`` says what it counts."""

    codes: Mapping[str, str]
    plus: tuple[str, ...]
    minus: tuple[str, ...]
    label: str

    @property
    def expr(self) -> str:
        return " - ".join([" + ".join(self.plus), *self.minus])


@dataclass(frozen=True)
class DerivedTable:
    """A histogram derived exactly from the legacy tables: its variables (name -> codes, in
    order) and its cells, every combination of codes once."""

    name: str
    variables: Mapping[str, tuple[str, ...]]
    cells: tuple[DerivedCell, ...]
    universe: str  # the table cell the cells sum to


def _persons() -> DerivedTable:
    """Voting age x Hispanic origin x CENRACE, 252 cells, from P1-P4 per race ``r``:
    18+ not Hispanic = P4(r); 18+ Hispanic = P3(r) - P4(r); all ages likewise from P1 and P2;
    under 18 = all ages - 18+."""
    cells = []
    for r, cell in enumerate(RACE_LAYOUT.races):
        p1, p2, p3, p4 = (race_cell(t, cell) for t in ("P001", "P002", "P003", "P004"))
        race, code = "; ".join(RACE_COMBINATIONS[r]), f"{r + 1:02d}"
        terms = {
            ("1", "1"): ((p2,), (p4,)),  # under 18, not Hispanic: P2 - P4
            ("1", "2"): ((p1, p4), (p2, p3)),  # under 18, Hispanic: (P1 - P2) - (P3 - P4)
            ("2", "1"): ((p4,), ()),  # 18 and over, not Hispanic: P4
            ("2", "2"): ((p3,), (p4,)),  # 18 and over, Hispanic: P3 - P4
        }
        for (va, h), (plus, minus) in terms.items():
            codes = {"VOTING_AGE": va, "CENHISP": h, "CENRACE": code}
            label = f"{AGES[va]}, {ORIGINS[h]}, {race}"
            cells.append(DerivedCell(codes, plus, minus, label))
    variables = {
        "VOTING_AGE": tuple(AGES),
        "CENHISP": tuple(ORIGINS),
        "CENRACE": tuple(f"{r:02d}" for r in range(1, 64)),
    }
    return DerivedTable("persons", variables, tuple(cells), "P0010001")


AGES = {"1": "under 18", "2": "18 and over"}
ORIGINS = {"1": "not Hispanic", "2": "Hispanic"}
"""The codes of ``VOTING_AGE`` and ``CENHISP``, as in the PPMF."""


GQ_TYPES = (
    ("1", "P0050003", "correctional facilities for adults"),
    ("2", "P0050004", "juvenile facilities"),
    ("3", "P0050005", "nursing facilities"),
    ("4", "P0050006", "other institutional facilities"),
    ("5", "P0050008", "college/university student housing"),
    ("6", "P0050009", "military quarters"),
    ("7", "P0050010", "other noninstitutional facilities"),
)
"""P5's seven major group-quarters types, with their ``GQTYPE_PL`` code of the PPMF."""


def _group_quarters() -> DerivedTable:
    """Persons by ``GQTYPE_PL``: 0 = in households (P1 total - P5 total), 1-7 the P5 types."""
    cells = [DerivedCell({"GQTYPE_PL": "0"}, ("P0010001",), ("P0050001",), "in households")]
    cells += [DerivedCell({"GQTYPE_PL": code}, (c,), (), label) for code, c, label in GQ_TYPES]
    variables = {"GQTYPE_PL": tuple(str(i) for i in range(8))}
    return DerivedTable("group_quarters", variables, tuple(cells), "P0010001")


def _units() -> DerivedTable:
    """Housing units by ``OCCUPANCY`` (H1)."""
    cells = (
        DerivedCell({"OCCUPANCY": "occupied"}, ("H0010002",), (), "occupied housing units"),
        DerivedCell({"OCCUPANCY": "vacant"}, ("H0010003",), (), "vacant housing units"),
    )
    return DerivedTable("units", {"OCCUPANCY": ("occupied", "vacant")}, cells, "H0010001")


TABLES: Mapping[str, DerivedTable] = {t.name: t for t in (_persons(), _group_quarters(), _units())}
"""The derived histograms a release can take from a legacy file, by name."""
assert len(TABLES["persons"].cells) == 252


@dataclass(frozen=True)
class LegacyFiles:
    """The four files of one state: ``{state}geo{vintage}.pl`` and ``{state}0000{n}{vintage}.pl``
    in ``folder`` (``state`` the lower-case USPS code, as in the Census's file names)."""

    folder: Path
    state: str
    vintage: str = "2020"

    @property
    def geoheader(self) -> Path:
        return self.folder / f"{self.state}geo{self.vintage}.pl"

    def segment(self, n: int) -> Path:
        return self.folder / f"{self.state}0000{n}{self.vintage}.pl"

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.geoheader, *(self.segment(n) for n in (1, 2, 3)))

    def file(self, index: int) -> Path:
        """File ``index``: 0 the geoheader, 1-3 the segments."""
        return self.paths[index]


FileIndex = Literal[0, 1, 2, 3]
"""Which file of the four holds a field: 0 the geoheader, 1-3 the segments."""


def file_of(column: str) -> FileIndex:
    """The file holding ``column``: the segment of a table cell, else the geoheader."""
    for n, cells in enumerate(SEGMENTS, 1):
        if column in cells:
            return n  # type: ignore[return-value]
    return 0


@dataclass(frozen=True, kw_only=True)
class RecordRule:
    """A rule every record keeps. ``kind``: ``count`` (``column`` is a non-negative integer at
    most the bound), ``equal`` (sum of ``plus`` = sum of ``minus``), ``at_least`` (sum of
    ``plus`` >= sum of ``minus``), ``geocode`` (a record of ``sumlev`` has the GEOCODE of
    ``plus``'s fields concatenated, ``digits`` long), ``block_group`` (a block's BLKGRP is the
    first digit of its BLOCK). An error names ``column``, in the file holding it, and ``rule``."""

    kind: Literal["count", "equal", "at_least", "geocode", "block_group"]
    column: str
    rule: str
    plus: tuple[str, ...] = ()
    minus: tuple[str, ...] = ()
    sumlev: str = ""
    digits: int = 0

    @property
    def file(self) -> FileIndex:
        return file_of(self.column)


GEOCODE_PARTS = {
    2: ("STATE",),
    5: ("STATE", "COUNTY"),
    11: ("STATE", "COUNTY", "TRACT"),
    12: ("STATE", "COUNTY", "TRACT", "BLKGRP"),
    15: ("STATE", "COUNTY", "TRACT", "BLOCK"),
}
"""The geoheader fields whose concatenation is the GEOCODE at each number of digits."""
TEXT_FIELDS = ("SUMLEV", "GEOCOMP", "GEOCODE", "STATE", "COUNTY", "TRACT", "BLKGRP", "BLOCK")
"""The geoheader fields the record rules read as text (with POP100 and the record keys, all the
reader reads of the geoheader: the others are names, codes of other geographies and areas).
``HU100`` is not compared with H1: in the 2018 End-to-End prototype it differs from
``H0010001`` on 22 of the 606 records (271,266 against 271,073 at the state)."""
COUNTS = (*CELLS, "POP100")
"""The fields the record rules read as counts."""


def _structure_rules() -> list[RecordRule]:
    """Each subtotal of P1-P5 and H1 is the sum of its cells; P2 and P4 split their totals into
    Hispanic and not Hispanic; P2's total is P1's and P4's is P3's; P3 <= P1; POP100 = P1."""
    rules: list[RecordRule] = []

    def equal(name: str, parts: Sequence[str], what: str) -> None:
        rule = f"must equal {' + '.join(parts)} ({what})"
        rules.append(
            RecordRule(kind="equal", column=name, rule=rule, plus=(name,), minus=tuple(parts))
        )

    lay = RACE_LAYOUT
    for table in ("P001", "P002", "P003", "P004"):
        shifted = table in ("P002", "P004")
        if shifted:
            equal(f"{table}0001", [f"{table}0002", f"{table}0003"], "Hispanic plus not Hispanic")
        of = "not Hispanic: " if shifted else ""

        def cell(c: int, t: str = table) -> str:
            return race_cell(t, c)

        equal(
            cell(lay.total),
            [cell(lay.one_race), cell(lay.two_or_more)],
            f"{of}one race plus two or more races",
        )
        equal(
            cell(lay.two_or_more),
            [cell(s) for s, _ in lay.groups[1:]],
            f"{of}two or more races: two, three, four, five and six races",
        )
        for k, (subtotal, races) in enumerate(lay.groups, 1):
            equal(
                cell(subtotal),
                [cell(c) for c in races],
                f"{of}{k} race{'s' if k > 1 else ''}: the sum of its races",
            )
    for table, every in (("P002", "P001"), ("P004", "P003")):
        rule = f"the total of P{int(table[1:])} must equal that of P{int(every[1:])} ({every}0001)"
        rules.append(
            RecordRule(
                kind="equal",
                column=f"{table}0001",
                rule=rule,
                plus=(f"{table}0001",),
                minus=(f"{every}0001",),
            )
        )
    rule = "the population 18 and over exceeds the total population P0010001"
    rules.append(
        RecordRule(
            kind="at_least", column="P0030001", rule=rule, plus=("P0010001",), minus=("P0030001",)
        )
    )
    equal("P0050001", ["P0050002", "P0050007"], "institutionalized plus noninstitutionalized")
    equal("P0050002", [f"P00500{i:02d}" for i in range(3, 7)], "the institutional types")
    equal("P0050007", [f"P00500{i:02d}" for i in range(8, 11)], "the noninstitutional types")
    equal("H0010001", ["H0010002", "H0010003"], "occupied plus vacant")
    rule = "must equal the total population P0010001 of segment 1"
    rules.append(
        RecordRule(kind="equal", column="POP100", rule=rule, plus=("POP100",), minus=("P0010001",))
    )
    return rules


def _derived_rules() -> list[RecordRule]:
    """Every cell of every derived histogram is non-negative, and each histogram sums to its
    universe (which the structure rules imply; checked all the same)."""
    rules = []
    for table in TABLES.values():
        for c in table.cells:
            rule = f"the {table.name} count '{c.label}' = {c.expr} is negative"
            rules.append(
                RecordRule(
                    kind="at_least",
                    column=(c.minus or c.plus)[-1],
                    rule=rule,
                    plus=c.plus,
                    minus=c.minus,
                )
            )
        plus = tuple(t for c in table.cells for t in c.plus)
        minus = (*[t for c in table.cells for t in c.minus], table.universe)
        rule = f"the {table.name} histogram (every derived cell) does not sum to it"
        rules.append(
            RecordRule(kind="equal", column=table.universe, rule=rule, plus=plus, minus=minus)
        )
    return rules


def _geography_rules() -> list[RecordRule]:
    """A block's GEOCODE is the 15 digits STATE + COUNTY + TRACT + BLOCK, its BLKGRP the first
    digit of its BLOCK; a whole-geography record (GEOCOMP 00) of the block hierarchy's summary
    levels has the GEOCODE of its codes."""
    rules = []
    for sumlev, (name, digits) in {**SUMMARY_LEVELS, BLOCK_LEVEL: ("block", BLOCK_DIGITS)}.items():
        parts = GEOCODE_PARTS[digits]
        rule = (
            f"the GEOCODE of a {name} record (SUMLEV {sumlev}) must be the {digits} digits"
            f" {' + '.join(parts)}"
        )
        rules.append(
            RecordRule(
                kind="geocode",
                column="GEOCODE",
                rule=rule,
                plus=parts,
                sumlev=sumlev,
                digits=digits,
            )
        )
    rule = "a block's BLKGRP must be the first digit of its BLOCK"
    rules.append(RecordRule(kind="block_group", column="BLKGRP", rule=rule, sumlev=BLOCK_LEVEL))
    return rules


def record_rules(max_count: int) -> tuple[RecordRule, ...]:
    """Every rule a record keeps, in the order errors prefer on one line: counts first."""
    bound = (
        f"count must be a non-negative integer at most MAX_COUNT = {max_count:_} (the largest"
        " every stage of the release holds exactly)"
    )
    counts = [RecordRule(kind="count", column=c, rule=bound) for c in COUNTS]
    return (*counts, *_geography_rules(), *_structure_rules(), *_derived_rules())


def first_broken_record(
    batch: pd.DataFrame, counts: np.ndarray, rules: Sequence[RecordRule], max_count: int
) -> tuple[int, int] | None:
    """``(line, rule index)`` of the earliest line of ``batch`` (``line`` and
    :data:`TEXT_FIELDS` as text) and ``counts`` (rows x :data:`COUNTS`, text) that breaks a
    rule, with the first rule it breaks; ``None`` if every line keeps every rule.

    Vectorised over the batch: the counts are parsed as one array, and every linear rule is
    one column of a single matrix product (in float64, exact: some 600 terms of at most
    ``max_count`` stay far below 2**53)."""
    broken_counts, values = _parse_counts(counts, max_count)
    column = {c: i for i, c in enumerate(COUNTS)}
    linear = [r for r in rules if r.kind in ("equal", "at_least")]
    signs = np.zeros((len(COUNTS), len(linear)))
    for j, rule in enumerate(linear):
        for c in rule.plus:
            signs[column[c], j] += 1
        for c in rule.minus:
            signs[column[c], j] -= 1
    sums = values.astype(np.float64) @ signs
    at_least = np.array([r.kind == "at_least" for r in linear])
    linear_broken = np.where(at_least, sums < 0, sums != 0)
    text = {c: batch[c].fillna("").astype(str) for c in TEXT_FIELDS}
    broken = np.zeros((len(batch), len(rules)), dtype=bool)
    j = 0
    for i, rule in enumerate(rules):
        if rule.kind == "count":
            broken[:, i] = broken_counts[:, column[rule.column]]
        elif rule.kind in ("equal", "at_least"):
            broken[:, i] = linear_broken[:, j]
            j += 1
        else:
            broken[:, i] = _broken_geography(rule, text)
    rows = np.flatnonzero(broken.any(axis=1))
    if not rows.size:
        return None
    lines = batch["line"].to_numpy(np.int64)
    first = rows[np.argmin(lines[rows])]
    return int(lines[first]), int(np.argmax(broken[first]))


MAX_DIGITS = 10
"""Counts of more digits (after leading zeros) are refused unparsed: 10 digits stay below 2**63."""


def _parse_counts(text: np.ndarray, max_count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(broken, values)`` of a 2-D array of count texts: broken where a text is not a
    non-negative integer (ASCII digits only) at most ``max_count``; values 0 there."""
    try:
        ascii_text = np.char.strip(text.astype("S"))  # None (a missing field): b"None"
    except UnicodeEncodeError:  # a non-ASCII character somewhere: check text by text
        ascii_text = np.vectorize(lambda t: t.encode() if str(t).isascii() else b"x")(text)
        ascii_text = np.char.strip(ascii_text.astype("S"))
    digits = np.char.isdigit(ascii_text)
    short = np.char.str_len(np.char.lstrip(ascii_text, b"0")) <= MAX_DIGITS
    values = np.where(digits & short, ascii_text, b"0").astype(np.int64)
    broken = ~(digits & short) | (values > max_count)
    return broken, np.where(broken, 0, values)


def _broken_geography(rule: RecordRule, text: Mapping[str, pd.Series]) -> np.ndarray:
    here = text["SUMLEV"] == rule.sumlev
    if rule.sumlev != BLOCK_LEVEL:  # a geographic component (an urban part, ...) is not checked
        here &= text["GEOCOMP"] == WHOLE
    if rule.kind == "block_group":
        return (here & (text["BLKGRP"] != text["BLOCK"].str[:1])).to_numpy()
    geocode = text["GEOCODE"]
    concatenated = text[rule.plus[0]]
    for part in rule.plus[1:]:
        concatenated = concatenated + text[part]
    digits = geocode.str.fullmatch(rf"[0-9]{{{rule.digits}}}")
    return (here & (~digits | (geocode != concatenated))).to_numpy()


FIELD_COUNTS = (len(GEOHEADER_FIELDS), *(len(RECORD_KEY) + len(s) for s in SEGMENTS))
"""Fields per line of each file: geoheader, segments 1-3."""
LOGRECNO_AT = (GEOHEADER_FIELDS.index("LOGRECNO"), RECORD_KEY.index("LOGRECNO"))
"""Where LOGRECNO is on a line of the geoheader, and of a segment."""
KEYS = ("FILEID", "STUSAB", "CIFSN", "LOGRECNO")
"""The record-key fields checked in every file (CIFSN in the segments only)."""


def key_field(field: str, n: int) -> str:
    """The batch column of record-key ``field`` of file ``n``; ``PREVIOUS`` is the previous
    line's LOGRECNO."""
    return f"{field}_{n}"


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A broken rule: ``stage`` orders the kinds of rule (0 each file's record keys, 1 the same
    records in all four files, 2 the record rules), then the earliest ``line``, then ``order``
    (the rule's place among those of its stage)."""

    stage: int
    line: int
    order: int
    file: int
    column: str
    rule: str


def first_failures(
    batch: pd.DataFrame,
    counts: np.ndarray,
    state: str,
    rules: Sequence[RecordRule],
    max_count: int,
) -> list[Failure]:
    """The first failure of each stage in ``batch`` (``line``, every file's :data:`KEYS` and
    ``PREVIOUS``, :data:`TEXT_FIELDS`, as text) and ``counts`` (rows x :data:`COUNTS`, text)."""
    lines = batch["line"].to_numpy(np.int64)
    failures = []
    for stage, checks in enumerate((_key_checks(batch, state), _same_record_checks(batch))):
        found = _first(lines, [c.broken for c in checks])
        if found is not None:
            line, order = found
            check, row = checks[order], int(np.flatnonzero(lines == line)[0])
            failures.append(
                Failure(
                    stage=stage,
                    line=line,
                    order=order,
                    file=check.file,
                    column=check.column,
                    rule=check.rule(row),
                )
            )
    value = first_broken_record(batch, counts, rules, max_count)
    if value is not None:
        broken = rules[value[1]]
        failures.append(
            Failure(
                stage=2,
                line=value[0],
                order=value[1],
                file=broken.file,
                column=broken.column,
                rule=broken.rule,
            )
        )
    return failures


@dataclass(frozen=True)
class Check:
    """A vectorised rule: ``broken`` per row, the ``file`` and ``column`` an error names, and
    its ``rule`` text given the row (the text can name the record)."""

    broken: np.ndarray
    file: int
    column: str
    rule: Callable[[int], str]


def _first(lines: np.ndarray, broken: Sequence[np.ndarray]) -> tuple[int, int] | None:
    """``(line, index)``: the earliest line breaking a check, and the first check it breaks."""
    if not broken:
        return None
    matrix = np.column_stack(broken)
    rows = np.flatnonzero(matrix.any(axis=1))
    if not rows.size:
        return None
    first = rows[np.argmin(lines[rows])]
    return int(lines[first]), int(np.argmax(matrix[first]))


def _logrecno(text: pd.Series) -> np.ndarray:
    """LOGRECNO as integers, -1 where it is not a positive integer of at most 9 digits."""
    clean = text.fillna("").astype(str)
    ok = clean.str.fullmatch(r"[0-9]{1,9}")
    return np.where(ok, pd.to_numeric(clean.where(ok, "0")), -1).astype(np.int64)


def _key_checks(batch: pd.DataFrame, state: str) -> list[Check]:
    """Every file's FILEID, STUSAB and (segments) CIFSN, and its LOGRECNO a positive integer
    above the previous line's."""
    checks: list[Check] = []

    def text(field: str, n: int) -> pd.Series:
        return batch[key_field(field, n)].fillna("").astype(str)

    for n in range(4):
        record, previous = _logrecno(text("LOGRECNO", n)), _logrecno(text("PREVIOUS", n))
        file_id = f"must be {FILE_ID!r} (a P.L. 94-171 file)"
        checks.append(
            Check((text("FILEID", n) != FILE_ID).to_numpy(), n, "FILEID", _fixed(file_id))
        )
        usps = f"must be {state.upper()!r} (input.state)"
        checks.append(
            Check((text("STUSAB", n) != state.upper()).to_numpy(), n, "STUSAB", _fixed(usps))
        )
        if n:
            cifsn = f"must be '{n:02d}' in segment {n} (are the segment files swapped?)"
            wrong = (text("CIFSN", n) != f"{n:02d}").to_numpy()
            checks.append(Check(wrong, n, "CIFSN", _fixed(cifsn)))
        positive = "the logical record number must be a positive integer"
        checks.append(Check(record < 1, n, "LOGRECNO", _fixed(positive)))
        order = (
            "out of order: the logical record number is not above the previous line's (the"
            " legacy files list their records in increasing LOGRECNO)"
        )
        descending = (record > 0) & (previous > 0) & (record <= previous)
        checks.append(Check(descending, n, "LOGRECNO", _fixed(order)))
    return checks


def _fixed(rule: str) -> Callable[[int], str]:
    return lambda _row: rule


def _same_record_checks(batch: pd.DataFrame) -> list[Check]:
    """Each segment's record on a line is the geoheader's.

    With every file in increasing order (stage 0) and as many lines, the first line where a
    segment's record differs tells which record is missing where: a segment's smaller record
    is in no line of the geoheader, a larger one leaves the geoheader's out of the segment."""
    geo = _logrecno(batch[key_field("LOGRECNO", 0)])
    checks: list[Check] = []
    for n in (1, 2, 3):
        seg = _logrecno(batch[key_field("LOGRECNO", n)])
        checks.append(Check(seg < geo, n, "LOGRECNO", partial(_not_in_geoheader, seg)))
        checks.append(Check(seg > geo, 0, "LOGRECNO", partial(_not_in_segment, geo, n)))
    return checks


def _not_in_geoheader(seg: np.ndarray, row: int) -> str:
    return (
        f"logical record {seg[row]} is not in the geoheader (every record of a segment must be"
        " one of the geoheader's, on the same line)"
    )


def _not_in_segment(geo: np.ndarray, n: int, row: int) -> str:
    return (
        f"logical record {geo[row]} is not in segment {n} (every record of the geoheader must be"
        " in each segment, on the same line)"
    )
