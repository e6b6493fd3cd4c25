"""Read a release's input into sparse block histograms, validating every rule at the door.

Output: one row per leaf (block) ``geocode: string, cells: array<int>, counts: array<long>``
holding the non-zero cells in increasing order; zero-population blocks have empty arrays.
Every violation raises ``InputError`` naming the file, the row (1-based data row, in file
order) or column, and the rule; nothing is written before the input has passed.

With a spine (``[geography] spine``, :func:`on_spine`) the rows are exactly the spine's blocks.
Privacy claim: the released geography (every level's node set, hence every noise group and the
order of its nodes in their keyed stream, ``topdown.measure``) is then a function of the public
spine alone. Without one, record-level input makes a node of a block only if someone lives
there, so the released block list would tell which blocks are populated (outside the DP
guarantee), and one block gaining or losing its only resident would shift the noise of every
other node of its noise group. On neighbouring inputs (one record more or less) on a spine the
node sets are equal, every node draws its noise at the same place in the same stream, and the
measurement's sensitivity argument holds unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType
from pyspark.sql.utils import AnalysisException

from censusdp_spark.model.config import SpineSpec
from censusdp_spark.model.errors import InputError

INTEGER = r"^\s*[0-9]+\s*$"  # a non-negative integer, as text

MAX_COUNT = 10**9
"""The largest count an input may hold: in any cell of any row, in any cell expression, and as
the input's total over all rows and cells (which bounds every node's value at every level).

Why this bound: every later stage holds it exactly. Counts are int64 in Spark and Delta; the
microdata writer repeats a block's cell count as a 32-bit int (2**31 - 1 > 10**9); the least
squares and rounding solvers work in float64, where 10**9 and every sum of such values below
2**53 are exact, and their 1e-9 integrality tolerance needs values whose float64 spacing is far
below it (at 10**9 it is 1.2e-7 of a unit count; a block of 10**12 people left the solvers
unable to round its children consistently). The US population is about 3.3 * 10**8."""


class GeocodeSpec(Protocol):
    """What the geocode checks need of a table's spec (an input's or the spine's)."""

    @property
    def path(self) -> Path: ...

    @property
    def format(self) -> str: ...

    @property
    def geocode_columns(self) -> tuple[str, ...]: ...


class ColumnSpec(GeocodeSpec, Protocol):
    """What the shared column checks need of an input spec."""

    @property
    def ignore(self) -> tuple[str, ...]: ...

    def used_columns(self) -> tuple[str, ...]: ...


def read_table(spark: SparkSession, path: Path, fmt: str) -> DataFrame:
    """Read CSV or pipe-delimited text (header, every column as a string), Parquet or Delta;
    clear errors if unreadable. A text row with more or fewer fields than the header is refused
    (:func:`refuse_ragged_rows`), so no value is dropped or shifted into another column."""
    source = str(path)
    if not path.exists():
        raise InputError(source, "file", "not found")
    where = str(path.absolute())  # a Spark Connect server resolves paths from its own folder
    try:
        if fmt in ("csv", "pipe"):
            return _read_text(spark, where, "|" if fmt == "pipe" else ",", source)
        elif fmt == "parquet":
            df = spark.read.parquet(where)
        else:
            df = spark.read.format("delta").load(where)
        df.schema  # noqa: B018 - forces the footer/log read so corrupt files fail here
    except AnalysisException as err:
        raise InputError(
            source, "file", f"unreadable as {fmt}: {str(err).splitlines()[0]}"
        ) from None
    except InputError:
        raise
    except Exception as err:  # Py4J errors from a corrupt file surface as generic exceptions
        raise InputError(
            source, "file", f"unreadable as {fmt}: {str(err).splitlines()[0][:300]}"
        ) from None
    return df


MALFORMED = "_censusdp_malformed_row"
"""The column Spark fills with a text row's raw line when its fields do not match the header."""


def _read_text(spark: SparkSession, where: str, sep: str, source: str) -> DataFrame:
    """Text with a header, every column a string; refused if a row is ragged.

    Why an explicit schema: Spark's CSV reader parses only the columns a query uses, so on a
    header-inferred read a row with an extra field (an unquoted separator inside an ignored text
    column, say) is accepted with every later value shifted one column on, and ``FAILFAST`` never
    sees it. With the header's columns plus a corrupt-record column as the schema, a query that
    reads every column (:func:`refuse_ragged_rows`) marks each row whose field count differs."""
    reader = (
        spark.read.option("header", True)
        .option("sep", sep)
        .option("inferSchema", False)
        .option("mode", "FAILFAST")
    )
    columns = reader.csv(where).columns
    if not columns:  # an empty file: no header to compare rows with
        return reader.csv(where)
    if MALFORMED in columns:
        raise InputError(source, f"column {MALFORMED}", "reserved for the reader's own use")
    schema = StructType([StructField(c, StringType()) for c in [*columns, MALFORMED]])
    parsed = (
        reader.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", MALFORMED)
        .csv(where)
    )
    refuse_ragged_rows(parsed, columns, sep, source)
    return parsed.drop(MALFORMED)


def refuse_ragged_rows(parsed: DataFrame, columns: list[str], sep: str, source: str) -> None:
    """Raise naming the first data row (1-based, in file order) with more or fewer fields than
    the header's ``columns``; one Spark job when there is none. The row's text is never shown:
    it is respondents' data."""
    malformed = F.col(MALFORMED).isNotNull()
    # Spark compares a row's field count with the columns its query reads, so each query here
    # reads them all (a hash of the whole row, kept as an output the optimiser cannot drop).
    whole_row = F.xxhash64(*[parsed[c] for c in columns])
    check = parsed.agg(F.count_if(malformed).alias("ragged"), F.max(whole_row)).first()
    if check is None or not check["ragged"]:
        return
    # Parse the raw line again with one field more than the header: is that field there?
    wider = ", ".join(f"f{i} string" for i in range(len(columns) + 1))
    more = F.from_csv(F.col(MALFORMED), wider, {"sep": sep})[f"f{len(columns)}"].isNotNull()
    flags = parsed.select(
        F.monotonically_increasing_id().alias("pos"),
        malformed.alias("bad"),
        F.struct(more.alias("more"), whole_row.alias("row")).alias("value"),
    )
    row, value = _first_flagged(flags)
    if value["more"]:
        rule = (
            f"has more fields than the header's {len(columns)} (an unquoted {sep!r} inside a"
            " value? quote such values)"
        )
    else:
        rule = f"has fewer fields than the header's {len(columns)}"
    raise InputError(source, f"row {row}", rule)


# ``monotonically_increasing_id`` puts the partition index above this bit and the row's place
# within its partition below it (documented in pyspark.sql.functions).
PARTITION_SHIFT = 33


def row_number_of(df: DataFrame, condition: Column) -> int:
    """1-based data-row position, in file order, of the first row matching ``condition``."""
    pos = F.monotonically_increasing_id().alias("pos")
    row, _ = _first_flagged(df.select(pos, condition.alias("bad"), F.lit(0).alias("value")))
    return row


def _first_flagged(flags: DataFrame) -> tuple[int, Any]:
    """``(row, value)`` of the first ``bad`` row of ``pos, bad, value`` rows, ``pos`` being the
    ``monotonically_increasing_id`` of the rows as read; ``row`` is 1-based, in file order.

    One Spark job and DataFrame functions only (it runs over Spark Connect): per partition of the
    read, its row count and its first match; the rows of earlier partitions come first."""
    first = F.when(F.col("bad"), F.col("pos"))
    per_partition = (
        flags.groupBy(F.shiftright("pos", PARTITION_SHIFT).alias("partition"))
        .agg(
            F.count("*").alias("rows"),
            F.min(first).alias("first"),
            F.min_by("value", first).alias("value"),
        )
        .collect()
    )
    before = 0
    for part in sorted(per_partition, key=lambda r: r["partition"]):
        if part["first"] is not None:
            offset = int(part["first"]) - (int(part["partition"]) << PARTITION_SHIFT)
            return before + offset + 1, part["value"]
        before += int(part["rows"])
    raise RuntimeError("row_number_of: no row matches the condition")


@dataclass(frozen=True)
class RowRule:
    """A rule every row must keep: ``broken`` is true on a row that breaks it. With ``shown``,
    the refusal adds ``describe`` of that column's value on the first row breaking it."""

    broken: Column
    column: str
    rule: str
    shown: Column | None = None
    describe: Callable[[Any], str] = repr

    def violations(self) -> Column:
        """The number of rows breaking the rule (an aggregate)."""
        return F.count_if(self.broken)

    def refusal(self, df: DataFrame, source: str) -> InputError:
        """The error naming the first row of ``df`` (in file order) breaking the rule."""
        if self.shown is None:
            row, text = row_number_of(df, self.broken), self.rule
        else:
            pos = F.monotonically_increasing_id().alias("pos")
            flags = df.select(pos, self.broken.alias("bad"), self.shown.alias("value"))
            row, value = _first_flagged(flags)
            text = f"{self.rule}; {self.describe(value)}"
        return InputError(source, f"row {row}, column {self.column}", text)


@dataclass(frozen=True)
class UniqueGeocodes:
    """The rule that no two rows share a ``geocode``, checked among row rules in
    :func:`enforce_rules`'s one job; a refusal names the geocode columns of ``spec``."""

    spec: GeocodeSpec

    def violations(self) -> Column:
        """The number of rows repeating an earlier row's geocode (an aggregate)."""
        return F.count("geocode") - F.count_distinct("geocode")

    def refusal(self, df: DataFrame, source: str) -> InputError:
        """The error naming a repeated geocode at its first row (``df`` has a repeat)."""
        error = duplicate_geocode(df, source, self.spec.geocode_columns)
        assert error is not None
        return error


@dataclass(frozen=True)
class NonEmpty:
    """The rule that the table has a row, checked first among :func:`enforce_rules`'s rules
    (on a table without rows every other rule holds); a refusal says ``what`` is empty."""

    what: str

    def violations(self) -> Column:
        """1 if the table has no row, else 0 (an aggregate)."""
        return (F.count(F.lit(1)) == 0).cast("int")

    def refusal(self, df: DataFrame, source: str) -> InputError:
        return InputError(source, "rows", f"{self.what} is empty")


def enforce_rules(
    df: DataFrame,
    source: str,
    rules: Sequence[RowRule | UniqueGeocodes | NonEmpty],
    total: Column | None = None,
) -> None:
    """Check all rules in one Spark job; raise for the first rule broken, at its first row.
    With ``total`` (a count per row), the same job also refuses an input whose sum of it over
    all rows is above ``MAX_COUNT``."""
    if not rules and total is None:
        return
    aggregates = [r.violations().alias(f"r{i}") for i, r in enumerate(rules)]
    if total is not None:  # decimal: a sum of longs must not overflow before it is compared
        aggregates.append(F.sum(total.cast("decimal(38,0)")).alias("total"))
    counts = df.agg(*aggregates).first()
    assert counts is not None
    for i, rule in enumerate(rules):
        if counts[f"r{i}"]:
            raise rule.refusal(df, source)
    if total is not None and (counts["total"] or 0) > MAX_COUNT:
        raise InputError(
            source,
            "rows",
            f"the counts total above MAX_COUNT = {MAX_COUNT:_} (the largest every stage of the"
            " release holds exactly)",
        )


def count_rules(column: str, what: str = "count") -> list[RowRule]:
    """A count column's rules: a non-negative integer, and at most ``MAX_COUNT`` (so also one
    that fits in int64: a cast after these rules cannot fail)."""
    text = F.trim(F.col(column).cast("string"))
    integer = text.isNotNull() & text.rlike(INTEGER)
    value = text.try_cast("long")  # null past int64
    return [
        RowRule(~integer, column, f"{what} must be a non-negative integer"),
        RowRule(
            integer & (value.isNull() | (value > MAX_COUNT)),
            column,
            f"{what} above MAX_COUNT = {MAX_COUNT:_} (the largest every stage of the release"
            " holds exactly)",
        ),
    ]


def check_columns(df: DataFrame, spec: ColumnSpec) -> None:
    """Refuse a header without every column the config names, or with a column it neither uses
    nor ignores: one message listing every missing column, then every unused one."""
    present = set(df.columns)
    missing = [c for c in dict.fromkeys(spec.used_columns()) if c not in present]
    extra = [c for c in df.columns if c not in {*spec.used_columns(), *spec.ignore}]
    problems = []
    if missing:
        problems.append((_columns(missing), "missing (named in the config's [input])"))
    if extra:
        them = "it" if len(extra) == 1 else "them"
        problems.append(
            (_columns(extra), f"not used by the config; list {them} in input.ignore if intended")
        )
    if problems:
        (where, rule), *more = problems
        raise InputError(str(spec.path), where, "; ".join([rule, *(f"{w}: {r}" for w, r in more)]))


def _columns(names: Sequence[str]) -> str:
    """``column a`` or ``columns a, b, c``: every name, in order."""
    return f"column {names[0]}" if len(names) == 1 else f"columns {', '.join(names)}"


def geocode_of(spec: GeocodeSpec) -> Column:
    parts = [F.trim(F.col(c).cast("string")) for c in spec.geocode_columns]
    return F.concat(*parts) if len(parts) > 1 else parts[0]


def geocode_rule(spec: GeocodeSpec, digits: int) -> RowRule:
    """Every row's geocode (:func:`geocode_of`: its columns trimmed and joined, nothing padded)
    is exactly ``digits`` digits; a refusal shows the geocode it built."""
    geo = F.col("geocode")
    columns = "+".join(spec.geocode_columns)
    joined = len(spec.geocode_columns) > 1

    def describe(built: str | None) -> str:
        if built is None:
            return f"{'a column of ' if joined else ''}{columns} is empty"
        if not joined:
            return f"got {built!r} ({len(built)} characters)"
        return (
            f"built {built!r} ({len(built)} characters) from {columns} joined as written"
            " (nothing is padded: give each column its leading zeros)"
        )

    return RowRule(
        geo.isNull() | ~geo.rlike(rf"^[0-9]{{{digits}}}$"),
        columns,
        f"geocode must be exactly {digits} digits",
        shown=geo,
        describe=describe,
    )


def check_unique_geocodes(df: DataFrame, spec: GeocodeSpec) -> None:
    error = duplicate_geocode(df, str(spec.path), spec.geocode_columns)
    if error is not None:
        raise error


def duplicate_geocode(df: DataFrame, source: str, columns: Sequence[str]) -> InputError | None:
    """The error naming a geocode of ``df`` listed twice, at its first row (its geocode built
    from ``columns``); None if none is."""
    dup = df.groupBy("geocode").count().filter("count > 1").limit(1).collect()
    if not dup:
        return None
    code = dup[0]["geocode"]
    row = row_number_of(df, F.col("geocode") == code)
    name = "+".join(columns)
    return InputError(source, f"row {row}, column {name}", f"duplicate geocode {code}")


def read_checked(spark: SparkSession, spec: ColumnSpec) -> DataFrame:
    """The input table of ``spec``, refused if a column is missing or unlisted, or if it is empty."""
    raw = read_with_columns_checked(spark, spec)
    if not raw.limit(1).collect():
        raise NonEmpty("the input").refusal(raw, str(spec.path))
    return raw


def read_with_columns_checked(spark: SparkSession, spec: ColumnSpec) -> DataFrame:
    """The input table of ``spec``, refused if a column is missing or unlisted; its reader
    refuses an empty one in its rules' job (``NonEmpty("the input")`` first)."""
    raw = read_table(spark, spec.path, spec.format)
    check_columns(raw, spec)
    return raw


def nonzero_cells(values: Sequence[tuple[int, Column]]) -> list[Column]:
    """``cells, counts`` of a row from its ``(cell, count column)`` pairs: the non-zero cells
    only, in the pairs' order, computed within the row (no shuffle)."""
    pairs = F.array(*[F.struct(F.lit(c).alias("cell"), v.alias("count")) for c, v in values])
    nonzero = F.filter(pairs, lambda s: s["count"] > 0)
    return [
        F.transform(nonzero, lambda s: s["cell"]).alias("cells"),
        F.transform(nonzero, lambda s: s["count"]).alias("counts"),
    ]


def read_spine(spark: SparkSession, spine: SpineSpec, digits: int) -> DataFrame:
    """``geocode``, one row per spine leaf. Refused, naming the spine file and its row, if a
    geocode is not exactly ``digits`` digits or is listed twice; or if a geocode column is
    missing or the spine is empty. The file's other columns are not read."""
    source = str(spine.path)
    raw = read_table(spark, spine.path, spine.format)
    for col in spine.geocode_columns:
        if col not in raw.columns:
            raise InputError(
                source, f"column {col}", "missing (named in [geography] spine.geocode)"
            )
    df = raw.select(geocode_of(spine).alias("geocode"))
    enforce_rules(
        df, source, [NonEmpty("the spine"), geocode_rule(spine, digits), UniqueGeocodes(spine)]
    )
    return df


def on_spine(
    spark: SparkSession, leaves: DataFrame, spec: GeocodeSpec, spine: SpineSpec, digits: int
) -> DataFrame:
    """``leaves`` (``geocode, cells, counts``) completed to the spine: one row per spine leaf,
    empty arrays where no record falls. A record whose leaf is not on the spine is refused at
    its first row in the input file (in file order)."""
    blocks = read_spine(spark, spine, digits)
    if leaves.join(blocks, "geocode", "left_anti").limit(1).collect():
        raise _off_spine(spark, spec, blocks, spine)
    empty = {c: F.array().cast(leaves.schema[c].dataType) for c in ("cells", "counts")}
    return blocks.join(leaves, "geocode", "left").select(
        "geocode", *[F.coalesce(F.col(c), e).alias(c) for c, e in empty.items()]
    )


def _off_spine(
    spark: SparkSession, spec: GeocodeSpec, blocks: DataFrame, spine: SpineSpec
) -> InputError:
    """The error for the first input row (in file order) whose leaf is not on the spine."""
    pos = F.monotonically_increasing_id().alias("pos")
    rows = read_table(spark, spec.path, spec.format).select(geocode_of(spec).alias("geocode"), pos)
    on_spine = blocks.select("geocode", F.lit(True).alias("on_spine"))  # geocodes are unique
    flags = rows.join(on_spine, "geocode", "left").select(
        "pos", F.col("on_spine").isNull().alias("bad"), F.col("geocode").alias("value")
    )
    row, geocode = _first_flagged(flags)
    return InputError(
        str(spec.path),
        f"row {row}, column {'+'.join(spec.geocode_columns)}",
        f"geocode {geocode} is not on the spine {spine.path}"
        " (every record must fall in a leaf of the spine)",
    )
