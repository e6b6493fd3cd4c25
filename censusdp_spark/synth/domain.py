"""Hierarchical data domain: households (group attributes) holding up to M members.

A household is its group attributes ``G_1 × … × G_kG`` plus M member slots, each holding the
individual attributes ``I_1 × … × I_kI`` of one person or nothing (Liu & Wu, "Private Synthetic
Data with Hierarchical Structure", §2). Present members fill slots ``0 … size−1``; when the
domain declares relationship roles, slot 0 holds the household's one head (householder).

Raw table values are binned to small categorical levels by :class:`Binning` (value lists or
half-open numeric ranges, and a level for blanks), so the same code serves any household/person
table whose columns play the same roles. Encoding is pure pandas/numpy: it runs on the driver
and, unchanged, inside Spark's ``mapInPandas``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from censusdp_spark.model.attribute import Attribute

ABSENT = -1
"""Code of every individual attribute in an empty member slot."""

RELATIONS = ("spouse", "parent", "child")
"""Within-household relations of Q_R: the relative is the person's spouse, parent or child."""


@dataclass(frozen=True)
class Binning:
    """How one raw column becomes level codes.

    ``values`` maps exact raw values (numbers compared as numbers, text as stripped text) to a
    level; ``ranges`` lists ``(low, high, level)`` for ``low <= x < high``. A blank goes to
    ``missing`` (a level) or is unmapped. Exactly one of ``values`` and ``ranges`` is set.
    """

    column: str
    values: Mapping[float | str, int] = field(default_factory=dict)
    ranges: tuple[tuple[float, float, int], ...] = ()
    missing: int | None = None

    def encode(self, raw: pd.Series) -> np.ndarray:
        """Level codes (int16); ``ABSENT`` marks a value no rule maps."""
        codes = np.full(len(raw), ABSENT, dtype=np.int16)
        blank = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
        numeric = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        if self.ranges:
            for low, high, level in self.ranges:
                codes[(numeric >= low) & (numeric < high)] = level
        else:
            text = raw.astype(str).str.strip().to_numpy()
            for value, level in self.values.items():
                hit = numeric == value if isinstance(value, float) else text == value
                codes[hit & ~blank] = level
        if self.missing is not None:
            codes[blank] = self.missing
        return codes


@dataclass(frozen=True)
class BinnedAttribute(Attribute):
    """A categorical attribute read from one raw column, whose values ``binning`` maps to its
    levels."""

    binning: Binning


@dataclass(frozen=True)
class Roles:
    """Which individual attribute holds the relationship to the head, and which levels mean what.

    Every household has exactly one head, kept in slot 0; Q_R relations are defined on the head,
    spouse and child roles (all other levels are dropped from the Q_R restriction).
    """

    attribute: int
    head: int
    spouse: frozenset[int]
    child: frozenset[int]
    max_members: int  # largest head-spouse-child household kept for Q_R

    def role_codes(self, relationship: np.ndarray) -> np.ndarray:
        """0 head, 1 spouse, 2 child, ``ABSENT`` for absent members and other relationships."""
        out = np.full(relationship.shape, ABSENT, dtype=np.int8)
        out[relationship == self.head] = 0
        out[np.isin(relationship, list(self.spouse))] = 1
        out[np.isin(relationship, list(self.child))] = 2
        return out


@dataclass(frozen=True)
class HouseholdDomain:
    group: tuple[BinnedAttribute, ...]
    individual: tuple[BinnedAttribute, ...]
    max_members: int
    roles: Roles | None = None

    @property
    def group_sizes(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.group)

    @property
    def individual_sizes(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.individual)

    def explicit_size(self) -> int:
        """The households MWEM enumerates: every group combination times every member multiset
        of 1..M persons (with roles, exactly one head and M - 1 others at most). A function of
        the config alone, so a domain too large for MWEM is refused before any data is read."""
        d_i = math.prod(self.individual_sizes)
        m = self.max_members
        if self.roles is None:
            sets = sum(math.comb(d_i + r - 1, r) for r in range(1, m + 1))
        else:
            heads = d_i // self.individual_sizes[self.roles.attribute]
            others = d_i - heads
            sets = heads * sum(math.comb(others + r - 1, r) for r in range(m))
        return math.prod(self.group_sizes) * sets


@dataclass(frozen=True)
class Households:
    """Encoded households: ``group`` (N, k_G) and ``members`` (N, M, k_I), ``ABSENT`` when empty."""

    group: np.ndarray
    members: np.ndarray

    def __post_init__(self) -> None:
        if self.group.ndim != 2 or self.members.ndim != 3 or len(self.group) != len(self.members):
            raise ValueError("group must be (N, k_G) and members (N, M, k_I) with the same N")
        if self.members.shape[2] == 0:
            raise ValueError("members need at least one individual attribute")

    @property
    def n_households(self) -> int:
        return int(self.group.shape[0])

    @property
    def max_members(self) -> int:
        return int(self.members.shape[1])

    @property
    def present(self) -> np.ndarray:
        return self.members[:, :, 0] != ABSENT

    @property
    def sizes(self) -> np.ndarray:
        return self.present.sum(axis=1)

    @property
    def n_individuals(self) -> int:
        return int(self.present.sum())

    def take(self, rows: np.ndarray) -> Households:
        return Households(self.group[rows], self.members[rows])


@dataclass(frozen=True)
class Encoded:
    """The result of encoding raw tables, with what was dropped or could not be mapped."""

    households: Households
    dropped_oversize: int  # households with more than M members (dropped, as the config says)
    bad_head: int  # households without exactly one head (an input error when roles are declared)
    unmapped: dict[str, int]  # attribute name -> values no binning rule maps (an input error)
    unmapped_examples: dict[str, list[str]]


def encode_joined(
    domain: HouseholdDomain, frame: pd.DataFrame, household_id: str, order: str
) -> Encoded:
    """Encode person rows that carry their household's columns (one row per person).

    Members keep the order of ``order`` within a household, except that the head moves to slot 0
    when roles are declared. Households larger than M are dropped and counted.
    """
    numeric_order = pd.to_numeric(frame[order], errors="coerce")
    sort_key = numeric_order if numeric_order.notna().all() else frame[order].astype(str)
    frame = frame.assign(_order=sort_key.to_numpy()).sort_values(
        [household_id, "_order"], kind="stable"
    )
    ids = frame[household_id].to_numpy()
    starts = (
        np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        if len(ids)
        else np.zeros(0, dtype=np.int64)
    )
    sizes = np.diff(np.r_[starts, len(ids)])
    unmapped: dict[str, int] = {}
    examples: dict[str, list[str]] = {}

    def codes(attr: BinnedAttribute, rows: pd.DataFrame) -> np.ndarray:
        raw = rows[attr.binning.column]
        out = attr.binning.encode(raw)
        bad = out == ABSENT
        if bad.any():
            unmapped[attr.name] = unmapped.get(attr.name, 0) + int(bad.sum())
            examples[attr.name] = sorted({str(v) for v in raw[bad].head(50)})[:3]
        return out

    first = frame.iloc[starts]
    group = (
        np.stack([codes(a, first) for a in domain.group], axis=1)
        if domain.group
        else np.zeros((len(starts), 0), np.int16)
    )
    person = np.stack([codes(a, frame) for a in domain.individual], axis=1)
    keep = sizes <= domain.max_members
    n = len(starts)
    slot = np.arange(len(ids)) - np.repeat(starts, sizes)
    household = np.repeat(np.arange(n), sizes)
    bad_head = 0
    if domain.roles is not None:
        is_head = person[:, domain.roles.attribute] == domain.roles.head
        heads = np.bincount(household, weights=is_head, minlength=n).astype(np.int64)
        bad_head = int(((heads != 1) & keep).sum())
        # Head first, then the others in their original order.
        head_slot = np.full(n, -1)
        head_slot[household[is_head]] = slot[is_head]
        hs = head_slot[household]
        slot = np.where(is_head, 0, np.where((hs >= 0) & (slot < hs), slot + 1, slot))
    members = np.full((n, domain.max_members, len(domain.individual)), ABSENT, dtype=np.int16)
    fits = keep[household]
    members[household[fits], slot[fits]] = person[fits]
    return Encoded(
        Households(group[keep], members[keep]),
        dropped_oversize=int((~keep).sum()),
        bad_head=bad_head,
        unmapped=unmapped,
        unmapped_examples=examples,
    )


def encode_tables(
    domain: HouseholdDomain,
    households: pd.DataFrame,
    persons: pd.DataFrame,
    household_id: str,
    order: str,
) -> Encoded:
    """Encode a household table and a person table linked by ``household_id``."""
    group_columns = list(dict.fromkeys(a.binning.column for a in domain.group))
    person_columns = list(
        dict.fromkeys([household_id, order, *(a.binning.column for a in domain.individual)])
    )
    joined = persons[person_columns].merge(
        households[[household_id, *group_columns]],
        on=household_id,
        how="inner",
        validate="many_to_one",
    )
    return encode_joined(domain, joined, household_id, order)


def decode(
    domain: HouseholdDomain, households: Households, first_id: int = 1
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Households back to two tables of level names: households and persons (1-based ``member``)."""
    ids = np.arange(first_id, first_id + households.n_households, dtype=np.int64)
    present = households.present
    house = {"household_id": ids, "members": present.sum(axis=1).astype(np.int32)}
    for j, a in enumerate(domain.group):
        house[a.name] = np.asarray(a.levels, dtype=object)[households.group[:, j]]
    rows, slots = np.nonzero(present)
    person: dict[str, np.ndarray] = {
        "household_id": ids[rows],
        "member": (slots + 1).astype(np.int32),
    }
    for j, a in enumerate(domain.individual):
        person[a.name] = np.asarray(a.levels, dtype=object)[households.members[rows, slots, j]]
    return pd.DataFrame(house), pd.DataFrame(person)
