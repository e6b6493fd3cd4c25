"""Rows of the block-level TopDown input (``conf/ri_2010_demo.toml``'s CSV layout): three good
real RI 2010 blocks, and rows broken or changed one field at a time."""

from __future__ import annotations

HEADER = "GEOID,state,county,vtd,pop,pop_white,pop_black,pop_hisp,pop_aian,pop_asian,pop_nhpi,pop_other,pop_two,vap,vap_white,vap_black,vap_hisp,vap_aian,vap_asian,vap_nhpi,vap_other,vap_two"
GOOD = [
    "440010301001000,44,001,,23,19,0,4,0,0,0,0,0,12,8,0,4,0,0,0,0,0",
    "440010301001001,44,001,,17,17,0,0,0,0,0,0,0,14,14,0,0,0,0,0,0,0",
    "440010301001002,44,001,,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0",
]


def bad_row(field: int, value: str) -> list[str]:
    """``GOOD`` with field ``field`` of its second row set to ``value``."""
    parts = GOOD[1].split(",")
    parts[field] = value
    return [GOOD[0], ",".join(parts), GOOD[2]]


def adults(row: str, n: int) -> str:
    """``row`` with ``n`` more white adults (its file totals kept consistent)."""
    parts = row.split(",")
    for field in (4, 5, 13, 14):  # pop, pop_white, vap, vap_white
        parts[field] = str(int(parts[field]) + n)
    return ",".join(parts)
