"""Baseline: independent noisy marginals at the same ρ.

One Gaussian measurement per group attribute (its Q_G one-way marginal: the fraction of
households at each level), per individual attribute (its Q_I one-way marginal) and of the
household-size histogram; ρ is split equally among them, exactly. The synthetic households draw
every group attribute, the size and every member's attributes independently from the
clipped and renormalised noisy marginals: a product mixture with one component. With
relationship roles declared, slot 0 is the head and the other slots draw the relationship from the
non-head levels of its marginal. Sensitivities and trust assumptions are those of
:mod:`censusdp_spark.synth.adaptive` (the same exact discrete Gaussian mechanism, on counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from censusdp_spark.privacy import keyed_rng
from censusdp_spark.synth.adaptive import gaussian_measure, gaussian_sigma, normaliser
from censusdp_spark.synth.domain import HouseholdDomain
from censusdp_spark.synth.product import ProductMixture
from censusdp_spark.synth.workloads import (
    GROUP,
    INDIVIDUAL,
    Totals,
    WorkloadSet,
    make_workload,
    size_workload,
)


def one_way_workloads(domain: HouseholdDomain) -> WorkloadSet:
    """Q_G per group attribute, Q_I per individual attribute, then the size histogram."""
    group = [make_workload(domain, GROUP, group=(j,)) for j in range(len(domain.group))]
    person = [make_workload(domain, INDIVIDUAL, person=(j,)) for j in range(len(domain.individual))]
    return WorkloadSet((*group, *person)) + size_workload(domain)


@dataclass(frozen=True)
class IndependentMeasurement:
    label: str
    rho: Fraction
    sigma: float
    noisy: np.ndarray


def _distribution(noisy: np.ndarray) -> np.ndarray:
    p = np.clip(noisy, 0.0, None)
    total = p.sum()
    return p / total if total > 0 else np.full(len(p), 1.0 / len(p))


def independent_marginals(
    domain: HouseholdDomain,
    truth: np.ndarray,
    totals: Totals,
    rho: Fraction,
    secret: bytes,
    stream: str,
) -> tuple[ProductMixture, list[IndependentMeasurement]]:
    """Measure the one-way marginals (``truth``: their normalised answers) and build the model."""
    workloads = one_way_workloads(domain)
    share = rho / len(workloads)
    measurements = []
    for i, w in enumerate(workloads.workloads):
        sigma = gaussian_sigma(w, totals, share)
        noisy = gaussian_measure(
            truth[workloads.cells(i)],
            normaliser(w, totals),
            share,
            keyed_rng(secret, stream, "measure", w.label),
        )
        measurements.append(IndependentMeasurement(w.label, share, sigma, noisy))
    if sum((m.rho for m in measurements), Fraction(0)) != rho:
        raise ValueError("independent marginals do not spend rho exactly")
    k_g, m = len(domain.group), domain.max_members
    group = [_distribution(x.noisy)[None, :] for x in measurements[:k_g]]
    member = []
    for j, x in enumerate(measurements[k_g:-1]):
        slots = np.repeat(_distribution(x.noisy)[None, None, :], m, axis=0)  # (M, 1, n)
        if domain.roles is not None and j == domain.roles.attribute:
            head = domain.roles.head
            slots[0, 0, :] = 0.0
            slots[0, 0, head] = 1.0
            others = slots[1:, 0, :]
            others[:, head] = 0.0
            others /= np.where(
                others.sum(axis=1, keepdims=True) > 0, others.sum(axis=1, keepdims=True), 1.0
            )
        member.append(slots)
    size = _distribution(measurements[-1].noisy)[None, :]
    return ProductMixture(group, size, member), measurements
