"""SYNTHETIC block-level inputs for the whole 2020 United States, on the real tract spine.

What this module promises
-------------------------
* **Only the spine is real.** The 84,414 tracts of the 50 states and DC and their 2020
  populations come from ``data/tracts_2020_population.csv`` beside this module (provenance:
  ``data/spine/README.md`` of the source tree).
  Every block group, block, race/age count and household below the tract is invented, and every
  output says SYNTHETIC.
* **Exact tallies.** With every state selected (``fraction = 1``) the output has 51 states, 3,143
  counties, 84,414 tracts, 239,780 block groups and 8,132,968 blocks (the 2020 census tallies),
  and the block populations of each tract add up to its real population exactly.
* **Consistent counts.** Per block, the eight race/ethnicity columns (non-Hispanic races plus
  Hispanic, mutually exclusive) add up to ``pop``, the eight ``vap_*`` columns to ``vap``, and
  ``vap_x <= pop_x``. The household columns ``hh_size_1 .. hh_size_7plus`` satisfy
  ``sum(s * hh_size_s) <= pop`` with 7+ counted as 7; blocks with ``pop == 0`` have no households.
  These rules are checked on every state before it is written.
* **Real geocode shape.** The 15-digit block GEOID is the 11-digit tract GEOID, the block-group
  digit (1..9) and three digits numbering the blocks of the block group, so GEOID prefixes of
  2/5/11/12 digits are state/county/tract/block group, as in the real files. Hence at most 9
  block groups per tract and 1,000 blocks per block group.
* **Deterministic.** The same seed gives byte-identical Parquet files. The national layout (block
  groups and blocks per tract) is drawn for the whole country first, then each state draws from
  its own stream, so a state's file is the same whichever other states are selected.

The model, in the order it is drawn (tuning in :class:`ModelParameters`)
-------------------------------------------------------------------------
1. Block groups per tract: :func:`apportion` 239,780 over the tracts (1 to 9 each), in
   proportion to tract population times lognormal noise. Each block group's population target is
   a Dirichlet share of its tract.
2. Blocks per block group: :func:`apportion` 8,132,968 over the block groups (1 to 1,000 each),
   in proportion to sqrt(block-group population target) times a rurality factor (counties with
   few tracts are rural: more, emptier blocks) and lognormal tract and block-group noise.
3. Empty blocks: a block is empty with a probability falling logistically in log10(persons per
   block of its block group), centred so that 28% of the nation's blocks are expected empty.
4. Block populations: each inhabited block gets one person, then the rest of the tract's real
   population is apportioned by largest remainder in proportion to lognormal block weights
   scaled to the block groups' shares.
5. Race/ethnicity: state shares ~ Dirichlet around the 2020 national shares, tract shares ~
   Dirichlet around the state's, block shares ~ Dirichlet around the tract's; counts are
   multinomial. Voting age: binomial per group at the group's adult rate, shifted per tract by a
   latent "family" score (more children go with bigger households) and noise.
6. Households: a few populated blocks hold group quarters (people outside households). The other
   people of a block are filled with households whose sizes are drawn, one after another, from
   a tract-specific mixture of two tilts of the ACS PUMS size distribution; the last household
   is cut to fit.

The assumptions behind each constant are stated next to it. The report compares the generated
blocks with the real RI and HI 2010 block files (:func:`validation_table`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The real files the generators read, shipped in the package so that an installed copy can
generate; the source tree's ``data/`` links to them under their documented names."""
SPINE_PATH = DATA_DIR / "tracts_2020_population.csv"
REFERENCE_PATHS = {
    "RI 2010": DATA_DIR / "ri_2010_blocks_pl.csv",
    "HI 2010": DATA_DIR / "hi_2010_blocks_pl.csv",
}

RACES = ("white", "black", "hisp", "aian", "asian", "nhpi", "other", "two")
# 2020 Census P.L. 94-171, 50 states + DC, share of the population (to 0.1 pt), in RACES order:
# non-Hispanic White, Black, Hispanic (any race), then non-Hispanic AIAN, Asian, NHPI, some
# other race alone, two or more races.
NATIONAL_RACE_SHARES = (0.578, 0.121, 0.187, 0.007, 0.059, 0.002, 0.005, 0.041)
# Share aged 18+ within each group. Assumed: between the RI and HI 2010 rates of each group,
# set so that the national voting-age share is about 78% (2020 P.L.: 258.3M of 331.4M).
VOTING_AGE_RATES = (0.83, 0.76, 0.68, 0.76, 0.81, 0.74, 0.74, 0.60)
# Households by size 1..7+ in the ACS 2006-2010 PUMS sample of Oregon PUMA 600, 4,213 unique
# households (data/real README section 6). A 7+ household has 7 + Geometric(0.6) - 1 people,
# which matches that sample's 7/8/9+ split.
PUMS_HOUSEHOLD_SIZES = (1103, 1687, 624, 489, 188, 80, 42)
LARGE_HOUSEHOLD_EXTRA_P = 0.6

HOUSEHOLD_SIZE_COLUMNS = (*(f"hh_size_{s}" for s in range(1, 7)), "hh_size_7plus")
POP_COLUMNS = tuple(f"pop_{r}" for r in RACES)
VAP_COLUMNS = tuple(f"vap_{r}" for r in RACES)
COUNT_COLUMNS = ("pop", *POP_COLUMNS, "vap", *VAP_COLUMNS, *HOUSEHOLD_SIZE_COLUMNS)
MAX_BLOCK_GROUPS_PER_TRACT = 9  # one geocode digit, 1..9
MAX_BLOCKS_PER_BLOCK_GROUP = 1000  # three geocode digits after the block-group digit
HOUSEHOLD_CHUNK_PERSONS = 5_000_000  # bounds the memory of the household stream of big states


@dataclass(frozen=True, kw_only=True)
class Tallies:
    states: int
    counties: int
    tracts: int
    block_groups: int
    blocks: int
    population: int


# census.gov 2020 tallies for the 50 states + DC; the population is the spine's (= official).
NATIONAL_TALLIES = Tallies(
    states=51,
    counties=3_143,
    tracts=84_414,
    block_groups=239_780,
    blocks=8_132_968,
    population=331_449_281,
)


@dataclass(frozen=True, kw_only=True)
class ModelParameters:
    """Tuning of the model, set so the validation table matches RI/HI 2010 in shape."""

    block_group_noise_sigma: float = 0.25
    block_group_share_concentration: float = 6.0
    blocks_population_exponent: float = 0.5
    blocks_rural_weight: float = 0.35
    blocks_tract_sigma: float = 0.4
    blocks_block_group_sigma: float = 0.45
    empty_share_target: float = 0.28
    empty_slope_per_decade: float = 3.0
    block_size_sigma: float = 1.1
    state_race_concentration: float = 10.0
    tract_race_concentration: float = 4.0
    block_race_concentration: float = 30.0
    race_alpha_floor: float = 0.002
    voting_age_family_effect: float = 0.3
    voting_age_tract_sigma: float = 0.2
    household_family_effect: float = 1.2
    household_tilt: float = 0.25
    group_quarters_site_rate: float = 0.02
    group_quarters_min_pop: int = 20


@dataclass(frozen=True)
class Spine:
    """Real tracts, sorted by GEOID: ``code`` is the 11-digit GEOID as an integer."""

    code: np.ndarray
    pop: np.ndarray

    @property
    def state(self) -> np.ndarray:
        return self.code // 10**9

    @property
    def county(self) -> np.ndarray:
        return self.code // 10**6


def load_spine(path: Path = SPINE_PATH) -> Spine:
    """Read the tract file (``GEOID`` 11 digits as text, ``pop20``), sorted by GEOID."""
    frame = pd.read_csv(path, dtype={"GEOID": str, "pop20": np.int64})
    if not frame["GEOID"].str.fullmatch(r"[0-9]{11}").all() or not frame["GEOID"].is_unique:
        raise ValueError(f"{path}: GEOID must be unique 11-digit tract codes")
    frame = frame.sort_values("GEOID")
    return Spine(frame["GEOID"].astype(np.int64).to_numpy(), frame["pop20"].to_numpy())


def _rng(seed: int, *key: int) -> np.random.Generator:
    """Independent stream per key: (0,) national layout, (1, fips) a state, (2,) state order."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _starts(counts: np.ndarray) -> np.ndarray:
    """Offset of each group's first item in an array laid out group after group."""
    return (np.cumsum(counts) - counts).astype(np.int64)


def _rank_within(group: np.ndarray, order: np.ndarray, groups: int) -> np.ndarray:
    """Rank of each item within its group when items are visited in ``order`` (group-sorted)."""
    rank = np.empty(len(group), dtype=np.int64)
    rank[order] = (
        np.arange(len(group)) - _starts(np.bincount(group, minlength=groups))[group[order]]
    )
    return rank


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _share_within(group: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Each value divided by its group's sum (0 where that sum is 0)."""
    sums = np.bincount(group, values, groups)[group]
    return np.divide(values, sums, np.zeros_like(values, dtype=np.float64), where=sums > 0)


def _dirichlet_rows(rng: np.random.Generator, alpha: np.ndarray) -> np.ndarray:
    """One Dirichlet draw per row of ``alpha`` (normalised gammas)."""
    gamma = rng.standard_gamma(alpha)
    return gamma / gamma.sum(axis=1, keepdims=True)


def apportion(total: int, weights: np.ndarray, lower: int, upper: int) -> np.ndarray:
    """Integers in [lower, upper] summing to ``total``, in proportion to positive ``weights``.

    Largest remainder with bounds: quotas are ``lam * weights`` for the largest ``lam`` whose
    bounded floors still fit in ``total``; the units left go to the largest remainders among the
    items below ``upper`` (ties to the lower index).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or not np.all(w > 0):
        raise ValueError("apportion needs a non-empty array of positive weights")
    if not lower * w.size <= total <= upper * w.size:
        raise ValueError(f"cannot apportion {total} over {w.size} items within [{lower}, {upper}]")

    def floors(lam: float) -> np.ndarray:
        return np.clip(np.floor(lam * w), lower, upper)

    lo, hi = 0.0, total / w.sum()
    while floors(hi).sum() < total:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if floors(mid).sum() <= total else (lo, mid)
    base = floors(lo).astype(np.int64)
    remainder = np.where(base < upper, lo * w - base, -np.inf)
    winners = np.argsort(-remainder, kind="stable")[: total - int(base.sum())]
    if np.isinf(remainder[winners]).any():
        raise ArithmeticError("apportion: no item left below the upper bound")
    base[winners] += 1
    return base


def apportion_within(group: np.ndarray, totals: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Split each ``totals[g]`` over the items of group ``g`` in proportion to ``weights``
    (largest remainder, ties to the lower index). ``group`` must be sorted, and a group with a
    positive total needs a positive weight."""
    groups = len(totals)
    sums = np.bincount(group, weights, groups)
    if np.any((totals > 0) & (sums <= 0)):
        raise ValueError("a group with a positive total has no positive weight")
    quota = totals[group] * _share_within(group, weights, groups)
    base = np.floor(quota).astype(np.int64)
    deficit = totals - np.bincount(group, base, groups).astype(np.int64)
    rank = _rank_within(group, np.lexsort((base - quota, group)), groups)
    return base + (rank < deficit[group])


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The national draw all states share (steps 1-3 of the model).

    Tract arrays follow the spine; block-group arrays are sorted by tract then digit, with
    ``bg_tract`` indexing the tract; ``state_race_shares`` rows follow ``states``.
    """

    spine: Spine
    tract_family: np.ndarray
    bg_tract: np.ndarray
    bg_digit: np.ndarray
    bg_share: np.ndarray
    bg_blocks: np.ndarray
    bg_empty_prob: np.ndarray
    states: np.ndarray
    state_race_shares: np.ndarray

    def state_blocks(self) -> np.ndarray:
        """Blocks per state, in ``states`` order."""
        tract_blocks = np.bincount(self.bg_tract, self.bg_blocks, len(self.spine.code))
        index = np.searchsorted(self.states, self.spine.state)
        return np.bincount(index, tract_blocks, len(self.states)).astype(np.int64)


def _rurality(spine: Spine) -> np.ndarray:
    """Per tract, standardised -log(tracts in its county): high in rural counties."""
    _, county, tracts = np.unique(spine.county, return_inverse=True, return_counts=True)
    rural = -np.log(tracts[county].astype(np.float64))
    return (rural - rural.mean()) / rural.std()


def _empty_probability(
    persons_per_block: np.ndarray, blocks: np.ndarray, p: ModelParameters
) -> np.ndarray:
    """Logistic in log10(persons per block), centred so the block-weighted mean is the target."""
    x = np.log10(persons_per_block + 0.1)

    def prob(centre: float) -> np.ndarray:
        return _logistic(-p.empty_slope_per_decade * (x - centre))

    lo, hi = -2.0, 6.0
    for _ in range(60):
        mid = (lo + hi) / 2
        too_few = np.average(prob(mid), weights=blocks) < p.empty_share_target
        lo, hi = (mid, hi) if too_few else (lo, mid)
    return prob((lo + hi) / 2)


def draw_layout(spine: Spine, seed: int, p: ModelParameters) -> Layout:
    """Block groups and blocks for every tract of the nation, with their targets."""
    rng = _rng(seed, 0)
    n_tracts = len(spine.code)
    noise = rng.lognormal(0.0, p.block_group_noise_sigma, n_tracts)
    tract_bgs = apportion(
        NATIONAL_TALLIES.block_groups, (spine.pop + 1.0) * noise, 1, MAX_BLOCK_GROUPS_PER_TRACT
    )
    bg_tract = np.repeat(np.arange(n_tracts), tract_bgs)
    n_bgs = len(bg_tract)
    bg_share = _share_within(
        bg_tract, rng.standard_gamma(p.block_group_share_concentration, n_bgs), n_tracts
    )
    bg_pop = spine.pop[bg_tract] * bg_share

    tract_factor = p.blocks_rural_weight * _rurality(spine)
    tract_factor += rng.normal(0.0, p.blocks_tract_sigma, n_tracts)
    bg_factor = tract_factor[bg_tract] + rng.normal(0.0, p.blocks_block_group_sigma, n_bgs)
    bg_weight = (bg_pop + 1.0) ** p.blocks_population_exponent * np.exp(bg_factor)
    bg_blocks = apportion(NATIONAL_TALLIES.blocks, bg_weight, 1, MAX_BLOCKS_PER_BLOCK_GROUP)

    states = np.unique(spine.state)
    national = np.asarray(NATIONAL_RACE_SHARES)
    state_alpha = np.tile(p.state_race_concentration * national, (len(states), 1))
    return Layout(
        spine=spine,
        tract_family=rng.normal(0.0, 1.0, n_tracts),
        bg_tract=bg_tract,
        bg_digit=np.arange(n_bgs) - _starts(tract_bgs)[bg_tract] + 1,
        bg_share=bg_share,
        bg_blocks=bg_blocks,
        bg_empty_prob=_empty_probability(bg_pop / bg_blocks, bg_blocks, p),
        states=states,
        state_race_shares=_dirichlet_rows(rng, state_alpha),
    )


def select_states(layout: Layout, fraction: float, seed: int) -> np.ndarray:
    """Whole states in a seeded random order, each kept if it brings the share of the nation's
    blocks closer to ``fraction`` (at least the smallest state; every state at 1). Sorted."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    order = _rng(seed, 2).permutation(len(layout.states))
    shares = layout.state_blocks()[order] / layout.state_blocks().sum()
    kept: list[int] = []
    total = 0.0
    for position, share in zip(order, shares, strict=True):
        if abs(total + share - fraction) < abs(total - fraction):
            kept.append(int(position))
            total += share
    if not kept:
        kept = [int(np.argmin(layout.state_blocks()))]
    return np.sort(layout.states[kept])


@dataclass(frozen=True)
class StateSlice:
    """One state's tracts and block groups (slices of the layout) and its blocks (local
    indices of their block group and tract, and their 15-digit code), sorted by code."""

    tracts: slice
    bgs: slice
    block_bg: np.ndarray
    block_tract: np.ndarray
    block_code: np.ndarray

    @property
    def n_tracts(self) -> int:
        return self.tracts.stop - self.tracts.start

    @property
    def n_bgs(self) -> int:
        return self.bgs.stop - self.bgs.start


def state_slice(layout: Layout, state: int) -> StateSlice:
    """The tracts, block groups and numbered blocks of state ``state`` (FIPS as an integer)."""
    t0, t1 = np.searchsorted(layout.spine.state, [state, state + 1])
    g0, g1 = np.searchsorted(layout.bg_tract, [t0, t1])
    bg_blocks = layout.bg_blocks[g0:g1]
    block_bg = np.repeat(np.arange(g1 - g0), bg_blocks)
    block_tract = layout.bg_tract[g0:g1][block_bg] - t0
    number = np.arange(len(block_bg)) - _starts(bg_blocks)[block_bg]
    code = layout.spine.code[t0:t1][block_tract] * 10_000
    code += layout.bg_digit[g0:g1][block_bg] * 1000 + number
    return StateSlice(slice(t0, t1), slice(g0, g1), block_bg, block_tract, code)


def block_populations(
    rng: np.random.Generator, layout: Layout, s: StateSlice, p: ModelParameters
) -> np.ndarray:
    """Steps 3-4: choose the empty blocks, then apportion each tract's real population."""
    n = len(s.block_bg)
    tract_pop = layout.spine.pop[s.tracts]
    size = rng.lognormal(0.0, p.block_size_sigma, n)
    empty = rng.random(n) < layout.bg_empty_prob[s.bgs][s.block_bg]
    # Within a tract, non-empty blocks rank first, biggest first. The top block is inhabited
    # even if drawn empty (a populated tract needs one), and at most tract_pop blocks can be.
    rank = _rank_within(s.block_tract, np.lexsort((-size, empty, s.block_tract)), s.n_tracts)
    inhabited = (~empty | (rank == 0)) & (rank < tract_pop[s.block_tract])
    weight = _share_within(s.block_bg, np.where(inhabited, size, 0.0), s.n_bgs)
    weight *= layout.bg_share[s.bgs][s.block_bg]
    rest = tract_pop - np.bincount(s.block_tract, inhabited, s.n_tracts).astype(np.int64)
    return inhabited + apportion_within(s.block_tract, rest, weight)


def race_counts(
    rng: np.random.Generator,
    layout: Layout,
    s: StateSlice,
    state: int,
    pop: np.ndarray,
    p: ModelParameters,
) -> np.ndarray:
    """Step 5: (blocks, 8) counts in ``RACES`` order, each row summing to the block's pop."""
    state_shares = layout.state_race_shares[np.searchsorted(layout.states, state)]
    tract_alpha = p.tract_race_concentration * state_shares + p.race_alpha_floor
    tract_shares = _dirichlet_rows(rng, np.tile(tract_alpha, (s.n_tracts, 1)))
    block_alpha = p.block_race_concentration * tract_shares[s.block_tract] + p.race_alpha_floor
    return rng.multinomial(pop, _dirichlet_rows(rng, block_alpha))


def voting_age_counts(
    rng: np.random.Generator, layout: Layout, s: StateSlice, races: np.ndarray, p: ModelParameters
) -> np.ndarray:
    """Step 5: adults per group, binomial in the group's count (so ``vap_x <= pop_x``)."""
    rates = np.asarray(VOTING_AGE_RATES)
    shift = -p.voting_age_family_effect * layout.tract_family[s.tracts]
    shift += rng.normal(0.0, p.voting_age_tract_sigma, s.n_tracts)
    tract_rates = _logistic(np.log(rates / (1 - rates))[None, :] + shift[:, None])
    return rng.binomial(races, tract_rates[s.block_tract])


def household_size_tilts(p: ModelParameters) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities of sizes 1..7+ for small and large households: the PUMS distribution
    tilted by exp(-/+ household_tilt * size)."""
    base = np.asarray(PUMS_HOUSEHOLD_SIZES, dtype=np.float64)
    sizes = np.arange(1, 8)
    small, large = (base * np.exp(sign * p.household_tilt * sizes) for sign in (-1, 1))
    return small / small.sum(), large / large.sum()


def _chunks(weights: np.ndarray, limit: int) -> list[slice]:
    """Contiguous ranges of items whose weights add up to about ``limit`` (at least one range)."""
    before = np.cumsum(weights) - weights
    starts = np.flatnonzero(np.diff(before // limit, prepend=-1))
    edges = [0, *starts[1:].tolist(), len(weights)]
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def _fill_households(
    rng: np.random.Generator, persons: np.ndarray, large_share: np.ndarray, p: ModelParameters
) -> np.ndarray:
    """(blocks, 7) counts: a stream of household sizes per block, drawn until the block's
    ``persons`` are housed; the last household is cut to fit, and people left over (if the
    stream falls short, which is very unlikely) form one more household."""
    small, large = household_size_tilts(p)
    sizes = np.arange(1, 8)
    mean = large_share * float(large @ sizes) + (1 - large_share) * float(small @ sizes)
    # Mean + 4 sd of the people in that many households, with a size sd below 1.6.
    draws = np.where(persons > 0, np.ceil((persons + 6.4 * np.sqrt(persons / mean)) / mean) + 2, 0)
    n = len(persons)
    owner = np.repeat(np.arange(n), draws.astype(np.int64))
    u = rng.random(len(owner))
    size_class = np.where(
        rng.random(len(owner)) < large_share[owner],
        np.searchsorted(np.cumsum(large), u, side="right"),
        np.searchsorted(np.cumsum(small), u, side="right"),
    ).clip(0, 6)
    size = size_class + 1
    big = size_class == 6
    size[big] += rng.geometric(LARGE_HOUSEHOLD_EXTRA_P, int(big.sum())) - 1
    drawn = np.bincount(owner, size, n).astype(np.int64)
    end = np.cumsum(size) - _starts(drawn)[owner]
    start = end - size
    keep = start < persons[owner]
    kept = np.minimum(end[keep], persons[owner[keep]]) - start[keep]
    counts = np.bincount(owner[keep] * 7 + np.minimum(kept, 7) - 1, minlength=7 * n)
    counts = counts.reshape(n, 7)
    left = persons - np.minimum(drawn, persons)
    counts[left > 0, np.minimum(left[left > 0], 7) - 1] += 1
    return counts


def group_quarters_persons(
    rng: np.random.Generator, pop: np.ndarray, p: ModelParameters
) -> np.ndarray:
    """Step 6: people outside households per block: a few populated blocks are group-quarters
    sites, holding a Beta(4, 1.5) share of their people (binomial); 0 elsewhere."""
    n = len(pop)
    site = (pop >= p.group_quarters_min_pop) & (rng.random(n) < p.group_quarters_site_rate)
    return np.where(site, rng.binomial(pop, rng.beta(4.0, 1.5, n)), 0)


def household_sizes(
    rng: np.random.Generator,
    layout: Layout,
    s: StateSlice,
    persons: np.ndarray,
    p: ModelParameters,
) -> np.ndarray:
    """Step 6: (blocks, 7) household counts by size 1..7+ housing each block's ``persons`` (its
    people outside group quarters); sum(s * count) <= persons (7+ as 7)."""
    family = p.household_family_effect * layout.tract_family[s.tracts]
    large_share = _logistic(family)[s.block_tract]
    parts = [
        _fill_households(rng, persons[c], large_share[c], p)
        for c in _chunks(persons, HOUSEHOLD_CHUNK_PERSONS)
    ]
    return np.concatenate(parts)


@dataclass(frozen=True, kw_only=True)
class StateBlocks:
    """The drawn blocks of one state, sorted by code: per block its population, its people by
    group (``RACES`` order, all ages and adults), those in group quarters, and its households
    by size 1..7+."""

    code: np.ndarray
    pop: np.ndarray
    races: np.ndarray  # (blocks, 8)
    adults: np.ndarray  # (blocks, 8), <= races
    group_quarters: np.ndarray
    households: np.ndarray  # (blocks, 7)


def draw_state(layout: Layout, state: int, seed: int, p: ModelParameters) -> StateBlocks:
    """Steps 3-6 for one state, from the state's own random stream."""
    rng = _rng(seed, 1, state)
    s = state_slice(layout, state)
    pop = block_populations(rng, layout, s, p)
    if not np.array_equal(np.bincount(s.block_tract, pop, s.n_tracts), layout.spine.pop[s.tracts]):
        raise ArithmeticError(f"state {state:02d}: block populations miss the tract populations")
    races = race_counts(rng, layout, s, state, pop, p)
    adults = voting_age_counts(rng, layout, s, races, p)
    outside = group_quarters_persons(rng, pop, p)
    households = household_sizes(rng, layout, s, pop - outside, p)
    return StateBlocks(
        code=s.block_code,
        pop=pop,
        races=races,
        adults=adults,
        group_quarters=outside,
        households=households,
    )


def block_geoids(code: np.ndarray) -> pa.Array:
    """15-digit block GEOIDs as text."""
    return pc.utf8_lpad(pc.cast(pa.array(code), pa.string()), 15, "0")


def block_table(blocks: StateBlocks) -> pa.Table:
    """The 16-cell block table of a state: ``GEOID`` and ``COUNT_COLUMNS``."""
    counts = [
        blocks.pop,
        *blocks.races.T,
        blocks.adults.sum(axis=1),
        *blocks.adults.T,
        *blocks.households.T,
    ]
    columns = {"GEOID": block_geoids(blocks.code)}
    for name, values in zip(COUNT_COLUMNS, counts, strict=True):
        columns[name] = pa.array(values.astype(np.int32))
    return pa.table(columns)


def check_block_table(table: pa.Table) -> None:
    """Raise ``ArithmeticError`` unless the table keeps the count rules of the module."""
    col = {name: table.column(name).to_numpy().astype(np.int64) for name in COUNT_COLUMNS}
    sizes = range(1, 8)
    household_people = sum(s * col[c] for s, c in zip(sizes, HOUSEHOLD_SIZE_COLUMNS, strict=True))
    households = sum(col[c] for c in HOUSEHOLD_SIZE_COLUMNS)
    rules = {
        "counts are non-negative": all((v >= 0).all() for v in col.values()),
        "race columns sum to pop": np.array_equal(sum(col[c] for c in POP_COLUMNS), col["pop"]),
        "vap columns sum to vap": np.array_equal(sum(col[c] for c in VAP_COLUMNS), col["vap"]),
        "vap_x <= pop_x": all(
            (col[v] <= col[c]).all() for v, c in zip(VAP_COLUMNS, POP_COLUMNS, strict=True)
        ),
        "household people <= pop": bool((household_people <= col["pop"]).all()),
        "no households in empty blocks": bool((households[col["pop"] == 0] == 0).all()),
    }
    broken = [rule for rule, kept in rules.items() if not kept]
    if broken:
        raise ArithmeticError(f"generated blocks break: {', '.join(broken)}")


def _quantiles(values: np.ndarray, qs: Sequence[float]) -> dict[str, float]:
    out = np.quantile(values, qs, method="inverted_cdf")
    names = ("max" if q == 1 else f"p{round(q * 100)}" for q in qs)
    return dict(zip(names, out.astype(float).tolist(), strict=True))


def _run_lengths(sorted_values: np.ndarray) -> np.ndarray:
    """Lengths of the runs of equal values in a sorted array."""
    edges = np.flatnonzero(np.diff(sorted_values)) + 1
    return np.diff(np.concatenate(([0], edges, [len(sorted_values)])))


@dataclass(kw_only=True)
class BlockSummary:
    """What the validation needs of a block file: per block the 15-digit code, pop, vap and
    the number of non-zero cells of the 16-cell histogram; totals by race and household size."""

    code: list[np.ndarray] = field(default_factory=list)
    pop: list[np.ndarray] = field(default_factory=list)
    vap: list[np.ndarray] = field(default_factory=list)
    cells: list[np.ndarray] = field(default_factory=list)
    race_totals: np.ndarray = field(default_factory=lambda: np.zeros(len(RACES), np.int64))
    household_totals: np.ndarray | None = None

    def add(self, code: np.ndarray, columns: dict[str, np.ndarray]) -> None:
        pop_races = np.stack([columns[c] for c in POP_COLUMNS], axis=1).astype(np.int64)
        vap_races = np.stack([columns[c] for c in VAP_COLUMNS], axis=1).astype(np.int64)
        self.code.append(code)
        self.pop.append(columns["pop"].astype(np.int64))
        self.vap.append(columns["vap"].astype(np.int64))
        under_18 = (pop_races - vap_races > 0).sum(axis=1)
        self.cells.append((under_18 + (vap_races > 0).sum(axis=1)).astype(np.int8))
        self.race_totals += pop_races.sum(axis=0)
        if HOUSEHOLD_SIZE_COLUMNS[0] in columns:
            sizes = np.stack([columns[c] for c in HOUSEHOLD_SIZE_COLUMNS], axis=1).sum(axis=0)
            previous = self.household_totals
            self.household_totals = sizes if previous is None else previous + sizes

    def statistics(self) -> dict:
        code, pop, vap, cells = (
            np.concatenate(x) for x in (self.code, self.pop, self.vap, self.cells)
        )
        order = np.argsort(code, kind="stable")
        code, pop, cells = code[order], pop[order], cells[order]
        bg_sizes = _run_lengths(code // 1000)
        bg_first = np.cumsum(bg_sizes) - bg_sizes
        bgs_per_tract = _run_lengths(code[bg_first] // 10_000)
        populated = pop > 0
        stats: dict = {
            "blocks": len(code),
            "block_groups": len(bg_sizes),
            "tracts": len(bgs_per_tract),
            "counties": len(np.unique(code // 10**10)),
            "states": len(np.unique(code // 10**13)),
            "population": int(pop.sum()),
            "empty_block_share": float(1 - populated.mean()),
            "voting_age_share": float(vap.sum() / pop.sum()),
            "nonzero_cells_per_populated_block": float(cells[populated].mean()),
            "race_shares": dict(
                zip(RACES, (self.race_totals / pop.sum()).round(4).tolist(), strict=True)
            ),
            "block_pop": _quantiles(pop, (0.5, 0.9, 0.99, 1)),
            "populated_block_pop": _quantiles(pop[populated], (0.1, 0.5, 0.9, 0.99)),
            "blocks_per_block_group": _quantiles(bg_sizes, (0.1, 0.5, 0.9, 0.99, 1)),
            "block_groups_per_tract": _quantiles(bgs_per_tract, (0.1, 0.5, 0.9, 1)),
            "block_group_pop": _quantiles(np.add.reduceat(pop, bg_first), (0.1, 0.5, 0.9)),
        }
        if self.household_totals is not None:
            totals = self.household_totals
            stats["households"] = int(totals.sum())
            stats["household_size_shares"] = dict(
                zip(HOUSEHOLD_SIZE_COLUMNS, (totals / totals.sum()).round(4).tolist(), strict=True)
            )
            stats["household_people_share_min"] = float(totals @ np.arange(1, 8) / pop.sum())
        return stats


def reference_statistics(path: Path) -> dict:
    """Validation statistics of a real block file laid out like data/ri_2010_blocks_pl.csv."""
    frame = pd.read_csv(path, dtype={"GEOID": str})
    summary = BlockSummary()
    columns = {c: frame[c].to_numpy() for c in ("pop", *POP_COLUMNS, "vap", *VAP_COLUMNS)}
    summary.add(frame["GEOID"].astype(np.int64).to_numpy(), columns)
    return summary.statistics()


def _targets(layout: Layout, selected: np.ndarray) -> Tallies:
    """The tallies the selected states must reach: the spine's and the layout's."""
    spine = layout.spine
    tract_in = np.isin(spine.state, selected)
    bg_in = tract_in[layout.bg_tract]
    return Tallies(
        states=len(selected),
        counties=len(np.unique(spine.county[tract_in])),
        tracts=int(tract_in.sum()),
        block_groups=int(bg_in.sum()),
        blocks=int(layout.bg_blocks[bg_in].sum()),
        population=int(spine.pop[tract_in].sum()),
    )


class OutputExistsError(ValueError):
    """The output already holds generated blocks and ``overwrite`` was not asked for."""


GENERATED_FOLDERS = ("blocks", "persons", "spine")
"""The folders a generation writes (``persons`` and ``spine`` with the production schema)."""


def _prepare_output(output: Path, overwrite: bool) -> Path:
    blocks = output / "blocks"
    if blocks.exists() and any(blocks.iterdir()) and not overwrite:
        raise OutputExistsError(f"{blocks} already holds blocks; use --overwrite to replace")
    for folder in (output / name for name in GENERATED_FOLDERS):
        if folder.exists():
            shutil.rmtree(folder)
    blocks.mkdir(parents=True, exist_ok=True)
    return blocks


def _selected_states(
    layout: Layout, fraction: float, states: Sequence[str] | None, seed: int
) -> np.ndarray:
    if states is None:
        return select_states(layout, fraction, seed)
    selected = np.unique([int(code) for code in states])
    unknown = sorted(set(selected.tolist()) - set(layout.states.tolist()))
    if unknown or len(selected) == 0:
        raise ValueError(f"states must be 2-digit FIPS codes of the spine; unknown: {unknown}")
    return selected


def generate_national(
    seed: int,
    output: Path | str,
    fraction: float = 1.0,
    *,
    states: Sequence[str] | None = None,
    overwrite: bool = False,
    params: ModelParameters = ModelParameters(),
    on_state: Callable[[int, StateBlocks], None] | None = None,
) -> dict:
    """Write ``output/blocks/state_XX.parquet`` (one file per selected state), then
    ``output/metadata.json`` and ``output/README.txt``; return the report metadata.json holds
    (plus ``elapsed_s``). ``on_state(fips, blocks)`` sees every state's drawn blocks after they
    pass the checks (:mod:`censusdp_spark.generate.production` writes their persons).

    ``fraction`` selects whole states (:func:`select_states`); ``states`` (2-digit FIPS codes)
    names them instead, for tests and quick looks. Raises ``OutputExistsError`` if the output
    already holds blocks and ``overwrite`` is false.
    """
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    started = time.perf_counter()
    output = Path(output)
    layout = draw_layout(load_spine(), seed, params)
    selected = _selected_states(layout, fraction, states, seed)
    blocks_dir = _prepare_output(output, overwrite)
    summary = BlockSummary()
    for state in selected.tolist():
        drawn = draw_state(layout, state, seed, params)
        table = block_table(drawn)
        check_block_table(table)
        if on_state is not None:
            on_state(state, drawn)
        pq.write_table(table, blocks_dir / f"state_{state:02d}.parquet", compression="zstd")
        code = pc.cast(table.column("GEOID"), pa.int64()).to_numpy()
        summary.add(code, {c: table.column(c).to_numpy() for c in COUNT_COLUMNS})
    generated = summary.statistics()
    target = asdict(_targets(layout, selected))
    reached = {k: generated[k] for k in target}
    if reached != target:
        raise ArithmeticError(f"generated tallies {reached} differ from the targets {target}")
    report = {
        "synthetic": True,
        "description": "SYNTHETIC block-level inputs on the real 2020 tract spine; not census data",
        "generator": "censusdp_spark.generate.national",
        "seed": seed,
        "fraction_requested": fraction if states is None else None,
        "block_share_selected": target["blocks"] / NATIONAL_TALLIES.blocks,
        "states": [f"{s:02d}" for s in selected.tolist()],
        "columns": ["GEOID", *COUNT_COLUMNS],
        "tallies": {
            "generated": reached,
            "target_selected_states": target,
            "target_national": asdict(NATIONAL_TALLIES),
        },
        "validation": {
            "generated": generated,
            **{name: reference_statistics(path) for name, path in REFERENCE_PATHS.items()},
        },
        "anchors": {
            "race_shares_2020_national": dict(zip(RACES, NATIONAL_RACE_SHARES, strict=True)),
            "voting_age_rates": dict(zip(RACES, VOTING_AGE_RATES, strict=True)),
            "household_sizes_acs_pums": dict(
                zip(HOUSEHOLD_SIZE_COLUMNS, PUMS_HOUSEHOLD_SIZES, strict=True)
            ),
        },
        "checks": "passed: tract populations exact, race and vap columns sum to pop and vap, "
        "vap_x <= pop_x, household people <= pop, no households in empty blocks, tallies",
        "model": asdict(params),
    }
    (output / "metadata.json").write_text(json.dumps(report, indent=2) + "\n")
    (output / "README.txt").write_text(readme_text(report))
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    return report


def _format(value: float) -> str:
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"


def tallies_table(report: dict) -> str:
    """Markdown: generated tallies next to the selected states' and the nation's targets."""
    tallies = report["tallies"]
    lines = [
        "| tally | generated | target (selected states) | target (nation) |",
        "|---|---|---|---|",
    ]
    for key, national in tallies["target_national"].items():
        generated = _format(tallies["generated"][key])
        selected = _format(tallies["target_selected_states"][key])
        lines.append(f"| {key} | {generated} | {selected} | {_format(national)} |")
    return "\n".join(lines)


def validation_table(report: dict) -> str:
    """Markdown: block-shape statistics of the generated blocks next to real RI and HI 2010."""
    stats = report["validation"]
    names = list(stats)
    rows: list[tuple[str, list[float]]] = []
    for key in ("empty_block_share", "voting_age_share", "nonzero_cells_per_populated_block"):
        rows.append((key.replace("_", " "), [stats[n][key] for n in names]))
    for key in ("race_shares", "block_pop", "populated_block_pop", "blocks_per_block_group"):
        for q in stats["generated"][key]:
            rows.append((f"{key.replace('_', ' ')} {q}", [stats[n][key][q] for n in names]))
    for key in ("block_groups_per_tract", "block_group_pop"):
        for q in stats["generated"][key]:
            rows.append((f"{key.replace('_', ' ')} {q}", [stats[n][key][q] for n in names]))
    lines = ["| statistic | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, values in rows:
        lines.append(f"| {label} | " + " | ".join(_format(v) for v in values) + " |")
    return "\n".join(lines)


def households_table(report: dict) -> str:
    """Markdown: generated household-size shares next to the ACS PUMS anchor."""
    generated = report["validation"]["generated"]["household_size_shares"]
    anchor = np.asarray(PUMS_HOUSEHOLD_SIZES) / sum(PUMS_HOUSEHOLD_SIZES)
    lines = ["| household size | generated | ACS PUMS anchor |", "|---|---|---|"]
    for name, share in zip(HOUSEHOLD_SIZE_COLUMNS, anchor, strict=True):
        lines.append(f"| {name.removeprefix('hh_size_')} | {generated[name]:.3f} | {share:.3f} |")
    return "\n".join(lines)


def report_text(report: dict) -> str:
    """The printed report: what was generated, tallies, validation and households."""
    generated = report["validation"]["generated"]
    return "\n".join(
        [
            f"SYNTHETIC national blocks, seed {report['seed']}: {len(report['states'])} state(s), "
            f"{report['block_share_selected']:.1%} of the nation's blocks",
            "",
            tallies_table(report),
            "",
            validation_table(report),
            "",
            f"households: {generated['households']:,}; people in households, counting 7+ as 7: "
            f"{generated['household_people_share_min']:.1%} of the population",
            "",
            households_table(report),
            "",
            f"checks {report['checks']}",
        ]
    )


def readme_text(report: dict) -> str:
    """README.txt of an output directory."""
    return f"""SYNTHETIC DATA - NOT CENSUS DATA

Written by censusdp_spark.generate.national (`censusdp generate national`), seed {report["seed"]}.
Only the list of 2020 census tracts and their total 2020 populations are real
(tracts_2020_population.csv, shipped in censusdp_spark/generate/data with its provenance).
Block groups, blocks, block populations, race/ethnicity, voting age and household sizes are
drawn from a seeded model (docstring of censusdp_spark.generate.national) and describe no real
place.

Files
  blocks/state_XX.parquet  one file per state (2-digit FIPS); read the folder with
                           spark.read.parquet("<this folder>/blocks"); see conf/national_demo.toml
  metadata.json            seed, states, tallies, validation report, anchors, model parameters

Columns: {", ".join(report["columns"])}
  GEOID: 15-digit block code = 11-digit real tract + block-group digit + 3-digit block number.
  pop_* / vap_*: non-Hispanic White, Black, Hispanic, non-Hispanic AIAN, Asian, NHPI, other,
  two or more; mutually exclusive, summing to pop / vap (aged 18+); vap_x <= pop_x.
  hh_size_1 .. hh_size_7plus: households by size; sum(size * count) <= pop, 7+ counted as 7.

States: {" ".join(report["states"])}

{report_text(report)}
"""
