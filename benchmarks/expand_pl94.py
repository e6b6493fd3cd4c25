"""A clearly labelled SYNTHETIC expansion of real block counts into PL 94-171 person microdata.

Takes a real block-count file (RI/HI 2010: voting age x Hispanic/7 race groups per block) and
writes one row per person in the PPMF layout of `conf/pl94_2020_production.toml` (2,016 cells:
hhgq 8 x votingage 2 x hispanic 2 x cenrace 63). Block, voting age and Hispanic origin are real;
cenrace beyond the 7 single-race groups and the group-quarters type are SYNTHETIC draws:
- two-or-more-races persons get a cenrace in 07..63 (weighted towards the common 07..11);
- Hispanic persons get a cenrace drawn from a fixed mix (mostly 01 and 06);
- about 1.5% of populated blocks are group-quarters blocks with one GQ type, where 80% of the
  residents (adults only for nursing facilities) live in the facility.

    .venv/bin/python benchmarks/expand_pl94.py data/ri_2010_blocks_pl.csv /tmp/ri_pl94.csv --seed 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

GROUPS = ["hisp", "white", "black", "aian", "asian", "nhpi", "other", "two"]
SINGLE_RACE = {"white": 1, "black": 2, "aian": 3, "asian": 4, "nhpi": 5, "other": 6}
GQ_TYPE_SHARES = np.array([0.20, 0.02, 0.15, 0.03, 0.35, 0.05, 0.20])  # GQTYPE_PL 1..7


def _two_or_more(n: int, rng: np.random.Generator) -> np.ndarray:
    weights = np.r_[np.full(5, 10.0), np.ones(52)]
    return rng.choice(np.arange(7, 64), size=n, p=weights / weights.sum())


def _hispanic_race(n: int, rng: np.random.Generator) -> np.ndarray:
    codes = np.r_[[1, 6, 2, 3], _two_or_more(1, rng)]
    race = rng.choice(codes[:4], size=n, p=[0.55, 0.32, 0.06, 0.07])
    mixed = rng.random(n) < 0.08
    race[mixed] = _two_or_more(int(mixed.sum()), rng)
    return race


def expand(blocks: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    parts = []
    for group in GROUPS:
        for voting_age, counts in (
            (1, blocks[f"pop_{group}"] - blocks[f"vap_{group}"]),
            (2, blocks[f"vap_{group}"]),
        ):
            geoid = np.repeat(blocks["GEOID"].to_numpy(), counts.to_numpy())
            n = geoid.size
            if group == "hisp":
                race, hisp = _hispanic_race(n, rng), np.full(n, 2)
            elif group == "two":
                race, hisp = _two_or_more(n, rng), np.ones(n, dtype=int)
            else:
                race, hisp = np.full(n, SINGLE_RACE[group]), np.ones(n, dtype=int)
            parts.append(
                pd.DataFrame(
                    {"GEOID": geoid, "VOTING_AGE": voting_age, "CENHISP": hisp, "CENRACE": race}
                )
            )
    persons = pd.concat(parts, ignore_index=True)
    populated = blocks.loc[blocks["pop"] > 0, "GEOID"].to_numpy()
    gq_blocks = rng.choice(populated, size=max(1, int(0.015 * populated.size)), replace=False)
    gq_type = dict(
        zip(
            gq_blocks,
            rng.choice(np.arange(1, 8), size=gq_blocks.size, p=GQ_TYPE_SHARES),
            strict=True,
        )
    )
    block_type = persons["GEOID"].map(gq_type).fillna(0).astype(int).to_numpy()
    in_facility = (block_type > 0) & (rng.random(len(persons)) < 0.8)
    in_facility &= ~(
        (block_type == 3) & (persons["VOTING_AGE"].to_numpy() == 1)
    )  # no minors in nursing
    gq = np.where(in_facility, block_type, 0)
    geo = persons["GEOID"].astype(str)
    return pd.DataFrame(
        {
            "VINTAGE": "SYNTHETIC_EXPANSION",
            "TABBLKST": geo.str[:2],
            "TABBLKCOU": geo.str[2:5],
            "TABTRACT": geo.str[5:11],
            "TABBLKGRP": geo.str[11:12],
            "TABBLK": geo.str[11:15],
            "RTYPE": np.where(gq > 0, 5, 3),
            "GQTYPE_PL": gq,
            "VOTING_AGE": persons["VOTING_AGE"],
            "CENHISP": persons["CENHISP"],
            "CENRACE": [f"{r:02d}" for r in persons["CENRACE"]],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("blocks", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    blocks = pd.read_csv(args.blocks, dtype={"GEOID": str})
    persons = expand(blocks, np.random.default_rng(args.seed))
    persons.to_csv(args.output, index=False)
    print(
        f"{len(persons)} SYNTHETIC-expansion person rows from {len(blocks)} real blocks -> {args.output}"
    )


if __name__ == "__main__":
    main()
