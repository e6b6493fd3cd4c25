"""Hierarchical query workloads and their vectorised answers on encoded households.

A *workload* is every value combination of a set of attributes for one query class (the unit
that is selected and measured, Liu et al. 2021's "marginal trick"):

* ``Q_G`` (group level): the fraction of households whose group attributes take values ``g`` on
  ``S_G`` and that have at least one member whose individual attributes take values ``c`` on
  ``S_I``. Normaliser N_G.
* ``Q_I`` (individual level): the fraction of individuals with values ``c`` on ``S_I`` living in
  a household with values ``g`` on ``S_G``. Normaliser N_I.
* ``Q_R`` (within-household relationships, on the head–spouse–child restriction): the fraction of
  (restricted) individuals with ``g`` and ``c`` who have at least one spouse / parent / child with
  values ``b`` on ``S_rel``. Normaliser N_R, the number of restricted individuals.
* ``size``: the household-size histogram (fraction of households with 1 … M members).

Q_G, Q_I and size are what the methods measure (sensitivities in :mod:`.adaptive`). Q_R is an
evaluation workload: one person's change moves the indicators of up to M_R members of the
household (the person and each relative), so Δ₁ ≤ M_R/N_R per query, and N_R itself moves when a
relationship changes; it is answered on the synthetic tables, never measured.

Cells are numbered in C order over (group attributes, person attributes, relative attributes),
each in attribute order. Answers here are *counts*; :func:`normalise` divides by the totals.
Every function is additive over households, so partial counts from disjoint parts of the data
(Spark partitions) sum to the counts of the whole.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from censusdp_spark.synth.domain import ABSENT, RELATIONS, HouseholdDomain, Households, Roles

GROUP = "Q_G"
INDIVIDUAL = "Q_I"
RELATIONSHIP = "Q_R"
SIZE = "size"
KINDS = (GROUP, INDIVIDUAL, RELATIONSHIP, SIZE)


@dataclass(frozen=True, kw_only=True)
class Workload:
    kind: str
    group: tuple[int, ...]  # group attribute indices (S_G)
    person: tuple[int, ...]  # individual attribute indices of the person (S_I)
    relative: tuple[int, ...]  # individual attribute indices of the relative (S_rel, Q_R only)
    relation: str  # spouse / parent / child for Q_R, else ""
    shape: tuple[int, ...]  # axis sizes in cell order
    label: str

    @property
    def n_cells(self) -> int:
        return math.prod(self.shape)

    @property
    def n_group(self) -> int:
        return math.prod(self.shape[: len(self.group)])

    @property
    def n_person(self) -> int:
        return math.prod(self.shape[len(self.group) : len(self.group) + len(self.person)])

    @property
    def n_relative(self) -> int:
        return math.prod(self.shape[len(self.group) + len(self.person) :])


def make_workload(
    domain: HouseholdDomain,
    kind: str,
    group: Sequence[int] = (),
    person: Sequence[int] = (),
    relative: Sequence[int] = (),
    relation: str = "",
) -> Workload:
    if kind not in KINDS:
        raise ValueError(f"unknown workload kind {kind!r}")
    if kind == SIZE:
        return Workload(
            kind=SIZE,
            group=(),
            person=(),
            relative=(),
            relation="",
            shape=(domain.max_members,),
            label="size",
        )
    if (kind == RELATIONSHIP) != bool(relation) or (relation and relation not in RELATIONS):
        raise ValueError(f"a Q_R workload needs a relation in {RELATIONS}; others none")
    g, p, r = tuple(group), tuple(person), tuple(relative)
    shape = (
        *(domain.group[j].size for j in g),
        *(domain.individual[j].size for j in p),
        *(domain.individual[j].size for j in r),
    )
    label = (
        f"{kind}:"
        + ",".join(domain.group[j].name for j in g)
        + "|"
        + ",".join(domain.individual[j].name for j in p)
    )
    if kind == RELATIONSHIP:
        label += f"|{relation}:" + ",".join(domain.individual[j].name for j in r)
    return Workload(
        kind=kind, group=g, person=p, relative=r, relation=relation, shape=shape, label=label
    )


@dataclass(frozen=True)
class WorkloadSet:
    """Workloads laid end to end in one flat answer vector."""

    workloads: tuple[Workload, ...]
    offsets: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", np.cumsum([0, *(w.n_cells for w in self.workloads)]))

    def __len__(self) -> int:
        return len(self.workloads)

    @property
    def n_queries(self) -> int:
        return int(self.offsets[-1])

    def cells(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    def of_kind(self, kind: str) -> np.ndarray:
        """Boolean mask over the flat vector: the queries of one class."""
        mask = np.zeros(self.n_queries, dtype=bool)
        for i, w in enumerate(self.workloads):
            if w.kind == kind:
                mask[self.cells(i)] = True
        return mask

    def __add__(self, other: WorkloadSet) -> WorkloadSet:
        return WorkloadSet(self.workloads + other.workloads)


def marginal_workloads(
    domain: HouseholdDomain, degree: int, kinds: Iterable[str] = (GROUP, INDIVIDUAL)
) -> WorkloadSet:
    """Q_G and Q_I over every set of ``degree`` attributes (group and individual mixed)."""
    attrs = [("g", j) for j in range(len(domain.group))] + [
        ("i", j) for j in range(len(domain.individual))
    ]
    out = []
    for kind in kinds:
        for subset in itertools.combinations(attrs, degree):
            group = [j for side, j in subset if side == "g"]
            person = [j for side, j in subset if side == "i"]
            out.append(make_workload(domain, kind, group, person))
    return WorkloadSet(tuple(out))


def relationship_workloads(domain: HouseholdDomain, degree: int) -> WorkloadSet:
    """Q_R over every (S_G, S_I, S_rel) with |S_G| + |S_I| + |S_rel| = degree and S_rel non-empty.

    S_I and S_rel range over the individual attributes other than the relationship itself (the
    relation already fixes the roles) and may share attributes, e.g. "graduate degree and married
    to someone with a graduate degree". Grouped by (relation, S_rel), the order answers use.
    """
    if domain.roles is None:
        return WorkloadSet(())
    people = [j for j in range(len(domain.individual)) if j != domain.roles.attribute]
    groups = range(len(domain.group))
    out = []
    for relation in RELATIONS:
        for n_rel in range(1, degree + 1):
            for relative in itertools.combinations(people, n_rel):
                for n_group in range(degree - n_rel + 1):
                    for group in itertools.combinations(groups, n_group):
                        for person in itertools.combinations(people, degree - n_rel - n_group):
                            out.append(
                                make_workload(
                                    domain, RELATIONSHIP, group, person, relative, relation
                                )
                            )
    return WorkloadSet(tuple(out))


def size_workload(domain: HouseholdDomain) -> WorkloadSet:
    return WorkloadSet((make_workload(domain, SIZE),))


# --- answers on data -------------------------------------------------------------------------


@dataclass(frozen=True)
class Totals:
    """The normalisers: N_G, N_I and N_R (individuals in the head–spouse–child restriction)."""

    households: int
    individuals: int
    family_individuals: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.households + other.households,
            self.individuals + other.individuals,
            self.family_individuals + other.family_individuals,
        )


def flat_index(codes: np.ndarray, attrs: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """C-order cell index of ``codes[..., attrs]``; ``ABSENT`` where any code is absent."""
    index = np.zeros(codes.shape[:-1], dtype=np.int64)
    absent = np.zeros(codes.shape[:-1], dtype=bool)
    for j in attrs:
        column = codes[..., j].astype(np.int64)
        absent |= column == ABSENT
        index = index * sizes[j] + column
    if attrs:
        index[absent] = ABSENT
    return index


def distinct_per_row(index: np.ndarray) -> np.ndarray:
    """Each row's distinct non-absent values, the repeats and absents replaced by ``ABSENT``."""
    s = np.sort(np.where(index == ABSENT, np.iinfo(np.int64).max, index), axis=-1)
    repeat = np.zeros(s.shape, dtype=bool)
    repeat[..., 1:] = s[..., 1:] == s[..., :-1]
    return np.where(repeat | (s == np.iinfo(np.int64).max), ABSENT, s)


@dataclass(frozen=True)
class Family:
    """The head–spouse–child restriction: role codes (0 head, 1 spouse, 2 child, ``ABSENT``)."""

    households: Households
    roles: np.ndarray  # (N, M_R)


def restrict_to_family(households: Households, roles: Roles) -> Family:
    """Keep head, spouse and child members; drop households with more than ``roles.max_members``."""
    role = roles.role_codes(households.members[:, :, roles.attribute])
    role[~households.present] = ABSENT
    kept = role != ABSENT
    keep_rows = kept.sum(axis=1) <= roles.max_members
    role, kept = role[keep_rows], kept[keep_rows]
    members = households.members[keep_rows]
    # Compact the kept members to the front, in their order (the head stays in slot 0).
    order = np.argsort(~kept, axis=1, kind="stable")[:, : roles.max_members]
    rows = np.arange(len(order))[:, None]
    new_members = members[rows, order]
    new_role = role[rows, order]
    new_members[new_role == ABSENT] = ABSENT
    return Family(Households(households.group[keep_rows], new_members), new_role)


def related(role: np.ndarray, relation: str) -> np.ndarray:
    """(N, M, M) mask: member j is the ``relation`` (spouse/parent/child) of member i."""
    ri, rj = role[:, :, None], role[:, None, :]
    if relation == "spouse":
        return ((ri == 0) & (rj == 1)) | ((ri == 1) & (rj == 0))
    if relation == "parent":
        return (ri == 2) & ((rj == 0) | (rj == 1))
    if relation == "child":
        return ((ri == 0) | (ri == 1)) & (rj == 2)
    raise ValueError(f"unknown relation {relation!r}")


class _Cache:
    """Per-household cell indices shared by the workloads that need the same attribute set."""

    def __init__(self, households: Households, domain: HouseholdDomain) -> None:
        self.h = households
        self.gsizes = domain.group_sizes
        self.isizes = domain.individual_sizes
        self._group: dict[tuple[int, ...], np.ndarray] = {}
        self._person: dict[tuple[int, ...], np.ndarray] = {}
        self._distinct: dict[tuple[int, ...], np.ndarray] = {}

    def group(self, attrs: tuple[int, ...]) -> np.ndarray:
        if attrs not in self._group:
            self._group[attrs] = flat_index(self.h.group, attrs, self.gsizes)
        return self._group[attrs]

    def person(self, attrs: tuple[int, ...]) -> np.ndarray:
        """(N, M) person cells; absent members are ``ABSENT`` even when ``attrs`` is empty."""
        if attrs not in self._person:
            index = flat_index(self.h.members, attrs, self.isizes)
            self._person[attrs] = np.where(self.h.present, index, ABSENT)
        return self._person[attrs]

    def distinct(self, attrs: tuple[int, ...]) -> np.ndarray:
        if attrs not in self._distinct:
            self._distinct[attrs] = distinct_per_row(self.person(attrs))
        return self._distinct[attrs]


def _bincount(cells: np.ndarray, valid: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(cells[valid], minlength=n).astype(np.float64)


def count_answers(
    households: Households, domain: HouseholdDomain, workloads: WorkloadSet
) -> np.ndarray:
    """Counts of every query (unnormalised), vectorised per workload."""
    out = np.zeros(workloads.n_queries)
    cache = _Cache(households, domain)
    family_cache: _Cache | None = None
    family: Family | None = None
    pairs: dict[tuple[str, tuple[int, ...]], _RelativeCells] = {}
    relation_pairs: dict[str, tuple[np.ndarray, ...]] = {}
    for i, w in enumerate(workloads.workloads):
        target = out[workloads.cells(i)]
        if w.kind == SIZE:
            target[:] = np.bincount(households.sizes - 1, minlength=w.n_cells)[: w.n_cells]
        elif w.kind in (GROUP, INDIVIDUAL):
            g = cache.group(w.group)[:, None]
            c = cache.distinct(w.person) if w.kind == GROUP else cache.person(w.person)
            target[:] = _bincount(g * w.n_person + c, c != ABSENT, w.n_cells)
        else:
            if domain.roles is None:
                raise ValueError("Q_R workloads need [relationships] in the config")
            if family is None:
                family = restrict_to_family(households, domain.roles)
                family_cache = _Cache(family.households, domain)
            assert family_cache is not None
            key = (w.relation, w.relative)
            if key not in pairs:
                if w.relation not in relation_pairs:
                    relation_pairs[w.relation] = np.nonzero(related(family.roles, w.relation))
                pairs = {
                    key: _RelativeCells(
                        relation_pairs[w.relation], family_cache, w.relative, w.n_relative
                    )
                }
            rc = pairs[key]
            cells = (
                rc.group(w.group) * w.n_person + rc.person(w.person)
            ) * w.n_relative + rc.relative
            target[:] = np.bincount(cells, minlength=w.n_cells)
    return out


class _RelativeCells:
    """For one (relation, S_rel): each person once per distinct relative cell, with the person's
    group and own cells gathered once per attribute set (Q_R workloads come grouped this way)."""

    def __init__(
        self,
        pairs: tuple[np.ndarray, ...],
        cache: _Cache,
        relative: tuple[int, ...],
        n_relative: int,
    ) -> None:
        rows, slots, other = pairs
        m = cache.h.max_members
        key = np.unique((rows * m + slots) * n_relative + cache.person(relative)[rows, other])
        person, self.relative = np.divmod(key, n_relative)
        self.rows, self.slots = np.divmod(person, m)
        self.cache = cache
        self._group: dict[tuple[int, ...], np.ndarray] = {}
        self._person: dict[tuple[int, ...], np.ndarray] = {}

    def group(self, attrs: tuple[int, ...]) -> np.ndarray:
        if attrs not in self._group:
            self._group[attrs] = self.cache.group(attrs)[self.rows]
        return self._group[attrs]

    def person(self, attrs: tuple[int, ...]) -> np.ndarray:
        if attrs not in self._person:
            self._person[attrs] = self.cache.person(attrs)[self.rows, self.slots]
        return self._person[attrs]


def totals_of(households: Households, domain: HouseholdDomain) -> Totals:
    family = 0
    if domain.roles is not None:
        family = int((restrict_to_family(households, domain.roles).roles != ABSENT).sum())
    return Totals(households.n_households, households.n_individuals, family)


def denominators(workloads: WorkloadSet, totals: Totals) -> np.ndarray:
    """Per query: N_G for Q_G and size, N_I for Q_I, N_R for Q_R."""
    by_kind = {GROUP: totals.households, SIZE: totals.households, INDIVIDUAL: totals.individuals}
    by_kind[RELATIONSHIP] = totals.family_individuals
    per_workload = np.array(
        [max(by_kind[w.kind], 1) for w in workloads.workloads], dtype=np.float64
    )
    return np.repeat(per_workload, np.diff(workloads.offsets))


def normalise(counts: np.ndarray, workloads: WorkloadSet, totals: Totals) -> np.ndarray:
    return counts / denominators(workloads, totals)


def answers(households: Households, domain: HouseholdDomain, workloads: WorkloadSet) -> np.ndarray:
    """Normalised answers (fractions) of every query on these households."""
    return normalise(
        count_answers(households, domain, workloads), workloads, totals_of(households, domain)
    )
