"""Hierarchical workloads: vectorised answers against a per-household loop, and the encoding."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.synth.domain import (
    ABSENT,
    BinnedAttribute,
    Binning,
    HouseholdDomain,
    Households,
    Roles,
    encode_tables,
)
from censusdp_spark.synth.product import ProductMixture, expected_answers
from censusdp_spark.synth.workloads import (
    GROUP,
    INDIVIDUAL,
    RELATIONSHIP,
    SIZE,
    marginal_workloads,
    relationship_workloads,
    restrict_to_family,
    size_workload,
    totals_of,
)
from censusdp_spark.synth.workloads import answers as workload_answers
from tests.helpers.synth import CHILD, HEAD, OTHER, SPOUSE, random_households, small_domain


def brute_force(domain: HouseholdDomain, h: Households, workloads) -> np.ndarray:
    """Every query answered by looping over households, members and cells."""
    out = []
    roles = domain.roles
    n_i = h.n_individuals
    family_size = lambda row: sum(1 for m in row if m[0] in (HEAD, SPOUSE, CHILD))  # noqa: E731
    kept = [
        i
        for i in range(h.n_households)
        if family_size(h.members[i][h.present[i]]) <= roles.max_members
    ]
    n_r = sum(family_size(h.members[i][h.present[i]]) for i in kept)
    for w in workloads.workloads:
        if w.kind == SIZE:
            out += [float(np.mean(h.present.sum(axis=1) == s + 1)) for s in range(w.n_cells)]
            continue
        for cell in itertools.product(*(range(s) for s in w.shape)):
            g = dict(zip(w.group, cell[: len(w.group)], strict=True))
            c = dict(zip(w.person, cell[len(w.group) : len(w.group) + len(w.person)], strict=True))
            b = dict(zip(w.relative, cell[len(w.group) + len(w.person) :], strict=True))

            def matches(code_row, want):
                return all(code_row[j] == v for j, v in want.items())

            total = 0
            for i in range(h.n_households):
                members = [m for m in h.members[i] if m[0] != ABSENT]
                if not matches(h.group[i], g):
                    continue
                if w.kind == GROUP:
                    total += any(matches(m, c) for m in members)
                elif w.kind == INDIVIDUAL:
                    total += sum(matches(m, c) for m in members)
                elif i in kept:
                    family = [m for m in members if m[0] in (HEAD, SPOUSE, CHILD)]
                    for a, pa in enumerate(family):
                        if not matches(pa, c):
                            continue
                        relatives = [
                            pb
                            for k, pb in enumerate(family)
                            if k != a and is_related(pa[0], pb[0], w.relation)
                        ]
                        total += any(matches(pb, b) for pb in relatives)
            denominator = {GROUP: h.n_households, INDIVIDUAL: n_i, RELATIONSHIP: n_r}[w.kind]
            out.append(total / denominator)
    return np.array(out)


def is_related(a: int, b: int, relation: str) -> bool:
    """b is the ``relation`` of a (by relationship to the head)."""
    if relation == "spouse":
        return {a, b} == {HEAD, SPOUSE}
    if relation == "parent":
        return a == CHILD and b in (HEAD, SPOUSE)
    return a in (HEAD, SPOUSE) and b == CHILD


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_group_individual_and_size_answers_match_a_per_household_loop(degree):
    domain = small_domain()
    h = random_households(domain, 40, seed=degree)
    workloads = marginal_workloads(domain, degree) + size_workload(domain)
    np.testing.assert_allclose(
        workload_answers(h, domain, workloads), brute_force(domain, h, workloads)
    )


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_relationship_answers_match_a_per_household_loop(degree):
    domain = small_domain()
    h = random_households(domain, 40, seed=10 + degree)
    workloads = relationship_workloads(domain, degree)
    np.testing.assert_allclose(
        workload_answers(h, domain, workloads), brute_force(domain, h, workloads)
    )


def test_workload_enumeration_covers_every_three_way_set_and_value():
    domain = small_domain()
    workloads = marginal_workloads(domain, 3)
    assert len(workloads) == 2 * math.comb(5, 3)
    assert workloads.n_queries == 2 * sum(
        math.prod(s)
        for s in itertools.combinations((*domain.group_sizes, *domain.individual_sizes), 3)
    )
    rel = relationship_workloads(domain, 3)
    assert all(
        w.relative and domain.roles.attribute not in (*w.person, *w.relative) for w in rel.workloads
    )
    assert {w.relation for w in rel.workloads} == {"spouse", "parent", "child"}


def test_family_restriction_keeps_head_spouse_children_and_drops_large_households():
    domain = small_domain(max_members=4, family_max=2)
    members = np.full((2, 4, 3), ABSENT, dtype=np.int16)
    members[0, :3] = [
        [HEAD, 0, 0],
        [OTHER, 1, 1],
        [CHILD, 0, 2],
    ]  # head, other, child -> head, child
    members[1, :3] = [[HEAD, 0, 0], [SPOUSE, 1, 1], [CHILD, 0, 2]]  # three family members > 2
    family = restrict_to_family(Households(np.zeros((2, 2), np.int16), members), domain.roles)
    assert family.households.n_households == 1
    assert family.roles.tolist() == [[0, 2]]
    assert family.households.members[0, 1, 2] == 2


def test_expected_answers_of_a_one_hot_mixture_equal_the_households_answers():
    domain = small_domain()
    h = random_households(domain, 25, seed=3)
    workloads = (
        marginal_workloads(domain, 2) + marginal_workloads(domain, 3) + size_workload(domain)
    )
    one_hot = lambda codes, n: np.eye(n)[np.maximum(codes, 0)]  # noqa: E731
    mix = ProductMixture(
        [one_hot(h.group[:, j], s) for j, s in enumerate(domain.group_sizes)],
        np.eye(domain.max_members)[h.sizes - 1],
        [one_hot(h.members[:, :, j].T, s) for j, s in enumerate(domain.individual_sizes)],
    )
    totals = totals_of(h, domain)
    expected = expected_answers(mix, workloads, totals.households / totals.individuals)
    np.testing.assert_allclose(expected, workload_answers(h, domain, workloads), atol=1e-12)


def test_encoding_bins_values_moves_the_head_first_and_drops_oversize_households():
    domain = HouseholdDomain(
        (
            BinnedAttribute(
                "income", ("low", "high"), Binning("INC", ranges=((-1e9, 50.0, 0), (50.0, 1e9, 1)))
            ),
        ),
        (
            BinnedAttribute(
                "rel",
                ("head", "spouse", "child", "other"),
                Binning("REL", values={0.0: 0, 1.0: 1, 2.0: 2, 3.0: 3}),
            ),
            BinnedAttribute(
                "school", ("no", "yes"), Binning("SCH", values={1.0: 0, 2.0: 1}, missing=0)
            ),
        ),
        max_members=2,
        roles=Roles(0, 0, frozenset({1}), frozenset({2}), 2),
    )
    households = pd.DataFrame({"ID": ["a", "b", "c"], "INC": ["10", "75", "3"]})
    persons = pd.DataFrame(
        {
            "ID": ["a", "a", "b", "c", "c", "c"],
            "ORD": ["1", "2", "1", "1", "2", "3"],
            "REL": ["2", "0", "0", "0", "1", "2"],
            "SCH": ["2", "", "1", "1", "1", "1"],
        }
    )
    encoded = encode_tables(domain, households, persons, "ID", "ORD")
    assert encoded.dropped_oversize == 1 and encoded.bad_head == 0 and not encoded.unmapped
    h = encoded.households
    assert h.group[:, 0].tolist() == [0, 1]
    assert h.members[0].tolist() == [[0, 0], [2, 1]]  # the head (blank school -> "no") moved first
    assert h.members[1].tolist() == [[0, 0], [ABSENT, ABSENT]]


def test_encoding_reports_unmapped_values_and_households_without_one_head():
    domain = HouseholdDomain(
        (),
        (BinnedAttribute("rel", ("head", "other"), Binning("REL", values={0.0: 0, 1.0: 1})),),
        max_members=3,
        roles=Roles(0, 0, frozenset(), frozenset(), 3),
    )
    persons = pd.DataFrame({"ID": ["a", "a", "b"], "ORD": [1, 2, 1], "REL": ["1", "7", "0"]})
    encoded = encode_tables(domain, pd.DataFrame({"ID": ["a", "b"]}), persons, "ID", "ORD")
    assert encoded.unmapped == {"rel": 1} and encoded.unmapped_examples == {"rel": ["7"]}
    assert encoded.bad_head == 1


# Hand-built households: (tenure, vehicles, members as (rel, sex, age)). Sizes 1, 2, 3 and M = 4,
# empty slots after the last member, an "other" relative (outside Q_R's restriction) and a family
# of four (head, spouse, two children: over family_max = 3, so out of Q_R).
HAND_BUILT = [
    (0, 0, [(HEAD, 0, 1)]),
    (1, 2, [(HEAD, 1, 2), (SPOUSE, 0, 2)]),
    (1, 1, [(HEAD, 0, 1), (CHILD, 1, 0), (OTHER, 1, 2)]),
    (0, 2, [(HEAD, 1, 1), (SPOUSE, 0, 1), (CHILD, 0, 0), (CHILD, 1, 0)]),
    (0, 1, [(HEAD, 1, 2), (CHILD, 1, 1), (CHILD, 0, 0), (OTHER, 0, 2)]),
    (1, 0, [(HEAD, 0, 2), (SPOUSE, 1, 2), (CHILD, 0, 1)]),
]
ROLE = {HEAD: "head", SPOUSE: "spouse", CHILD: "child"}


def hand_built_tables(domain: HouseholdDomain) -> tuple[Households, pd.DataFrame]:
    """The households encoded, and one pandas row per person with its household's columns."""
    group = np.array([[t, v] for t, v, _ in HAND_BUILT], dtype=np.int16)
    members = np.full((len(HAND_BUILT), domain.max_members, 3), ABSENT, dtype=np.int16)
    rows = []
    for i, (tenure, vehicles, people) in enumerate(HAND_BUILT):
        members[i, : len(people)] = people
        for slot, (rel, sex, age) in enumerate(people):
            rows.append(
                {"hh": i, "slot": slot, "tenure": tenure, "vehicles": vehicles}
                | {"rel": rel, "sex": sex, "age": age}
            )
    return Households(group, members), pd.DataFrame(rows)


def pandas_answers(domain: HouseholdDomain, people: pd.DataFrame, workloads) -> np.ndarray:
    """Each workload answered with pandas joins and group-bys on the person rows."""
    names = [a.name for a in domain.group], [a.name for a in domain.individual]
    n_g, n_i = people["hh"].nunique(), len(people)
    family = people[people["rel"].isin(ROLE)]
    family = family[family.groupby("hh")["hh"].transform("size") <= domain.roles.max_members]
    pairs = family.merge(family, on=["hh", "tenure", "vehicles"], suffixes=("", "_r"))
    pairs = pairs[pairs["slot"] != pairs["slot_r"]]
    out = []
    for w in workloads.workloads:
        g = [names[0][j] for j in w.group]
        p = [names[1][j] for j in w.person]
        r = [names[1][j] + "_r" for j in w.relative]
        if w.kind == GROUP:  # households (counted once) with a member in the cell
            counts = people.drop_duplicates(["hh", *g, *p]).groupby([*g, *p]).size()
            denominator = n_g
        elif w.kind == INDIVIDUAL:
            counts = people.groupby([*g, *p]).size()
            denominator = n_i
        else:
            rel, rel_r = pairs["rel"].map(ROLE), pairs["rel_r"].map(ROLE)
            wanted = {
                "spouse": rel.isin(["head", "spouse"]) & rel_r.isin(["head", "spouse"]),
                "parent": (rel == "child") & rel_r.isin(["head", "spouse"]),
                "child": rel.isin(["head", "spouse"]) & (rel_r == "child"),
            }[w.relation]
            related = pairs[wanted].drop_duplicates(["hh", "slot", *r])
            counts = related.groupby([*g, *p, *r]).size()
            denominator = len(family)
        cells = list(itertools.product(*(range(s) for s in w.shape)))
        index = pd.MultiIndex.from_tuples(cells) if len(w.shape) > 1 else [c[0] for c in cells]
        out.append(counts.reindex(index, fill_value=0).to_numpy() / denominator)
    return np.concatenate(out)


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_answers_on_hand_built_households_equal_pandas_joins_and_group_bys(degree):
    domain = small_domain(max_members=4, family_max=3)
    households, people = hand_built_tables(domain)
    assert sorted(households.sizes.tolist()) == [1, 2, 3, 3, 4, 4]  # sizes 1 and M, empty slots
    workloads = marginal_workloads(domain, degree) + relationship_workloads(domain, degree)
    np.testing.assert_allclose(
        workload_answers(households, domain, workloads),
        pandas_answers(domain, people, workloads),
        atol=1e-15,
    )
