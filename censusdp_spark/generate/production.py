"""SYNTHETIC person microdata for the 2020 production schema, on the national generator's blocks.

``censusdp generate national --schema production`` writes, beside the 16-cell blocks of
:mod:`censusdp_spark.generate.national` (same seed, same states, same blocks and counts):

* ``persons/state_XX.parquet``: one row per person in the layout of the Census's Privacy-Protected
  Microdata File (PPMF), the columns ``conf/national_production.toml`` reads: ``TABBLKST``,
  ``TABBLKCOU``, ``TABTRACT``, ``TABBLK`` (2 + 3 + 6 + 4 digits = the block's GEOID), ``RTYPE``
  (3 household, 5 group quarters), ``GQTYPE_PL`` (0 household, 1-7 the P.L. 94-171 group-quarters
  types), ``VOTING_AGE`` (1 under 18, 2 18+), ``CENHISP`` (1 not Hispanic, 2 Hispanic) and
  ``CENRACE`` (01-63);
* ``spine/state_XX.parquet``: ``GEOID`` of every block of the selected states, empty ones
  included (the public block list the release's nodes come from).

Why microdata rather than 2,016-cell block histograms: it is what the Census's TopDown reads (the
CEF, in this layout), and it is compact (about 9 bytes a person in Parquet against 2,016 columns a
block), so the benchmark reads and tabulates persons as a production run would.

The persons of a block are exactly its 16-cell counts (so each block's 2,016-cell histogram sums,
by voting age and Hispanic origin/race group, to its row of ``blocks/``). What is drawn, from
stream ``(3, state)`` of the seed (the 16-cell output is unchanged by it):

1. **Detailed race.** The non-Hispanic one-race groups are CENRACE 01-06; a non-Hispanic
   person of two or more races draws CENRACE 07-63 in proportion to the real not-Hispanic
   counts of those races; a Hispanic person draws CENRACE 01-63 in proportion to the real
   Hispanic counts. The real counts are the state record of the 2018 End-to-End Census Test
   P.L. 94-171 file for Providence County, RI (``data/pl94_2018_e2e_providence_ri/``; P1 minus
   P2's not-Hispanic cells gives the Hispanic ones), the only shipped file with all 63 races.
2. **Group quarters.** The group-quarters persons of a site block (drawn by the 16-cell model)
   get one type per site, in proportion to the real P5 persons by type of the same file mixed
   with a uniform tenth (Providence has no military quarters; every type should occur). A nursing
   facility holds adults only (the production structural zero), so it takes at most the block's
   adults. The people in group quarters are chosen at random among those allowed.

:func:`production_validation` compares the generated persons with the real Perry County PPMF
and the Providence file; the report prints it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from censusdp_spark.generate.national import (
    DATA_DIR,
    HOUSEHOLD_CHUNK_PERSONS,
    ModelParameters,
    StateBlocks,
    _chunks,
    _rng,
    block_geoids,
    generate_national,
    readme_text,
    report_text,
)
from censusdp_spark.io.pl94_layout import GQ_TYPES, RACE_LAYOUT, SEGMENTS, race_cell

PROVIDENCE_DIR = DATA_DIR / "pl94_2018_e2e_providence_ri"  # segments 1 and 3 only
PERRY_PPMF = DATA_DIR / "ppmf_perry_county_al_20210428_eps12-2.csv"
PERSON_COLUMNS = (
    "TABBLKST", "TABBLKCOU", "TABTRACT", "TABBLK", "RTYPE", "GQTYPE_PL", "VOTING_AGE", "CENHISP",
    "CENRACE",
)  # fmt: skip
CENRACE_CODES = tuple(f"{c:02d}" for c in range(1, 64))
ONE_RACE_CENRACE = {"white": 0, "black": 1, "aian": 2, "asian": 3, "nhpi": 4, "other": 5}
"""CENRACE index (0 = code 01) of each non-Hispanic one-race group of the 16-cell model."""
GROUPS = ("white", "black", "hisp", "aian", "asian", "nhpi", "other", "two")  # RACES order
TWO_OR_MORE_FIRST = 6  # CENRACE 07, the first of two or more races
NURSING = 3  # GQTYPE_PL of nursing facilities: adults only
UNIFORM_TYPE_SHARE = 0.1


@dataclass(frozen=True)
class RaceAnchors:
    """The real shares the persons are drawn from (see the module docstring)."""

    not_hispanic: np.ndarray  # (63,) persons by CENRACE, not Hispanic
    hispanic: np.ndarray  # (63,) persons by CENRACE, Hispanic
    group_quarters: np.ndarray  # (7,) persons by GQTYPE_PL 1..7

    @property
    def two_or_more(self) -> np.ndarray:
        """Shares of CENRACE 07-63 among not-Hispanic persons of two or more races."""
        counts = self.not_hispanic[TWO_OR_MORE_FIRST:].astype(np.float64)
        return counts / counts.sum()

    @property
    def hispanic_race(self) -> np.ndarray:
        """Shares of CENRACE 01-63 among Hispanic persons."""
        return self.hispanic / self.hispanic.sum()

    @property
    def site_types(self) -> np.ndarray:
        """Probability of each group-quarters type 1..7 for a site."""
        shares = self.group_quarters / self.group_quarters.sum()
        return (1 - UNIFORM_TYPE_SHARE) * shares + UNIFORM_TYPE_SHARE / len(shares)


def _state_record(path: Path) -> list[int]:
    """The counts of the first record (the state) of a legacy segment file."""
    with path.open() as lines:
        return [int(v) for v in next(lines).rstrip("\n").split("|")[5:]]


def load_race_anchors(folder: Path = PROVIDENCE_DIR) -> RaceAnchors:
    """CENRACE counts by Hispanic origin and P5 persons by type, from the Providence files."""
    segment1 = dict(
        zip(SEGMENTS[0], _state_record(folder / "ri000012018_2020Style.pl"), strict=True)
    )
    segment3 = dict(
        zip(SEGMENTS[2], _state_record(folder / "ri000032018_2020Style.pl"), strict=True)
    )
    everyone = np.array([segment1[race_cell("P001", c)] for c in RACE_LAYOUT.races])
    not_hispanic = np.array([segment1[race_cell("P002", c)] for c in RACE_LAYOUT.races])
    return RaceAnchors(
        not_hispanic=not_hispanic,
        hispanic=everyone - not_hispanic,
        group_quarters=np.array([segment3[cell] for _, cell, _ in GQ_TYPES]),
    )


@dataclass(frozen=True, kw_only=True)
class Persons:
    """Persons of a run of blocks, in block order: index of the block in the run, and codes."""

    block: np.ndarray
    site_type: np.ndarray  # per block of the run: 0, or its group-quarters type 1..7
    gq_type: np.ndarray  # 0 household, 1..7
    adult: np.ndarray  # bool
    hispanic: np.ndarray  # bool
    cenrace: np.ndarray  # 0..62 (code - 1)


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Persons of a (blocks, k) count array: each person's block and column, block-major."""
    flat = counts.reshape(-1)
    cell = np.repeat(np.arange(flat.size), flat)
    return cell // counts.shape[1], cell % counts.shape[1]


def draw_persons(
    rng: np.random.Generator, blocks: StateBlocks, run: slice, anchors: RaceAnchors
) -> Persons:
    """The persons of blocks ``run`` of a state: its 16-cell counts, then race detail and
    group quarters as the module docstring says."""
    races, adults = blocks.races[run].astype(np.int64), blocks.adults[run].astype(np.int64)
    by_age = np.stack([races - adults, adults], axis=2).reshape(len(races), -1)
    block, column = _expand(by_age)
    group, adult = column // 2, column % 2 == 1
    cenrace = np.zeros(len(block), dtype=np.int8)
    for name, code in ONE_RACE_CENRACE.items():
        cenrace[group == GROUPS.index(name)] = code
    two = group == GROUPS.index("two")
    cenrace[two] = TWO_OR_MORE_FIRST + rng.choice(57, int(two.sum()), p=anchors.two_or_more)
    hispanic = group == GROUPS.index("hisp")
    cenrace[hispanic] = rng.choice(63, int(hispanic.sum()), p=anchors.hispanic_race)
    site_type = _site_types(rng, blocks.group_quarters[run], anchors)
    gq_type = _group_quarters(rng, block, adult, blocks.group_quarters[run], site_type)
    return Persons(
        block=block,
        site_type=site_type,
        gq_type=gq_type,
        adult=adult,
        hispanic=hispanic,
        cenrace=cenrace,
    )


def _site_types(rng: np.random.Generator, outside: np.ndarray, anchors: RaceAnchors) -> np.ndarray:
    """Per block, 0, or for a block with people in group quarters its type 1..7."""
    kind = np.zeros(len(outside), dtype=np.int8)
    sites = np.flatnonzero(outside > 0)
    kind[sites] = 1 + rng.choice(7, len(sites), p=anchors.site_types)
    return kind


def _group_quarters(
    rng: np.random.Generator,
    block: np.ndarray,
    adult: np.ndarray,
    outside: np.ndarray,
    kind: np.ndarray,
) -> np.ndarray:
    """Each person's GQTYPE_PL: 0, or its block's type ``kind`` for the ``outside[b]`` persons
    chosen at random in block ``b`` among those the type allows (adults in nursing facilities)."""
    gq_type = np.zeros(len(block), dtype=np.int8)
    at_site = np.flatnonzero(kind[block] > 0)
    allowed = (kind[block[at_site]] != NURSING) | adult[at_site]
    # Allowed people first, in random order, within each block; the first ``outside`` are in.
    order = np.lexsort((rng.random(len(at_site)), ~allowed, block[at_site]))
    ranked = at_site[order]
    first = np.searchsorted(block[ranked], block[ranked], side="left")
    rank = np.arange(len(ranked)) - first
    chosen = ranked[(rank < outside[block[ranked]]) & allowed[order]]
    gq_type[chosen] = kind[block[chosen]]
    return gq_type


def _dictionary(indices: np.ndarray, values: list[str] | tuple[str, ...]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(values))


def _geocode_parts(geoids: pa.Array) -> dict[str, tuple[np.ndarray, list[str]]]:
    """Per geocode column, each block's index into its distinct values, and the values."""
    text = pd.Series(geoids.to_numpy(zero_copy_only=False))
    parts = {"TABBLKST": (0, 2), "TABBLKCOU": (2, 5), "TABTRACT": (5, 11), "TABBLK": (11, 15)}
    out = {}
    for name, (start, stop) in parts.items():
        codes, values = pd.factorize(text.str[start:stop])
        out[name] = (codes, list(values))
    return out


def persons_table(persons: Persons, geoids: pa.Array) -> pa.Table:
    """The PPMF-layout table of ``persons``, whose blocks' GEOIDs are ``geoids``."""
    columns: dict[str, pa.Array] = {
        name: _dictionary(codes[persons.block], values)
        for name, (codes, values) in _geocode_parts(geoids).items()
    }
    in_gq = persons.gq_type > 0
    columns["RTYPE"] = _dictionary(in_gq.astype(np.int32), ["3", "5"])
    columns["GQTYPE_PL"] = _dictionary(persons.gq_type, [str(t) for t in range(8)])
    columns["VOTING_AGE"] = _dictionary(persons.adult.astype(np.int32), ["1", "2"])
    columns["CENHISP"] = _dictionary(persons.hispanic.astype(np.int32), ["1", "2"])
    columns["CENRACE"] = _dictionary(persons.cenrace, CENRACE_CODES)
    return pa.table(columns)


def state_persons(
    blocks: StateBlocks, state: int, seed: int, anchors: RaceAnchors
) -> Iterator[tuple[slice, Persons, pa.Table]]:
    """The persons of a state in runs of blocks of about ``HOUSEHOLD_CHUNK_PERSONS`` people
    (bounded memory), each with its PPMF-layout table."""
    rng = _rng(seed, 3, state)
    geoids = block_geoids(blocks.code)
    for run in _chunks(blocks.pop, HOUSEHOLD_CHUNK_PERSONS):
        persons = draw_persons(rng, blocks, run, anchors)
        yield run, persons, persons_table(persons, geoids[run.start : run.stop])


def check_persons(persons: Persons, blocks: StateBlocks, run: slice) -> None:
    """Raise ``ArithmeticError`` unless the persons keep the blocks' counts and the rules."""
    n = run.stop - run.start
    in_gq = persons.gq_type > 0
    rules = {
        "persons per block equal pop": np.array_equal(
            np.bincount(persons.block, minlength=n), blocks.pop[run]
        ),
        "adults per block equal vap": np.array_equal(
            np.bincount(persons.block, persons.adult, n).astype(np.int64),
            blocks.adults[run].sum(axis=1),
        ),
        "group-quarters persons per block as drawn": np.array_equal(
            np.bincount(persons.block, in_gq, n).astype(np.int64),
            np.minimum(blocks.group_quarters[run], _allowed_at_most(persons, n)),
        ),
        "a type for every block with people in group quarters": np.array_equal(
            persons.site_type > 0, blocks.group_quarters[run] > 0
        ),
        "no minors in nursing facilities": not bool(
            ((persons.gq_type == NURSING) & ~persons.adult).any()
        ),
    }
    broken = [rule for rule, kept in rules.items() if not kept]
    if broken:
        raise ArithmeticError(f"generated persons break: {', '.join(broken)}")


def _allowed_at_most(persons: Persons, n: int) -> np.ndarray:
    """Per block, the persons its group-quarters type allows (adults in nursing facilities)."""
    nursing = persons.site_type == NURSING
    adults = np.bincount(persons.block, persons.adult, n)
    everyone = np.bincount(persons.block, minlength=n)
    return np.where(nursing, adults, everyone).astype(np.int64)


@dataclass
class PersonSummary:
    """Totals the validation compares: persons by (GQ type, adult, Hispanic, CENRACE), and per
    populated block the number of non-zero cells of its 2,016-cell histogram."""

    cells: np.ndarray
    nonzero_cells: list[np.ndarray]

    @classmethod
    def empty(cls) -> PersonSummary:
        return cls(np.zeros((8, 2, 2, 63), np.int64), [])

    def add(self, block: np.ndarray, gq: np.ndarray, adult, hispanic, cenrace) -> None:
        cell = ((gq.astype(np.int64) * 2 + adult) * 2 + hispanic) * 63 + cenrace
        np.add.at(self.cells.reshape(-1), cell, 1)
        distinct = np.unique(block.astype(np.int64) * 2016 + cell)
        self.nonzero_cells.append(np.bincount(np.unique(distinct // 2016, return_inverse=True)[1]))

    def add_persons(self, persons: Persons) -> None:
        self.add(persons.block, persons.gq_type, persons.adult, persons.hispanic, persons.cenrace)

    def statistics(self) -> dict[str, float]:
        c, total = self.cells, self.cells.sum()
        hispanic = c[:, :, 1, :].sum(axis=(0, 1))
        not_hispanic = c[:, :, 0, :].sum(axis=(0, 1))
        gq = c[1:].sum(axis=(1, 2, 3))
        stats = {
            "persons": float(total),
            "voting_age_share": c[:, 1].sum() / total,
            "hispanic_share": hispanic.sum() / total,
            "two_or_more_races_share": c[..., TWO_OR_MORE_FIRST:].sum() / total,
            "hispanic: white alone": hispanic[0] / hispanic.sum(),
            "hispanic: some other race alone": hispanic[5] / hispanic.sum(),
            "hispanic: two or more races": hispanic[TWO_OR_MORE_FIRST:].sum() / hispanic.sum(),
            "not hispanic two+: white and black (07)": not_hispanic[6]
            / max(not_hispanic[TWO_OR_MORE_FIRST:].sum(), 1),
            "group_quarters_share": gq.sum() / total,
        }
        for (code, _, name), persons in zip(GQ_TYPES, gq, strict=True):
            stats[f"gq type {code} share of gq ({name})"] = persons / max(gq.sum(), 1)
        nonzero = np.concatenate(self.nonzero_cells) if self.nonzero_cells else np.zeros(1)
        stats["nonzero 2,016-cells per populated block"] = float(nonzero.mean())
        return {k: float(v) for k, v in stats.items()}


def perry_statistics(path: Path = PERRY_PPMF) -> dict[str, float]:
    """The validation statistics of the real Perry County PPMF sample."""
    frame = pd.read_csv(path, dtype=str)
    block = pd.factorize(
        frame[["TABBLKST", "TABBLKCOU", "TABTRACT", "TABBLK"]].agg("".join, axis=1)
    )
    summary = PersonSummary.empty()
    summary.add(
        block[0],
        frame["GQTYPE_PL"].astype(int).to_numpy(),
        (frame["VOTING_AGE"] == "2").to_numpy(),
        (frame["CENHISP"] == "2").to_numpy(),
        frame["CENRACE"].astype(int).to_numpy() - 1,
    )
    return summary.statistics()


def providence_statistics(anchors: RaceAnchors) -> dict[str, float]:
    """The statistics the Providence state record has (no ages by race, no blocks)."""
    hispanic, not_hispanic = anchors.hispanic, anchors.not_hispanic
    total = hispanic.sum() + not_hispanic.sum()
    gq = anchors.group_quarters
    stats = {
        "persons": float(total),
        "hispanic_share": hispanic.sum() / total,
        "two_or_more_races_share": (hispanic + not_hispanic)[TWO_OR_MORE_FIRST:].sum() / total,
        "hispanic: white alone": hispanic[0] / hispanic.sum(),
        "hispanic: some other race alone": hispanic[5] / hispanic.sum(),
        "hispanic: two or more races": hispanic[TWO_OR_MORE_FIRST:].sum() / hispanic.sum(),
        "not hispanic two+: white and black (07)": not_hispanic[6]
        / not_hispanic[TWO_OR_MORE_FIRST:].sum(),
        "group_quarters_share": gq.sum() / total,
    }
    for (code, _, name), persons in zip(GQ_TYPES, gq, strict=True):
        stats[f"gq type {code} share of gq ({name})"] = persons / gq.sum()
    return {k: float(v) for k, v in stats.items()}


class ProductionWriter:
    """Writes ``persons/`` and ``spine/`` of each generated state and sums the validation."""

    def __init__(self, output: Path, seed: int) -> None:
        self.persons_dir, self.spine_dir = output / "persons", output / "spine"
        self.seed, self.anchors, self.summary = seed, load_race_anchors(), PersonSummary.empty()

    def write_state(self, state: int, blocks: StateBlocks) -> None:
        for folder in (self.persons_dir, self.spine_dir):
            folder.mkdir(parents=True, exist_ok=True)
        name = f"state_{state:02d}.parquet"
        spine = pa.table({"GEOID": block_geoids(blocks.code)})
        pq.write_table(spine, self.spine_dir / name, compression="zstd")
        writer = None
        for run, persons, table in state_persons(blocks, state, self.seed, self.anchors):
            check_persons(persons, blocks, run)
            self.summary.add_persons(persons)
            if writer is None:
                writer = pq.ParquetWriter(self.persons_dir / name, table.schema, compression="zstd")
            writer.write_table(table.cast(writer.schema))
        assert writer is not None
        writer.close()

    def report(self) -> dict:
        return {
            "persons_columns": list(PERSON_COLUMNS),
            "checks": "passed: persons per block = pop, adults = vap, group-quarters persons as "
            "drawn (nursing capped at the adults), a type for every site, no minors in nursing "
            "facilities",
            "validation": {
                "generated": self.summary.statistics(),
                "Perry County AL PPMF (2010 demo, real)": perry_statistics(),
                "Providence County RI 2018 E2E P.L. (real)": providence_statistics(self.anchors),
            },
            "anchors": {
                "cenrace_not_hispanic_providence": self.anchors.not_hispanic.tolist(),
                "cenrace_hispanic_providence": self.anchors.hispanic.tolist(),
                "gq_persons_by_type_providence": self.anchors.group_quarters.tolist(),
                "gq_site_type_probabilities": self.anchors.site_types.round(4).tolist(),
            },
        }


def production_table(report: dict) -> str:
    """Markdown: the generated persons' statistics beside the real Perry and Providence files."""
    stats = report["validation"]
    names = list(stats)
    keys = list(stats["generated"])
    lines = ["| statistic | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in keys:
        values = [stats[n].get(key) for n in names]
        cells = ["-" if v is None else (f"{v:,.0f}" if v >= 10 else f"{v:.3f}") for v in values]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def generate_production(
    seed: int,
    output: Path | str,
    fraction: float = 1.0,
    *,
    states: Sequence[str] | None = None,
    overwrite: bool = False,
    params: ModelParameters | None = None,
) -> dict:
    """:func:`~censusdp_spark.generate.national.generate_national` (the same blocks), plus
    ``output/persons/`` and ``output/spine/``; metadata.json and README.txt describe both. Returns
    the report, with its ``production`` part."""
    started = time.perf_counter()
    output = Path(output)
    writer = ProductionWriter(output, seed)
    report = generate_national(
        seed, output, fraction, states=states, overwrite=overwrite, params=params or ModelParameters(),
        on_state=writer.write_state,
    )  # fmt: skip
    report.pop("elapsed_s")
    report["production"] = writer.report()
    (output / "metadata.json").write_text(json.dumps(report, indent=2) + "\n")
    (output / "README.txt").write_text(readme_text(report) + production_readme(report))
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    return report


def production_report_text(report: dict) -> str:
    """The printed report of a production generation: the blocks', then the persons'."""
    production = report["production"]
    return "\n".join(
        [
            report_text(report),
            "",
            "SYNTHETIC persons (PPMF layout) against real files:",
            "",
            production_table(production),
            "",
            f"checks {production['checks']}",
        ]
    )


def production_readme(report: dict) -> str:
    """The README.txt part on persons/ and spine/."""
    production = report["production"]
    return f"""
Production schema (censusdp generate national --schema production)
  persons/state_XX.parquet  one SYNTHETIC person per row, PPMF layout: {", ".join(production["persons_columns"])}
                            the input of conf/national_production.toml (--input <this folder>/persons)
  spine/state_XX.parquet    GEOID of every block of the selected states, empty ones included
  Each block's persons are its blocks/ counts; detailed race and group-quarters types are drawn
  from real shares (docstring of censusdp_spark.generate.production).

{production_table(production)}

checks {production["checks"]}
"""
