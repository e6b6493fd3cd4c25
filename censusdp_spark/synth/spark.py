"""Spark side of the synthetic-data job: read and link the two tables, answer workloads on the
cluster, write the synthetic tables to Delta.

Workload answers on a cluster (for inputs too large for one machine): person rows carrying their
household's columns are repartitioned by household, so every household lies in one partition;
``mapInPandas`` runs the same encoding (:func:`censusdp_spark.synth.domain.encode_joined`) and the
same vectorised answering code (:func:`censusdp_spark.synth.workloads.count_answers`) on each
partition and emits its non-zero partial counts; a ``groupBy`` sums them (the answers are additive
over households). Only these sums, never a person record, reach the driver.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.io import delta
from censusdp_spark.io.readers import RowRule, enforce_rules, read_table, row_number_of
from censusdp_spark.model.errors import InputError
from censusdp_spark.synth.config import SynthInput
from censusdp_spark.synth.domain import BinnedAttribute, Binning, HouseholdDomain, encode_joined
from censusdp_spark.synth.workloads import Totals, WorkloadSet, count_answers, totals_of

PARTIAL_SCHEMA = "key string, index long, count long"
_QUERY = "q"


@dataclass(frozen=True)
class WorkloadCounts:
    """Summed counts of every query, the public totals, and the households left out for being
    larger than M (only when the config drops them; the input was checked by
    :func:`check_linked_rows` before)."""

    counts: np.ndarray
    totals: Totals
    dropped_oversize: int


def binning_hits(binning: Binning, levels: Collection[int]) -> Column:
    """True where the raw column maps to one of ``levels``: the rules of
    :meth:`censusdp_spark.synth.domain.Binning.encode`, as a Spark expression."""
    raw = F.col(binning.column)
    text = F.trim(raw.cast("string"))
    blank = raw.isNull() | (text == "")
    number = text.try_cast("double")
    hit = F.lit(False)
    for low, high, level in binning.ranges:
        if level in levels:
            hit = hit | ((number >= low) & (number < high))
    numbers = [v for v, level in binning.values.items() if level in levels and isinstance(v, float)]
    texts = [v for v, level in binning.values.items() if level in levels and isinstance(v, str)]
    if numbers:
        hit = hit | number.isin(numbers)
    if texts:
        hit = hit | text.isin(texts)
    hit = F.coalesce(hit & ~blank, F.lit(False))
    return hit | blank if binning.missing in levels else hit


def _domain_rules(attributes: Sequence[BinnedAttribute]) -> list[RowRule]:
    return [
        RowRule(
            ~binning_hits(a.binning, range(a.size)),
            a.binning.column,
            f"value outside the declared domain of {a.name!r} (no level, range or 'missing' "
            "of the config maps it)",
        )
        for a in attributes
    ]


def _refuse_key(df: DataFrame, source: Path, key_column: str, bad: DataFrame, rule: str) -> None:
    """If ``bad`` (a frame of keys) has a row, raise naming the first row of ``df`` with its key."""
    hit = bad.limit(1).collect()
    if hit:
        key = hit[0][key_column]
        row = row_number_of(df, F.col(key_column) == key)
        raise InputError(
            str(source), f"row {row}, column {key_column}", rule.format(key=key, **hit[0].asDict())
        )


def _refuse_duplicate_persons(persons: DataFrame, spec: SynthInput) -> None:
    """A person is one row: its household id and member order together identify it, so a row
    repeated (a duplicated non-head person passes every per-household rule) is refused."""
    hid, order = spec.household_id, spec.member_order
    hit = persons.groupBy(hid, order).count().filter("count > 1").limit(1).collect()
    if hit:
        key, member, n = hit[0][hid], hit[0][order], hit[0]["count"]
        row = row_number_of(persons, F.col(hid).eqNullSafe(key) & F.col(order).eqNullSafe(member))
        raise InputError(
            str(spec.persons),
            f"row {row}, column {hid}+{order}",
            f"person {member!r} of household {key!r} appears {n} times ({hid} and {order}"
            " together identify a person: one row each)",
        )


def check_linked_rows(
    households: DataFrame, persons: DataFrame, spec: SynthInput, domain: HouseholdDomain
) -> None:
    """Refuse, naming file, row and rule: values outside the declared domain, a household id
    twice, a person of a missing household, a household without persons, a person listed twice
    (same household id and member order), a household larger
    than M (unless the config drops them) and, with roles, a household without exactly one
    head. One Spark job per rule set; nothing is written before the input has passed."""
    hid = spec.household_id
    enforce_rules(households, str(spec.households), _domain_rules(domain.group))
    enforce_rules(persons, str(spec.persons), _domain_rules(domain.individual))
    ids = households.select(hid)
    _refuse_key(
        households,
        spec.households,
        hid,
        households.groupBy(hid).count().filter("count > 1"),
        "household id {key!r} appears {count} times",
    )
    _refuse_key(
        persons,
        spec.persons,
        hid,
        persons.select(hid).join(ids, hid, "left_anti"),
        "person of household {key!r}, which is missing from the household table",
    )
    _refuse_key(
        households,
        spec.households,
        hid,
        ids.join(persons.select(hid), hid, "left_anti"),
        "household {key!r} has no person",
    )
    _refuse_duplicate_persons(persons, spec)
    m = domain.max_members
    heads = (
        F.count_if(
            binning_hits(domain.individual[domain.roles.attribute].binning, {domain.roles.head})
        )
        if domain.roles is not None
        else F.lit(1)
    )
    per_household = persons.groupBy(hid).agg(F.count("*").alias("n"), heads.alias("heads"))
    if not spec.drop_larger:
        _refuse_key(
            households,
            spec.households,
            hid,
            per_household.filter(F.col("n") > m),
            "household {key!r} has {n} persons, more than input.max_members = "
            f'{m} (set input.larger_households = "drop" to leave such households out)',
        )
    if domain.roles is not None:
        rel = domain.individual[domain.roles.attribute]
        _refuse_key(
            persons,
            spec.persons,
            hid,
            per_household.filter((F.col("n") <= m) & (F.col("heads") != 1)),
            "household {key!r} has {heads} members of "
            f"{rel.name} = {rel.levels[domain.roles.head]!r} (column {rel.binning.column}); "
            "every household needs exactly one",
        )


def read_linked(spark: SparkSession, spec: SynthInput, domain: HouseholdDomain) -> DataFrame:
    """Person rows with their household's group columns, every column a string, one partition
    per group of households. Raises ``InputError`` for missing columns or any row that breaks a
    rule of :func:`check_linked_rows`."""
    households = read_table(spark, spec.households, spec.format)
    persons = read_table(spark, spec.persons, spec.format)
    group_cols = list(dict.fromkeys(a.binning.column for a in domain.group))
    person_cols = list(
        dict.fromkeys(
            [spec.household_id, spec.member_order, *(a.binning.column for a in domain.individual)]
        )
    )
    for df, path, cols in (
        (households, spec.households, [spec.household_id, *group_cols]),
        (persons, spec.persons, person_cols),
    ):
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise InputError(str(path), "header", f"missing column(s) {missing}")
    households = households.select(
        *[F.col(c).cast("string") for c in [spec.household_id, *group_cols]]
    )
    persons = persons.select(*[F.col(c).cast("string") for c in person_cols])
    check_linked_rows(households, persons, spec, domain)
    person_only = [c for c in person_cols if c != spec.household_id]
    joined = persons.join(
        households.select(spec.household_id, *[c for c in group_cols if c not in person_only]),
        spec.household_id,
    )
    return joined.repartition(F.col(spec.household_id))


def workload_counts(
    linked: DataFrame,
    domain: HouseholdDomain,
    workloads: WorkloadSet,
    household_id: str,
    member_order: str,
) -> WorkloadCounts:
    """Counts of every query of ``workloads`` on the linked person rows, summed over partitions."""

    def partial(batches: Iterable[pd.DataFrame]) -> Iterable[pd.DataFrame]:
        frames = list(batches)
        if not frames or not sum(len(f) for f in frames):
            return
        encoded = encode_joined(
            domain, pd.concat(frames, ignore_index=True), household_id, member_order
        )
        counts = count_answers(encoded.households, domain, workloads)
        hit = np.flatnonzero(counts)
        totals = totals_of(encoded.households, domain)
        extra = {
            "households": totals.households,
            "individuals": totals.individuals,
            "family_individuals": totals.family_individuals,
            "dropped_oversize": encoded.dropped_oversize,
        }
        yield pd.DataFrame(
            {
                "key": [_QUERY] * len(hit) + list(extra),
                "index": np.r_[hit, np.zeros(len(extra), dtype=np.int64)].astype(np.int64),
                "count": np.r_[counts[hit], list(extra.values())].astype(np.int64),
            }
        )

    summed = (
        linked.mapInPandas(partial, schema=PARTIAL_SCHEMA)
        .groupBy("key", "index")
        .agg(F.sum("count").alias("count"))
        .collect()
    )
    counts = np.zeros(workloads.n_queries)
    scalars: dict[str, int] = {}
    for row in summed:
        if row["key"] == _QUERY:
            counts[row["index"]] = row["count"]
        else:
            scalars[row["key"]] = int(row["count"])
    totals = Totals(
        scalars.get("households", 0),
        scalars.get("individuals", 0),
        scalars.get("family_individuals", 0),
    )
    return WorkloadCounts(counts, totals, scalars.get("dropped_oversize", 0))


def write_frames(spark: SparkSession, frames: dict[str, pd.DataFrame], output: Path) -> None:
    """Each pandas table as its own Delta table under ``output`` (one transaction each)."""
    for name, frame in frames.items():
        delta.write_table(spark.createDataFrame(frame), output, name)


def measurements_frame(rows: list[tuple[int, str, np.ndarray]]) -> pd.DataFrame:
    """``round, workload, cell, noisy``: every noisy measurement the run made (releasable)."""
    parts = [
        pd.DataFrame(
            {"round": r, "workload": label, "cell": np.arange(len(v), dtype=np.int64), "noisy": v}
        )
        for r, label, v in rows
    ]
    return pd.concat(parts, ignore_index=True)
