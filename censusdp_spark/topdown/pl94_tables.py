"""The P.L. 94-171 tables P1-P5 and H1 computed from histograms: the reader's direction reversed.

Pure numpy and scipy, no Spark. The reader (``io.pl94_layout.TABLES``) derives histogram cells
from the table fields; here every field of a table is computed from the cells of a histogram.
Each field (:class:`TableField`) counts the persons (for H1 the housing units) whose Census
variables (:data:`VARIABLES`: ``VOTING_AGE``, ``CENHISP``, ``CENRACE``, ``GQTYPE_PL``,
``OCCUPANCY``, with the PPMF's codes) take codes in given sets, with the Census's field names
and semantics (``P0010001`` ...; "2020 Census State Redistricting Data (Public Law 94-171)
Summary File", tables P1-P5 and H1):

* P1 (race): the total, the population of one race, each of the 63 races of CENRACE, the
  population of two or more races and the subtotals of two, three, four, five and six races;
* P2 (Hispanic or Latino, and not Hispanic or Latino by race): the total, Hispanic, not
  Hispanic, then P1's structure among the not Hispanic;
* P3 and P4: P1 and P2 among the population 18 years and over;
* P5 (group quarters population by major type): the total in group quarters, institutionalized
  (types 1-4) and noninstitutionalized (types 5-7) with each type;
* H1 (occupancy status): housing units, occupied, vacant.

A histogram determines a table when each variable the table names is one of its attributes,
each code of the variable one level of the attribute; any other attribute is summed over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from censusdp_spark.io.pl94_layout import (
    AGES,
    BLOCK_DIGITS,
    BLOCK_LEVEL,
    GQ_TYPES,
    ORIGINS,
    RACE_LAYOUT,
    SUMMARY_LEVELS,
    TABLES,
    race_cell,
    table_cells,
)

VARIABLES: Mapping[str, tuple[str, ...]] = {
    name: codes for table in TABLES.values() for name, codes in table.variables.items()
}
"""The Census variables the tables are defined over, with their codes (those of the PPMF)."""

ADULT = next(code for code, label in AGES.items() if label == "18 and over")
HISPANIC = next(code for code, label in ORIGINS.items() if label == "Hispanic")
NOT_HISPANIC = next(code for code, label in ORIGINS.items() if label == "not Hispanic")
INSTITUTIONAL_CELLS = table_cells("P005", 6)[2:]  # P0050003-6, under P0050002
INSTITUTIONAL = frozenset(code for code, cell, _ in GQ_TYPES if cell in INSTITUTIONAL_CELLS)
NONINSTITUTIONAL = frozenset(code for code, _, _ in GQ_TYPES) - INSTITUTIONAL


@dataclass(frozen=True)
class TableField:
    """A field of a table: ``name`` (``P0010001``) counts the records whose code of every
    variable of ``codes`` is among that variable's codes there (a variable not named: any)."""

    name: str
    codes: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class CensusTable:
    """A table of the redistricting file (``P1``): its fields in the file's order."""

    name: str
    fields: tuple[TableField, ...]

    @property
    def prefix(self) -> str:
        """The prefix of its field names: ``P001`` for ``P1``."""
        return f"{self.name[0]}{int(self.name[1:]):03d}"

    @property
    def variables(self) -> tuple[str, ...]:
        """The variables its fields are defined over, in :data:`VARIABLES` order."""
        named = {v for f in self.fields for v in f.codes}
        return tuple(v for v in VARIABLES if v in named)


def _race_fields(table: str, among: Mapping[str, frozenset[str]]) -> list[TableField]:
    """P1's structure over CENRACE (total, one race, each race, two or more races and each
    number of races' subtotal) among the records of ``among``, named in race table ``table``."""
    race = VARIABLES["CENRACE"]  # CENRACE 01-63, the order of RACE_LAYOUT.races
    lay = RACE_LAYOUT
    codes = {lay.total: race, lay.two_or_more: race[len(lay.groups[0][1]) :]}
    for subtotal, cells in lay.groups:
        counted = [race[lay.races.index(c)] for c in cells]
        codes[subtotal] = tuple(counted)
        codes.update({c: (code,) for c, code in zip(cells, counted, strict=True)})
    return [
        TableField(race_cell(table, c), {**among, "CENRACE": frozenset(codes[c])})
        for c in sorted(codes)
    ]


def _hispanic_fields(table: str, among: Mapping[str, frozenset[str]]) -> list[TableField]:
    """P2's structure (total, Hispanic, then P1's among the not Hispanic) among ``among``."""
    return [
        TableField(f"{table}0001", dict(among)),
        TableField(f"{table}0002", {**among, "CENHISP": frozenset({HISPANIC})}),
        *_race_fields(table, {**among, "CENHISP": frozenset({NOT_HISPANIC})}),
    ]


def _group_quarters_fields() -> list[TableField]:
    """P5: in group quarters, institutionalized and its types, noninstitutionalized and its."""
    fields = [
        TableField("P0050001", {"GQTYPE_PL": INSTITUTIONAL | NONINSTITUTIONAL}),
        TableField("P0050002", {"GQTYPE_PL": INSTITUTIONAL}),
        TableField("P0050007", {"GQTYPE_PL": NONINSTITUTIONAL}),
    ]
    fields += [TableField(cell, {"GQTYPE_PL": frozenset({code})}) for code, cell, _ in GQ_TYPES]
    return sorted(fields, key=lambda f: f.name)


def _occupancy_fields() -> list[TableField]:
    """H1: housing units, occupied, vacant."""
    every = frozenset(VARIABLES["OCCUPANCY"])
    return [
        TableField("H0010001", {"OCCUPANCY": every}),
        *[
            TableField(cell, {"OCCUPANCY": frozenset({code})})
            for cell, code in zip(("H0010002", "H0010003"), ("occupied", "vacant"), strict=True)
        ],
    ]


_ADULTS = {"VOTING_AGE": frozenset({ADULT})}
CENSUS_TABLES: Mapping[str, CensusTable] = {
    t.name: t
    for t in (
        CensusTable("P1", tuple(_race_fields("P001", {}))),
        CensusTable("P2", tuple(_hispanic_fields("P002", {}))),
        CensusTable("P3", tuple(_race_fields("P003", _ADULTS))),
        CensusTable("P4", tuple(_hispanic_fields("P004", _ADULTS))),
        CensusTable("P5", tuple(_group_quarters_fields())),
        CensusTable("H1", tuple(_occupancy_fields())),
    )
}
"""The tables a release can compute, by the Census's name, each with every field of the file."""
assert [len(t.fields) for t in CENSUS_TABLES.values()] == [71, 73, 71, 73, 10, 3]
assert all(
    tuple(f.name for f in t.fields) == table_cells(t.prefix, len(t.fields))
    for t in CENSUS_TABLES.values()
)

SUMMARY_LEVEL_OF_DIGITS: Mapping[int, str] = {
    0: "010",  # the nation
    **{digits: sumlev for sumlev, (_, digits) in SUMMARY_LEVELS.items()},
    BLOCK_DIGITS: BLOCK_LEVEL,
}
"""The Census's ``SUMLEV`` of a geography whose ``GEOCODE`` has this many digits."""


def table_fields(tables: Sequence[str]) -> tuple[TableField, ...]:
    """Every field of ``tables`` (names of :data:`CENSUS_TABLES`), table by table."""
    return tuple(f for t in tables for f in CENSUS_TABLES[t].fields)


def field_matrix(
    fields: Sequence[TableField], cell_codes: Mapping[str, np.ndarray], n_cells: int
) -> np.ndarray:
    """``(n_cells, len(fields))`` of 0 and 1: whether histogram cell ``c`` is counted in a field,
    given each variable's code at every cell (``cell_codes[variable][c]``)."""
    matrix = np.ones((n_cells, len(fields)), dtype=np.int64)
    for j, f in enumerate(fields):
        for variable, codes in f.codes.items():
            matrix[:, j] &= np.isin(cell_codes[variable], sorted(codes))
    return matrix


def table_values(
    cells: Sequence[np.ndarray], counts: Sequence[np.ndarray], matrix: np.ndarray
) -> np.ndarray:
    """``(nodes, fields)`` int64: each node's fields from its sparse histogram (the ``cells``
    and ``counts`` of every node) and a :func:`field_matrix`; exact integer sums."""
    lengths = np.array([len(c) for c in cells], dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    empty = [np.zeros(0, dtype=np.int64)]  # a batch without nodes
    flat_cells = np.concatenate([*empty, *(np.asarray(c, dtype=np.int64) for c in cells)])
    flat_counts = np.concatenate([*empty, *(np.asarray(c, dtype=np.int64) for c in counts)])
    histograms = sparse.csr_array(
        (flat_counts, flat_cells, indptr), shape=(len(lengths), matrix.shape[0])
    )
    return np.asarray(histograms @ matrix, dtype=np.int64)
