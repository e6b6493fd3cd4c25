"""MWEM under Adaptive Measurements: a distribution over an explicit domain of households.

The domain is every household the config allows: a group-attribute combination times a member
multiset. Q_G and Q_I are symmetric in the members, so a household is identified by the
*multiset* of its members' individual-attribute combinations (size 1 … M); with relationship
roles declared, by the head's combination plus a multiset of 0 … M−1 non-head members. That
keeps the reduced config at about 1.3·10⁵ elements instead of the d_G (d_I + 1)^M ordered slots
the paper counts; the queries cannot tell the two apart.

The distribution is a (d_G × n_sets) matrix, so every workload's answers factor as
U_Sᵀ · P · H_S (U: one-hot group cells, H: sparse member cells per set), which keeps each round
cheap. The refit is the multiplicative-weights update of Hardt, Ligett & McSherry (2012),
P ← P · exp(η · Φ(x)·(ã − a(P))) renormalised, cycled over every measurement so far (and the
exact public mean household size) ``passes`` times per round. Post-processing only.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from scipy import sparse

from censusdp_spark.synth.config import MwemOptions
from censusdp_spark.synth.domain import ABSENT, HouseholdDomain, Households
from censusdp_spark.synth.product import Target
from censusdp_spark.synth.workloads import (
    GROUP,
    INDIVIDUAL,
    SIZE,
    Workload,
    WorkloadSet,
    distinct_per_row,
    flat_index,
)


def all_combinations(sizes: Sequence[int]) -> np.ndarray:
    """Every combination of levels, in C order: (Π sizes, len(sizes)) int16."""
    if not sizes:
        return np.zeros((1, 0), dtype=np.int16)
    grids = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
    return np.stack([g.ravel() for g in grids], axis=1).astype(np.int16)


def member_sets(domain: HouseholdDomain) -> np.ndarray:
    """Every member multiset the domain allows, as (n_sets, M, k_I) codes (``ABSENT`` padded)."""
    types = all_combinations(domain.individual_sizes)
    m = domain.max_members
    if domain.roles is None:
        table = types
        index = _pad(
            [
                np.asarray(c)
                for r in range(1, m + 1)
                for c in itertools.combinations_with_replacement(range(len(types)), r)
            ],
            m,
        )
    else:
        is_head = types[:, domain.roles.attribute] == domain.roles.head
        firsts, others = types[is_head], types[~is_head]
        table = np.concatenate([firsts, others])
        offset = len(firsts)
        rest = [
            np.asarray(c) + offset
            for r in range(m)
            for c in itertools.combinations_with_replacement(range(len(others)), r)
        ]
        index = np.concatenate(
            [
                np.concatenate([np.full((len(rest), 1), h), _pad(rest, m - 1)], axis=1)
                for h in range(len(firsts))
            ]
        )
    out = np.full((*index.shape, len(domain.individual)), ABSENT, dtype=np.int16)
    present = index != ABSENT
    out[present] = table[index[present]]
    return out


def _pad(rows: list[np.ndarray], width: int) -> np.ndarray:
    out = np.full((len(rows), width), ABSENT, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def domain_size(domain: HouseholdDomain) -> int:
    """Number of explicit households (group combinations × member multisets)."""
    return domain.explicit_size()


class MwemSynthesiser:
    """The distribution P over (group combination, member multiset), fitted by MW updates."""

    def __init__(
        self, domain: HouseholdDomain, options: MwemOptions, ratio: float, mean_size: float
    ) -> None:
        size = domain_size(domain)
        if size > options.max_domain:
            raise ValueError(
                f"MWEM's explicit domain would hold {size:,} households (limit mwem.max_domain = "
                f"{options.max_domain:,}); use the reduced config or an HPD method"
            )
        self.domain, self.options, self.ratio, self.mean_size = domain, options, ratio, mean_size
        self.groups = all_combinations(domain.group_sizes)
        self.sets = member_sets(domain)
        present = self.sets[:, :, 0] != ABSENT
        self.set_sizes = present.sum(axis=1)
        self.p = np.full((len(self.groups), len(self.sets)), 1.0 / size)
        self._present = present
        self._g: dict[tuple[int, ...], sparse.csr_matrix] = {}
        self._h: dict[tuple[str, tuple[int, ...]], sparse.csr_matrix] = {}

    def _group_matrix(self, attrs: tuple[int, ...], n_g: int) -> sparse.csr_matrix:
        """(n_g × d_G) one-hot: which group cell each group combination falls in."""
        if attrs not in self._g:
            cell = flat_index(self.groups, attrs, self.domain.group_sizes)
            ones = np.ones(len(cell))
            self._g[attrs] = sparse.csr_matrix(
                (ones, (cell, np.arange(len(cell)))), shape=(n_g, len(cell))
            )
        return self._g[attrs]

    def _member_matrix(self, w: Workload) -> sparse.csr_matrix:
        """(n_sets × n_c): Q_G "some member in c", Q_I count × N_G/N_I, size one-hot."""
        key = (w.kind, w.person)
        if key not in self._h:
            n = len(self.sets)
            if w.kind == SIZE:
                rows, cols, vals = np.arange(n), self.set_sizes - 1, np.ones(n)
                shape = (n, self.domain.max_members)
            else:
                cells = np.where(
                    self._present,
                    flat_index(self.sets, w.person, self.domain.individual_sizes),
                    ABSENT,
                )
                if w.kind == GROUP:
                    cells = distinct_per_row(cells)
                rows, slots = np.nonzero(cells != ABSENT)
                cols = cells[rows, slots]
                vals = np.ones(len(rows)) * (self.ratio if w.kind == INDIVIDUAL else 1.0)
                shape = (n, w.n_person)
            self._h[key] = sparse.csr_matrix((vals, (rows, cols)), shape=shape)  # duplicates add up
        return self._h[key]

    def _answer(self, w: Workload) -> np.ndarray:
        ph = (self._member_matrix(w).T @ self.p.T).T  # (d_G, n_c)
        if w.kind == SIZE:
            return ph.sum(axis=0)
        return np.asarray(self._group_matrix(w.group, w.n_group) @ ph).ravel()

    def answers(self, workloads: WorkloadSet) -> np.ndarray:
        out = np.empty(workloads.n_queries)
        for i, w in enumerate(workloads.workloads):
            out[workloads.cells(i)] = self._answer(w)
        return out

    def _update(self, w: Workload, residual: np.ndarray) -> None:
        h = self._member_matrix(w)
        if w.kind == SIZE:
            by_group = np.broadcast_to(residual, (len(self.groups), len(residual)))
        else:
            by_group = self._group_matrix(w.group, w.n_group).T @ residual.reshape(
                w.n_group, w.n_person
            )
        exponent = np.asarray((h @ np.asarray(by_group).T).T)  # (d_G, n_sets)
        self._reweight(exponent)

    def _reweight(self, exponent: np.ndarray) -> None:
        exponent = self.options.step * exponent
        self.p *= np.exp(exponent - exponent.max())
        self.p /= self.p.sum()

    def fit(self, targets: Sequence[Target]) -> None:
        m = self.domain.max_members
        for _ in range(self.options.passes):
            for t in targets:
                self._update(t.workload, t.noisy - self._answer(t.workload))
            gap = (self.mean_size - float((self.p.sum(axis=0) * self.set_sizes).sum())) / m
            self._reweight(np.broadcast_to(gap * self.set_sizes / m, self.p.shape))

    def sample(self, n: int, rng: np.random.Generator) -> Households:
        flat = self.p.ravel()
        index = rng.choice(flat.size, size=n, p=flat / flat.sum())
        g, s = np.divmod(index, len(self.sets))
        return Households(self.groups[g], self.sets[s])
