"""The shipped reduced PUMS tables (``data/pums/``), cut small, and bad copies of them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def real_tables(n: int = 300) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The first ``n`` real households and their persons (small, so each run is quick)."""
    households = pd.read_csv(ROOT / "data" / "pums" / "households.csv", dtype=str).head(n)
    persons = pd.read_csv(ROOT / "data" / "pums" / "persons.csv", dtype=str)
    return households, persons[persons["SERIALNO"].isin(households["SERIALNO"])].reset_index(
        drop=True
    )


def duplicate_person(h: pd.DataFrame, p: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Person 2 of the first two-person household listed twice: it is no head, and with
    larger households dropped every per-household rule still holds."""
    serial = next(s for s, n in p["SERIALNO"].value_counts(sort=False).items() if n == 2)
    second = p.index[(p["SERIALNO"] == serial) & (p["SPORDER"] == "2")][0]
    return h, pd.concat([p.loc[:second], p.loc[second:]], ignore_index=True)
