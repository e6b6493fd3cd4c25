"""A small household domain and random households in it, for the synthesisers' numpy cores."""

from __future__ import annotations

import numpy as np

from censusdp_spark.synth.domain import (
    ABSENT,
    BinnedAttribute,
    Binning,
    HouseholdDomain,
    Households,
    Roles,
)

HEAD, SPOUSE, CHILD, OTHER = range(4)
"""The codes of the ``rel`` attribute of ``small_domain``."""


def attribute(name: str, n: int) -> BinnedAttribute:
    return BinnedAttribute(name, tuple(f"{name}{i}" for i in range(n)), Binning(name))


def small_domain(max_members: int = 4, family_max: int = 3) -> HouseholdDomain:
    """Tenure (2) and vehicles (3) per household; relationship (4), sex (2) and age (3) per
    member, the first attribute the relationship."""
    group = (attribute("tenure", 2), attribute("vehicles", 3))
    individual = (attribute("rel", 4), attribute("sex", 2), attribute("age", 3))
    roles = Roles(0, HEAD, frozenset({SPOUSE}), frozenset({CHILD}), family_max)
    return HouseholdDomain(group, individual, max_members, roles)


def random_households(domain: HouseholdDomain, n: int, seed: int) -> Households:
    """``n`` households of random sizes, each headed by its first member."""
    rng = np.random.default_rng(seed)
    m = domain.max_members
    group = np.stack([rng.integers(0, s, n) for s in domain.group_sizes], axis=1).astype(np.int16)
    members = np.stack(
        [rng.integers(0, s, (n, m)) for s in domain.individual_sizes], axis=2
    ).astype(np.int16)
    members[:, 0, 0] = HEAD
    members[:, 1:, 0] = rng.integers(1, 4, (n, m - 1))
    size = rng.integers(1, m + 1, n)
    members[np.arange(m)[None, :] >= size[:, None]] = ABSENT
    return Households(group, members)
