"""Rebuild ``households.csv`` and ``persons.csv`` from the PopulationSim 0.5.1 seed files.

    .venv/bin/python data/pums/prepare.py SEED_DIR

where SEED_DIR holds PopulationSim's ``seed_households.csv`` and ``seed_persons.csv``
(``example_calm/data/`` of the populationsim 0.5.1 sdist).

PopulationSim doubled 628 PUMS households (``dupcount = 2``) in both seed tables; the copies are
dropped here (unique on SERIALNO for households, on (SERIALNO, SPORDER) for persons), and only
the columns the synthetic-data configs read are kept. Output has LF line endings.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HOUSEHOLD_COLUMNS = [
    "SERIALNO",
    "NP",
    "TEN",
    "BLD",
    "VEH",
    "HHT",
    "HINCP",
    "HUPAC",
    "NWESR",
    "R65",
    "HHL",
    "MV",
]
PERSON_COLUMNS = [
    "SERIALNO",
    "SPORDER",
    "AGEP",
    "SEX",
    "RAC1P",
    "HISP",
    "SCHL",
    "ESR",
    "MAR",
    "RELP",
    "WKHP",
    "NATIVITY",
    "SCH",
]


def main(source: Path, target: Path) -> None:
    households = pd.read_csv(
        source / "seed_households.csv", usecols=HOUSEHOLD_COLUMNS, low_memory=False
    )
    persons = pd.read_csv(source / "seed_persons.csv", usecols=PERSON_COLUMNS, low_memory=False)
    households = households.drop_duplicates("SERIALNO").sort_values("SERIALNO")[HOUSEHOLD_COLUMNS]
    persons = persons.drop_duplicates(["SERIALNO", "SPORDER"]).sort_values(["SERIALNO", "SPORDER"])
    persons = persons[PERSON_COLUMNS]
    sizes = persons.groupby("SERIALNO").size()
    if not (sizes.reindex(households["SERIALNO"]).to_numpy() == households["NP"].to_numpy()).all():
        raise SystemExit("NP does not match the number of person records")
    for name, frame in (("households.csv", households), ("persons.csv", persons)):
        # Integer columns with blanks are floats in pandas; write them back as integers.
        out = frame.astype({c: "Int64" for c in frame.columns})
        out.to_csv(target / name, index=False, lineterminator="\n")
    print(f"{len(households)} households, {len(persons)} persons written to {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parent)
