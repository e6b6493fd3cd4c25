"""P.L. 94-171 redistricting files in the legacy layout, read into checked block tables.

The layout (``io.pl94_layout``) is the Census Bureau's 2020 legacy format (the 2010 files have
the same one): four pipe-delimited text files per state, without a header, holding the same
logical records one a line, in the same order, joined on ``LOGRECNO``:

* the geographic header ``{st}geo{vintage}.pl``: 97 fields;
* segment 1 ``{st}00001{vintage}.pl``: the record key (``FILEID|STUSAB|CHARITER|CIFSN|LOGRECNO``),
  then P1 (race, 71 cells) and P2 (Hispanic or Latino by race, 73);
* segment 2 ``{st}00002{vintage}.pl``: the key, P3 (race, 18 and over, 71), P4 (Hispanic by
  race, 18 and over, 73) and H1 (housing units: total, occupied, vacant);
* segment 3 ``{st}00003{vintage}.pl``: the key, P5 (group-quarters population by type, 10).

:func:`read_legacy` checks the whole file set, every record of every summary level, before it
returns anything; each refusal is one ``InputError`` naming the file, the line (the files have
no header: line 1 is the first record), the column and the rule. It returns the blocks (summary
level 750) with every table cell; ``pl94_layout.TABLES`` says how each derived histogram is
computed from them.

Privacy claim of the geography: the blocks are the geoheader's SUMLEV 750 records, every
tabulation block of the state, populated or not (or, with a spine, the spine's blocks), so the
node set of a release on them is public geography, not a function of the counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial, reduce

import numpy as np
import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from censusdp_spark.io.pl94_layout import (
    BLOCK_DIGITS,
    BLOCK_LEVEL,
    CELLS,
    FIELD_COUNTS,
    GEOHEADER_FIELDS,
    KEYS,
    LOGRECNO_AT,
    RECORD_KEY,
    SEGMENTS,
    SUMMARY_LEVELS,
    TEXT_FIELDS,
    WHOLE,
    Failure,
    LegacyFiles,
    RecordRule,
    file_of,
    first_failures,
    key_field,
    record_rules,
)
from censusdp_spark.io.readers import MAX_COUNT, PARTITION_SHIFT, read_spine
from censusdp_spark.model.config import SpineSpec
from censusdp_spark.model.errors import InputError

WHAT = ("the geographic header", "segment 1", "segment 2", "segment 3")
FILES = 4  # the geoheader, then segments 1-3
PARTITION_KEY = 1 << 31  # (file, partition) -> file * PARTITION_KEY + partition: partitions < 2**31


def read_lines(spark: SparkSession, files: LegacyFiles) -> DataFrame:
    """Every line of the four files: ``file`` (0 the geoheader, 1-3 the segments), ``line``
    (1-based, in the file) and ``f``, its fields (split on ``|``, untrimmed).

    One Spark job: refused in one line if a file is missing or empty, if a line has more or
    fewer fields than its file's layout (the line is named, its text never shown), or if the
    files do not have as many lines. Read as text split on ``|``: the legacy files quote
    nothing, and a quote character in a name field must not merge lines."""
    reads = []
    for n, path in enumerate(files.paths):
        if not path.is_file():
            raise InputError(str(path), "file", "not found")
        text = spark.read.text(str(path.absolute()))
        pos = F.monotonically_increasing_id().alias("pos")
        reads.append(
            text.select(F.lit(n).alias("file"), pos, F.split("value", r"\|", -1).alias("f"))
        )
    lines = reduce(lambda a, b: a.unionByName(b), reads)
    expected = F.element_at(F.array(*[F.lit(k) for k in FIELD_COUNTS]), F.col("file") + 1)
    ragged = F.size("f") != expected
    part = F.shiftright("pos", PARTITION_SHIFT)
    # Per partition of each file's read: its lines, its first ragged line and that line's field
    # count. A file's partitions hold consecutive lines, in order, and ``pos`` has the
    # partition's index above ``PARTITION_SHIFT`` and the line's place in it below; this job and
    # every later one compute ``pos`` on the same plan.
    parts = (
        lines.groupBy("file", part.alias("part"))
        .agg(
            F.count("*").alias("lines"),
            F.min(F.when(ragged, F.col("pos"))).alias("ragged"),
            F.min_by(F.size("f"), F.when(ragged, F.col("pos"))).alias("fields"),
        )
        .collect()
    )
    offsets: dict[int, int] = {}
    counts = [0] * FILES
    for p in sorted(parts, key=lambda p: (p["file"], p["part"])):
        n, index = int(p["file"]), int(p["part"])
        offsets[n * PARTITION_KEY + index] = counts[n]
        if p["ragged"] is not None:
            at = counts[n] + int(p["ragged"]) - (index << PARTITION_SHIFT) + 1
            fields = GEOHEADER_FIELDS if n == 0 else (*RECORD_KEY, *SEGMENTS[n - 1])
            raise InputError(
                str(files.file(n)),
                f"line {at}",
                f"has {p['fields']} fields; {WHAT[n]} of the legacy layout has {FIELD_COUNTS[n]}"
                f" ({fields[0]} ... {fields[-1]})",
            )
        counts[n] += int(p["lines"])
    for n in range(FILES):
        if not counts[n]:
            raise InputError(str(files.file(n)), "lines", "the file is empty")
    for n in (1, 2, 3):
        if counts[n] != counts[0]:
            raise InputError(
                str(files.segment(n)),
                "lines",
                f"{counts[n]} records; the geoheader {files.geoheader} has {counts[0]} (the"
                " four files hold the same logical records, one a line)",
            )
    first_line = F.create_map(*[F.lit(x) for key, o in offsets.items() for x in (key, o)])
    file_part = F.col("file") * PARTITION_KEY + part
    line = first_line[file_part] + F.col("pos") - F.shiftleft(part, PARTITION_SHIFT) + 1
    return lines.select("file", line.alias("line"), "f")


def by_line(lines: DataFrame) -> DataFrame:
    """The four files side by side, one row per line (in one shuffle, without a join): ``line``,
    every file's record keys (``key_field``) and the previous line's LOGRECNO (``PREVIOUS``),
    the geoheader's :data:`TEXT_FIELDS` and ``POP100``, as trimmed text, and ``cells``: every
    table cell of ``CELLS``, in order, as one array of (untrimmed) text. One array, not 301
    columns: Spark plans and compiles a wide row's every expression again in every job."""
    logrecno = F.when(F.col("file") == 0, F.col("f")[LOGRECNO_AT[0]]).otherwise(
        F.col("f")[LOGRECNO_AT[1]]
    )
    previous = lines.select(
        (F.col("file") + FILES).alias("file"),
        (F.col("line") + 1).alias("line"),
        F.array(logrecno).alias("f"),
    )
    gathered = (
        lines.unionByName(previous)
        .groupBy("line")
        .agg(
            *[
                F.first(F.when(F.col("file") == n, F.col("f")), ignorenulls=True).alias(f"f{n}")
                for n in range(2 * FILES)
            ]
        )
        .where(F.col("f0").isNotNull())
    )  # the line after the last has a previous LOGRECNO only

    def field(n: int, name: str) -> Column:
        names = GEOHEADER_FIELDS if n == 0 else (*RECORD_KEY, *SEGMENTS[n - 1])
        return F.trim(F.col(f"f{n}")[names.index(name)])

    keys = [
        field(n, k).alias(key_field(k, n)) for n in range(FILES) for k in KEYS if k != "CIFSN" or n
    ]
    previous_keys = [
        F.trim(F.col(f"f{n + FILES}")[0]).alias(key_field("PREVIOUS", n)) for n in range(FILES)
    ]
    geo = [field(0, c).alias(c) for c in (*TEXT_FIELDS, "POP100")]
    first = len(RECORD_KEY) + 1  # slice is 1-based
    cells = F.concat(*[F.slice(f"f{n}", first, len(SEGMENTS[n - 1])) for n in (1, 2, 3)])
    return gathered.select("line", *keys, *previous_keys, *geo, cells.alias("cells"))


BROKEN = "stage int, line long, order int, file int, column string, rule string"
"""What a batch of the record check reports: its first failure of each stage."""


def _failures_in_batches(
    batches: Iterable[pd.DataFrame], state: str, rules: Sequence[RecordRule]
) -> Iterable[pd.DataFrame]:
    for batch in batches:
        cells = np.array(batch["cells"].tolist(), dtype=object).reshape(len(batch), len(CELLS))
        counts = np.column_stack([cells, batch["POP100"].to_numpy(dtype=object)])
        failures = first_failures(batch, counts, state, rules, MAX_COUNT)
        if failures:
            yield pd.DataFrame([f.__dict__ for f in failures])


def _check_records(records: DataFrame, files: LegacyFiles) -> None:
    """Every rule of every record, in one Spark job, numpy over Arrow batches (some 900 rules
    over 300 cells, which as Spark expressions took minutes to plan and compile): each file's
    record keys first, then the same records in all four files, then the record rules; the
    earliest line of the first stage with a failure is named."""
    rules = record_rules(MAX_COUNT)
    check = partial(_failures_in_batches, state=files.state, rules=rules)
    found = [Failure(**r.asDict()) for r in records.mapInPandas(check, BROKEN).collect()]
    if found:
        first = min(found, key=lambda f: (f.stage, f.line, f.order))
        where = f"line {first.line}, column {first.column}"
        raise InputError(str(files.file(first.file)), where, first.rule)


def _cell(values: str, name: str) -> Column:
    return F.col(values)[CELLS.index(name)]


def _check_blocks(blocks: DataFrame, files: LegacyFiles) -> None:
    """One Spark job: some block (SUMLEV 750), none listed twice, and their persons and housing
    units each total at most ``MAX_COUNT``."""
    totals = ("P0010001", "H0010001")
    first = F.min("line").over(Window.partitionBy("GEOCODE"))
    again = F.when(F.col("line") > first, F.struct("line", "GEOCODE", first.alias("first")))
    found = (
        blocks.select(again.alias("again"), *[_cell("values", c).alias(c) for c in totals])
        .agg(
            F.count("*").alias("blocks"),
            F.min("again").alias("again"),
            *[F.sum(c).alias(c) for c in totals],
        )
        .first()
    )
    assert found is not None
    if not found["blocks"]:
        raise InputError(str(files.geoheader), "SUMLEV", f"no block (SUMLEV {BLOCK_LEVEL})")
    if found["again"] is not None:
        line, geocode, first_line = found["again"]
        raise InputError(
            str(files.geoheader),
            f"line {line}, column GEOCODE",
            f"block {geocode} is listed twice (also on line {first_line})",
        )
    for column in totals:
        if found[column] > MAX_COUNT:
            raise InputError(
                str(files.file(file_of(column))),
                f"column {column}",
                f"the blocks' total above MAX_COUNT = {MAX_COUNT:_} (the largest every stage"
                " of the release holds exactly)",
            )


SUMS = "GEOCODE string, values array<long>"
"""Partial sums of blocks under one geocode."""


def _partial_sums(batches: Iterable[pd.DataFrame], digits: Sequence[int]) -> Iterable[pd.DataFrame]:
    """Per batch of blocks, the sum of their cells under each ancestor's geocode (``digits``)."""
    for batch in batches:
        values = np.array(batch["values"].tolist(), dtype=np.int64).reshape(len(batch), len(CELLS))
        for d in digits:
            sums = pd.DataFrame(values).groupby(batch["GEOCODE"].str[:d].to_numpy()).sum()
            yield pd.DataFrame({"GEOCODE": sums.index, "values": list(sums.to_numpy())})


def _check_summary_levels(
    records: DataFrame, blocks: DataFrame, files: LegacyFiles, levels: Sequence[str]
) -> None:
    """Every record of the summary levels ``levels`` equals the sum of its blocks, cell by cell
    (one Spark job: partial sums per batch of blocks in numpy, added up per geocode)."""
    if not levels:
        return
    digits = [SUMMARY_LEVELS[lv][1] for lv in levels]  # different lengths: no geocode collides
    partial_sums = blocks.select("GEOCODE", "values").mapInPandas(
        partial(_partial_sums, digits=digits), SUMS
    )
    zeros = F.array_repeat(F.lit(0).cast("long"), len(CELLS))
    add = partial(F.zip_with, f=lambda a, b: a + b)
    sums = partial_sums.groupBy("GEOCODE").agg(
        F.aggregate(F.collect_list("values"), zeros, lambda acc, v: add(acc, v)).alias("sums")
    )
    summary = records.where(F.col("SUMLEV").isin(*levels) & (F.col("GEOCOMP") == WHOLE))
    every = summary.select("line", "GEOCODE", "SUMLEV", "values").join(sums, "GEOCODE", "left")
    differs = F.zip_with("values", F.coalesce("sums", zeros), lambda a, b: a != b)
    first = every.select(
        F.struct("line", F.array_position(differs, True).alias("cell"), "SUMLEV").alias("at")
    )
    found = first.where(F.col("at.cell") > 0).agg(F.min("at")).first()
    if found is not None and found[0] is not None:
        line, cell, sumlev = found[0]["line"], CELLS[found[0]["cell"] - 1], found[0]["SUMLEV"]
        raise InputError(
            str(files.file(file_of(cell))),
            f"line {line}, column {cell}",
            f"this {SUMMARY_LEVELS[sumlev][0]} record (SUMLEV {sumlev}) is not the sum of"
            f" its blocks in the file (input.summary_levels checks {sorted(levels)}; a level"
            " whose blocks are not all in the file cannot be checked)",
        )


def read_legacy(
    spark: SparkSession,
    files: LegacyFiles,
    summary_levels: Sequence[str] = tuple(SUMMARY_LEVELS),
    spine: SpineSpec | None = None,
) -> DataFrame:
    """The blocks of a legacy file set: ``geocode`` (15 digits) and ``values``, every table
    cell of ``CELLS`` in order (array of long), one row per block of the geoheader (SUMLEV
    750), or with ``spine`` one per spine block (zero where the geoheader has none).

    Checked first, each refusal one ``InputError`` naming the file, line, column and rule:
    every line's field count and as many lines in every file (``read_lines``); each file's
    FILEID, STUSAB, CIFSN and LOGRECNO in increasing order, the same record on a line in all
    four files, then on every record each count a non-negative integer at most ``MAX_COUNT``,
    the tables' structure, every derived cell and the geocodes (``pl94_layout``); no block
    twice and their totals at most ``MAX_COUNT``; every record of ``summary_levels`` the sum of
    its blocks; with ``spine``, every block on it. Five Spark jobs when the files pass (the
    last materialises the blocks)."""
    records = by_line(read_lines(spark, files)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        _check_records(records, files)
        values = F.transform("cells", lambda v: F.trim(v).cast("long")).alias("values")
        typed = records.select("line", "SUMLEV", "GEOCOMP", "GEOCODE", values)
        blocks = typed.where(F.col("SUMLEV") == BLOCK_LEVEL)
        _check_blocks(blocks, files)
        _check_summary_levels(typed, blocks, files, summary_levels)
        result = blocks.select(F.col("GEOCODE").alias("geocode"), "line", "values")
        if spine is not None:
            result = _on_spine(spark, result, files, spine)
        # Materialised apart from the files' lines, which are then let go: the caller reads
        # the checked blocks without reading and checking the files again.
        checked = result.drop("line").localCheckpoint(eager=True)
    finally:
        records.unpersist()
    return checked


def _on_spine(
    spark: SparkSession, blocks: DataFrame, files: LegacyFiles, spine: SpineSpec
) -> DataFrame:
    """``blocks`` completed to the spine's blocks (zero cells where the geoheader has none);
    refused at the geoheader's first block that is not on the spine."""
    listed = read_spine(spark, spine, BLOCK_DIGITS)
    off = blocks.join(listed, "geocode", "left_anti")
    found = off.agg(F.min("line"), F.min_by("geocode", "line")).first()
    if found is not None and found[0] is not None:
        raise InputError(
            str(files.geoheader),
            f"line {found[0]}, column GEOCODE",
            f"block {found[1]} is not on the spine {spine.path} (every block of the geoheader"
            " must be on it)",
        )
    zeros = F.array_repeat(F.lit(0).cast("long"), len(CELLS))
    return listed.join(blocks, "geocode", "left").select(
        "geocode", F.lit(0).alias("line"), F.coalesce("values", zeros).alias("values")
    )
