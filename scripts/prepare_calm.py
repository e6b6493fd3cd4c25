"""Build the PGSR leaf input for the CALM region from the two PopulationSim files in data/calm/.

    .venv/bin/python scripts/prepare_calm.py

Reads ``control_totals_taz.csv`` (households by size, HHSIZE1-HHSIZE4, 4 = "4 or more", per
TAZ) and ``geo_cross_walk.csv`` (TAZ -> block group -> tract -> county), and writes
``calm_taz_household_sizes.csv``: one row per TAZ with the zero-padded codes ``county`` (3),
``tract`` (6), ``block_group`` (3: the crosswalk numbers block groups 1-118 across the region)
and ``taz`` (4), whose concatenation is the 16-digit leaf geocode of the hierarchy region ->
county -> tract -> block group -> TAZ, and the four size counts unchanged. Every code and count
comes from the two files; nothing is synthesised. The script checks that both files list the
same TAZs with the same tract and county and that the size counts sum to HHBASE on every row.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[1] / "data" / "calm"
SIZES = ("HHSIZE1", "HHSIZE2", "HHSIZE3", "HHSIZE4")
WIDTHS = {"county": 3, "tract": 6, "block_group": 3, "taz": 4}


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:  # the files keep the sdist's CRLF line endings
        return [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]


def code(value: str, name: str) -> str:
    if not value.isdigit() or len(value) > WIDTHS[name]:
        raise ValueError(f"{name} code {value!r} does not fit {WIDTHS[name]} digits")
    return value.zfill(WIDTHS[name])


def main() -> int:
    totals = {row["TAZ"]: row for row in read_rows(FOLDER / "control_totals_taz.csv")}
    walk = {row["TAZ"]: row for row in read_rows(FOLDER / "geo_cross_walk.csv")}
    if set(totals) != set(walk):
        raise ValueError(f"the files list different TAZs: {sorted(set(totals) ^ set(walk))[:5]}")
    out = []
    for taz, row in totals.items():
        geo = walk[taz]
        if (geo["TRACTCE"], geo["COUNTYFP"]) != (row["TRACTCE"], row["COUNTYFP"]):
            raise ValueError(f"TAZ {taz}: tract or county differs between the two files")
        sizes = [int(row[s]) for s in SIZES]
        if sum(sizes) != int(row["HHBASE"]):
            raise ValueError(f"TAZ {taz}: HHSIZE1-4 sum to {sum(sizes)}, HHBASE is {row['HHBASE']}")
        codes = {
            "county": code(row["COUNTYFP"], "county"),
            "tract": code(row["TRACTCE"], "tract"),
            "block_group": code(geo["BLKGRP"], "block_group"),
            "taz": code(taz, "taz"),
        }
        out.append({**codes, **dict(zip(SIZES, map(str, sizes), strict=True))})
    out.sort(key=lambda r: (r["county"], r["tract"], r["block_group"], r["taz"]))
    target = FOLDER / "calm_taz_household_sizes.csv"
    with target.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*WIDTHS, *SIZES], lineterminator="\n")
        writer.writeheader()
        writer.writerows(out)
    households = sum(int(r[s]) for r in out for s in SIZES)
    print(f"wrote {target}: {len(out)} TAZs, {households} households")
    return 0


if __name__ == "__main__":
    sys.exit(main())
