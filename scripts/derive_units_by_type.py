"""Derive data/pl94_e2e_providence_units_by_type.csv from the shipped Providence legacy files:
per block (SUMLEV 750), its occupied and vacant housing units (H1: H0010002, H0010003) and,
per major group-quarters type of P5, its occupied facilities, counted as 1 where the type's
population is positive (the legacy files count no facilities) and 0 elsewhere.

    .venv/bin/python scripts/derive_units_by_type.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "data" / "pl94_2018_e2e_providence_ri"
OUT = ROOT / "data" / "pl94_e2e_providence_units_by_type.csv"
TYPES = ("P0050003", "P0050004", "P0050005", "P0050006", "P0050008", "P0050009", "P0050010")


def segment(name: str, columns: dict[int, str]) -> pd.DataFrame:
    frame = pd.read_csv(FILES / name, sep="|", header=None, dtype=str, encoding="latin-1")
    return frame[list(columns)].rename(columns=columns)


def main() -> None:
    geo = segment("rigeo2018_2020Style.pl", {2: "SUMLEV", 7: "LOGRECNO", 9: "GEOID"})
    units = segment("ri000022018_2020Style.pl", {4: "LOGRECNO", 150: "OCCUPIED", 151: "VACANT"})
    gq = segment("ri000032018_2020Style.pl", {4: "LOGRECNO", **{4 + int(c[-2:]): c for c in TYPES}})
    blocks = geo[geo["SUMLEV"] == "750"].merge(units, on="LOGRECNO", validate="one_to_one")
    blocks = blocks.merge(gq, on="LOGRECNO", validate="one_to_one")
    out = blocks[["GEOID", "OCCUPIED", "VACANT"]].copy()
    for t, cell in enumerate(TYPES, start=1):
        out[f"FAC_GQ{t}"] = (blocks[cell].astype(int) > 0).astype(int)
    out.to_csv(OUT, index=False)
    print(f"{OUT}: {len(out)} blocks")


if __name__ == "__main__":
    main()
