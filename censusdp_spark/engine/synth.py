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

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from censusdp_spark.io import delta
from censusdp_spark.io.readers import read_table
from censusdp_spark.model.errors import InputError
from censusdp_spark.synth.config import SynthInput
from censusdp_spark.synth.domain import HouseholdDomain, encode_joined
from censusdp_spark.synth.workloads import Totals, WorkloadSet, count_answers, totals_of

PARTIAL_SCHEMA = "key string, index long, count long, example string"
_QUERY = "q"


@dataclass(frozen=True)
class WorkloadCounts:
    """Summed counts of every query, the public totals, and what the encoding dropped or missed."""

    counts: np.ndarray
    totals: Totals
    dropped_oversize: int
    bad_head: int
    unmapped: dict[str, int] = field(default_factory=dict)
    unmapped_examples: dict[str, str] = field(default_factory=dict)


def read_linked(spark: SparkSession, spec: SynthInput, domain: HouseholdDomain) -> DataFrame:
    """Person rows with their household's group columns, every column a string, one partition
    per group of households. Raises ``InputError`` for missing columns or unlinked rows."""
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
    # One job checks the link: every household id once, with at least one person; no orphan.
    link = (
        households.groupBy(spec.household_id)
        .count()
        .withColumnRenamed("count", "h")
        .join(
            persons.groupBy(spec.household_id).count().withColumnRenamed("count", "p"),
            spec.household_id,
            "full_outer",
        )
        .filter("h IS NULL OR p IS NULL OR h > 1")
        .limit(1)
        .collect()
    )
    if link:
        key, h, p = link[0][spec.household_id], link[0]["h"], link[0]["p"]
        if h is None:
            raise InputError(
                str(spec.persons),
                f"column {spec.household_id}",
                f"person of unknown household {key!r}",
            )
        if p is None:
            raise InputError(
                str(spec.households),
                f"column {spec.household_id}",
                f"household {key!r} has no person",
            )
        raise InputError(
            str(spec.households),
            f"column {spec.household_id}",
            f"household id {key!r} appears {h} times",
        )
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
            "bad_head": encoded.bad_head,
        }
        keys = [_QUERY] * len(hit) + list(extra) + [f"unmapped:{a}" for a in encoded.unmapped]
        index = np.r_[hit, np.zeros(len(extra) + len(encoded.unmapped), dtype=np.int64)]
        values = np.r_[counts[hit], list(extra.values()), list(encoded.unmapped.values())].astype(
            np.int64
        )
        examples = [""] * (len(hit) + len(extra)) + [
            ", ".join(encoded.unmapped_examples[a]) for a in encoded.unmapped
        ]
        yield pd.DataFrame(
            {"key": keys, "index": index.astype(np.int64), "count": values, "example": examples}
        )

    summed = (
        linked.mapInPandas(partial, schema=PARTIAL_SCHEMA)
        .groupBy("key", "index")
        .agg(F.sum("count").alias("count"), F.max("example").alias("example"))
        .collect()
    )
    counts = np.zeros(workloads.n_queries)
    scalars: dict[str, int] = {}
    examples: dict[str, str] = {}
    for row in summed:
        if row["key"] == _QUERY:
            counts[row["index"]] = row["count"]
        else:
            scalars[row["key"]] = int(row["count"])
            examples[row["key"]] = row["example"] or ""
    totals = Totals(
        scalars.get("households", 0),
        scalars.get("individuals", 0),
        scalars.get("family_individuals", 0),
    )
    unmapped = {k.split(":", 1)[1]: v for k, v in scalars.items() if k.startswith("unmapped:")}
    return WorkloadCounts(
        counts,
        totals,
        scalars.get("dropped_oversize", 0),
        scalars.get("bad_head", 0),
        unmapped,
        {k.split(":", 1)[1]: v for k, v in examples.items() if k.startswith("unmapped:")},
    )


def check_encoding(result: WorkloadCounts, domain: HouseholdDomain, spec: SynthInput) -> None:
    """Refuse input the config cannot represent: unmapped values, households without one head."""
    for name, n in sorted(result.unmapped.items()):
        attr = next(a for a in (*domain.group, *domain.individual) if a.name == name)
        source = spec.households if attr in domain.group else spec.persons
        raise InputError(
            str(source),
            f"column {attr.binning.column}",
            f"{n} value(s) map to no level of {name!r} "
            f"(e.g. {result.unmapped_examples.get(name, '')}); "
            "add them to the config's levels/ranges or name a 'missing' level",
        )
    if result.bad_head:
        assert domain.roles is not None
        rel = domain.individual[domain.roles.attribute]
        head = rel.levels[domain.roles.head]
        raise InputError(
            str(spec.persons),
            f"column {rel.binning.column}",
            f"{result.bad_head} household(s) do not have exactly one {head!r}",
        )
    if result.totals.households == 0:
        raise InputError(
            str(spec.households), "rows", f"no household of at most {domain.max_members} members"
        )


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
