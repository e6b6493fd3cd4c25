"""Adaptive Measurements (Liu et al. 2021, Algorithm 1 of Liu & Wu): select, measure, refit.

The total ρ is split exactly (``fractions.Fraction``) by :func:`plan_budget`:

0. **Initialise** (as AIM does, McKenna et al. 2022): every one-way marginal and the size
   histogram is measured with the Gaussian mechanism below, without selection, each with the ρ
   of one round's measurement, and the model is fitted to them. The rounds then start from a
   model that already holds what the independent baseline knows, instead of spending rounds
   (and, at small ε, most of the budget) rediscovering one-way facts.

Then round t = 1 … T gets an equal part of the rest, split into a selection share and a
measurement share. (AIM's budget raise, ×4 after a round whose refit moved the answers less than
the noise, was tried and dropped: with whole 3-way workloads of up to a few hundred cells it
fired almost every round, leaving 5–13 rounds and twice the max error of fixed rounds.)

1. **Select** the unmeasured candidate workload whose current model answers are worst, by the
   exponential mechanism on the score u(w) = max over its cells |q(D) − q(model)|, with ε_t the
   largest multiple of 2⁻⁶⁴ not above √(8 ρ_select)
   (:func:`censusdp_spark.privacy.bounded_range_epsilon`; √ is irrational and the exact sampler
   needs a rational ε, so ε is rounded *down*, by less than 2⁻⁶⁴). ε-DP implies ε²/8-zCDP for
   this mechanism (Cesar & Rogers 2021, bounded range), and ε_t²/8 ≤ ρ_select, so the step is
   ρ_select-zCDP.
2. **Measure** every cell of the chosen workload with the Gaussian mechanism on *counts*: the
   integer count c of each cell plus discrete Gaussian noise N_Z(0, 1/ρ_measure), divided by the
   workload's normaliser N and clipped to [0, 1] (post-processing). In count units the L2
   sensitivity is √2, so ρ = 2/(2σ²) = ρ_measure (CKS20, Theorem 14); the recorded σ is the
   normalised 1/(N·√ρ_measure) = Δ₂/√(2 ρ_measure).
3. **Refit** the model to all measurements so far (post-processing), each weighted by
   (σ_ref/σ)², its inverse noise variance relative to a round's group-level measurement: the
   weighted squared error is the Gaussian likelihood of the measurements.

Neighbouring datasets (Liu & Wu §3): the individual attributes of one person change; the number
of households N_G, of individuals N_I, every household's membership and group attributes, and
M are fixed and public. Then each normalised query moves by at most Δ = 1/N_G (Q_G: one
household's indicator; size: nothing moves) or 1/N_I ≤ 1/N_G (Q_I: one person's indicator), so
every score has sensitivity Δ = 1/N_G (the paper's max over the classes). Scores are computed in
float64 from answers c/N rounded to nearest and model answers clipped to [0, 1], so each is within
2⁻⁵³ of its exact value and a neighbour moves it by at most Δ + 2⁻⁵²; the mechanism is run with
Δ + 2⁻⁵⁰. A whole workload moves in at most two cells (the person leaves one cell and enters
another; for Q_G the household may lose one person-value combination and gain one), each by one
count, so its L2 sensitivity is √2 in counts: √2/N_G for Q_G and size and √2/N_I for Q_I. By composition the run is ρ-zCDP with
ρ = Σ_initial ρ_i + Σ_t (ρ_select + ρ_measure), which is checked to equal the configured total
exactly.

Trust assumptions: both mechanisms are exact, as for the TopDown counts: the measurement noise is
the exact discrete Gaussian and the selection the exact exponential mechanism of
:mod:`censusdp_spark.privacy.samplers` (integer and rational arithmetic only, no floating-point
number decides a draw; Mironov 2012's attack has nothing to act on), with random bits from a
keyed ChaCha20 stream (:func:`censusdp_spark.privacy.keyed_rng`). ``truth`` arrives as float64
fractions c/N; the integer counts are recovered from it exactly, and an answer that is not the
float64 of an integer count over its normaliser is refused (:func:`exact_counts`). The fitted
model, the inverse-variance weights and the clipping are post-processing and use floats freely.
As in the samplers, the running time of a draw depends on the draw and is not hidden.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import numpy as np

from censusdp_spark.privacy import (
    bounded_range_epsilon,
    discrete_gaussian,
    exponential_mechanism,
    keyed_rng,
)
from censusdp_spark.synth.product import Target
from censusdp_spark.synth.workloads import GROUP, INDIVIDUAL, SIZE, Totals, Workload, WorkloadSet


class BudgetSplitError(ValueError):
    """A budget split that does not add up exactly."""


@dataclass(frozen=True)
class RoundBudget:
    round: int
    rho_select: Fraction
    rho_measure: Fraction

    @property
    def epsilon_select(self) -> Fraction:
        """The exponential mechanism's ε: the largest multiple of 2⁻⁶⁴ with ε²/8 ≤ ρ_select."""
        return bounded_range_epsilon(self.rho_select)


@dataclass(frozen=True)
class BudgetPlan:
    """ρ of each initial measurement (in order), then of each round."""

    initial: tuple[Fraction, ...]
    rounds: tuple[RoundBudget, ...]

    def total(self) -> Fraction:
        return sum(self.initial, Fraction(0)) + sum(
            (b.rho_select + b.rho_measure for b in self.rounds), Fraction(0)
        )


def plan_budget(rho: Fraction, rounds: int, select_share: Fraction, initial: int = 0) -> BudgetPlan:
    """``initial`` measurements, each with the ρ of one round's measurement (AIM's choice), then
    ``rounds`` equal rounds, each split into selection and measurement; the parts re-add to ρ
    exactly."""
    if not isinstance(rho, Fraction) or not isinstance(select_share, Fraction):
        raise BudgetSplitError("rho and select_share must be exact fractions")
    if rho <= 0 or initial < 0 or rounds < 1 or not 0 < select_share < 1:
        raise BudgetSplitError(
            "need rho > 0, initial >= 0, rounds >= 1, 0 < select_share < 1; "
            f"got {rho}, {initial}, {rounds}, {select_share}"
        )
    unit = rho / (initial + rounds / (1 - select_share))  # one measurement's ρ
    per_round = unit / (1 - select_share)
    plan = BudgetPlan(
        tuple(unit for _ in range(initial)),
        tuple(
            RoundBudget(t, per_round * select_share, per_round * (1 - select_share))
            for t in range(1, rounds + 1)
        ),
    )
    if plan.total() != rho:
        raise BudgetSplitError(f"the plan spends {plan.total()}, not {rho}")
    return plan


SCORE_ROUNDING = Fraction(1, 2**50)
"""Added to Δ for the float64 scores: each is within 2⁻⁵³ of its exact value (module docstring)."""


def selection_sensitivity(totals: Totals) -> Fraction:
    """Δ of every float64 workload score: 1/N_G (≥ 1/N_I because every household has a member),
    plus :data:`SCORE_ROUNDING` for the rounding of the scores."""
    return Fraction(1, max(totals.households, 1)) + SCORE_ROUNDING


def normaliser(workload: Workload, totals: Totals) -> int:
    """N of a measured workload, whose answers are count/N: N_G for Q_G and size, N_I for Q_I."""
    if workload.kind in (GROUP, SIZE):
        return max(totals.households, 1)
    if workload.kind == INDIVIDUAL:
        return max(totals.individuals, 1)
    raise ValueError(f"{workload.kind} workloads are evaluated, not measured")


def l2_sensitivity(workload: Workload, totals: Totals) -> float:
    """L2 sensitivity of a whole normalised workload under the change-one-person neighbour: √2/N
    (√2 in count units)."""
    return math.sqrt(2.0) / normaliser(workload, totals)


def gaussian_sigma(workload: Workload, totals: Totals, rho: Fraction) -> float:
    """σ of the normalised noise, 1/(N·√ρ) = Δ₂/√(2ρ): for the weights and the report."""
    return l2_sensitivity(workload, totals) / math.sqrt(2 * rho)


def exact_counts(answers: np.ndarray, normaliser: int) -> np.ndarray:
    """The integer counts 0 ≤ c ≤ N with answers = float64(c/N), recovered exactly, as int64.

    For 0 ≤ c ≤ N < 2⁵⁰, float64(float64(c/N)·N) is within c·2⁻⁵² < 1/2 of c, so rounding
    returns c. Distinct c ≤ N have distinct float64(c/N) (the exact values are 1/N apart, far
    more than an ulp), so the check that the recovered counts give back ``answers`` exactly
    proves they are the counts.
    """
    if not 1 <= normaliser < 2**50:
        raise ValueError(f"normaliser {normaliser} is outside [1, 2**50)")
    counts = np.rint(np.asarray(answers, dtype=np.float64) * normaliser)
    in_range = np.all((counts >= 0) & (counts <= normaliser))
    if not (in_range and np.array_equal(counts / normaliser, answers)):
        raise ValueError(f"answers are not integer counts over their normaliser {normaliser}")
    return counts.astype(np.int64)


def select_workload(
    scores: np.ndarray, epsilon: Fraction, sensitivity: Fraction, rng: np.random.Generator
) -> int:
    """Index drawn with probability ∝ exp(ε·score/(2Δ)) by the exact exponential mechanism;
    −inf scores (measured workloads) never win. Each float score is converted exactly."""
    finite = np.isfinite(scores).nonzero()[0]
    if np.isnan(scores).any() or np.isposinf(scores).any() or not finite.size:
        raise ValueError("scores must be finite or -inf, with at least one finite")
    exact = [Fraction(float(x)) for x in scores[finite]]
    return int(finite[exponential_mechanism(exact, epsilon, sensitivity, rng)])


def gaussian_measure(
    answers: np.ndarray, normaliser: int, rho: Fraction, rng: np.random.Generator
) -> np.ndarray:
    """(count + N_Z(0, 1/ρ)) / N per cell, clipped to [0, 1]: ρ-zCDP for a workload whose counts
    have L2 sensitivity √2 (clipping is post-processing). ``answers`` are the counts over N."""
    counts = exact_counts(answers, normaliser)
    noise = discrete_gaussian(1 / rho, counts.size, rng).reshape(counts.shape)
    return np.clip((counts + noise) / normaliser, 0.0, 1.0)


def workload_max_errors(truth: np.ndarray, model: np.ndarray, workloads: WorkloadSet) -> np.ndarray:
    return np.maximum.reduceat(np.abs(truth - model), workloads.offsets[:-1])


def measurement_weight(sigma: float, reference: float) -> float:
    """(σ_ref/σ)²: the inverse-variance weight of a measurement, relative to ``reference``."""
    return (reference / sigma) ** 2


class Synthesiser(Protocol):
    """What the loop needs of a method: current answers, and a refit to the measurements."""

    def answers(self, workloads: WorkloadSet) -> np.ndarray: ...

    def fit(self, targets: Sequence[Target]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Measurement:
    round: int  # 0 for the initial measurements
    workload: Workload
    noisy: np.ndarray
    sigma: float
    rho_select: Fraction
    rho_measure: Fraction
    epsilon_select: float  # the exact ε as a float, for the report; 0 for the initial measurements
    weight: float  # (σ_ref/σ)² in the fitting loss


@dataclass
class AdaptiveResult:
    measurements: list[Measurement] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def rho_spent(self) -> Fraction:
        return sum((m.rho_select + m.rho_measure for m in self.measurements), Fraction(0))

    def targets(self) -> list[Target]:
        return [Target(m.workload, m.noisy, m.weight) for m in self.measurements]


def adaptive_measurements(
    synth: Synthesiser,
    candidates: WorkloadSet,
    truth: np.ndarray,
    totals: Totals,
    plan: BudgetPlan,
    secret: bytes,
    stream: str,
) -> AdaptiveResult:
    """Measure the first ``len(plan.initial)`` workloads of ``candidates``, then run rounds over
    the others until ρ is spent; ``truth`` (normalised answers of ``candidates``, each an integer
    count over its normaliser, checked) is touched only by the two mechanisms. Each
    measurement's randomness is its own keyed stream, so a rerun with the same secret redraws
    exactly the same selections and noise."""
    n_initial = len(plan.initial)
    if len(plan.rounds) > len(candidates) - n_initial:
        raise ValueError(
            f"{len(plan.rounds)} rounds but only {len(candidates) - n_initial} candidate workloads"
        )
    for i, workload in enumerate(candidates.workloads):
        exact_counts(truth[candidates.cells(i)], normaliser(workload, totals))
    result = AdaptiveResult()
    measured = np.zeros(len(candidates), dtype=bool)
    delta = selection_sensitivity(totals)
    reference = math.sqrt(2.0) / totals.households / math.sqrt(2 * plan.rounds[0].rho_measure)
    started = time.perf_counter()
    for i, rho_i in enumerate(plan.initial):
        workload = candidates.workloads[i]
        sigma = gaussian_sigma(workload, totals, rho_i)
        noisy = gaussian_measure(
            truth[candidates.cells(i)],
            normaliser(workload, totals),
            rho_i,
            keyed_rng(secret, stream, "initial", i),
        )
        weight = measurement_weight(sigma, reference)
        result.measurements.append(
            Measurement(
                round=0,
                workload=workload,
                noisy=noisy,
                sigma=sigma,
                rho_select=Fraction(0),
                rho_measure=rho_i,
                epsilon_select=0.0,
                weight=weight,
            )
        )
        measured[i] = True
    if n_initial:
        synth.fit(result.targets())
        result.seconds.extend([(time.perf_counter() - started) / n_initial] * n_initial)
    for budget in plan.rounds:
        started = time.perf_counter()
        model = np.clip(synth.answers(candidates), 0.0, 1.0)  # keeps the score rounding bound
        scores = workload_max_errors(truth, model, candidates)
        scores[measured] = -np.inf
        epsilon = budget.epsilon_select
        chosen = select_workload(
            scores, epsilon, delta, keyed_rng(secret, stream, "select", budget.round)
        )
        measured[chosen] = True
        workload = candidates.workloads[chosen]
        sigma = gaussian_sigma(workload, totals, budget.rho_measure)
        noisy = gaussian_measure(
            truth[candidates.cells(chosen)],
            normaliser(workload, totals),
            budget.rho_measure,
            keyed_rng(secret, stream, "measure", budget.round),
        )
        result.measurements.append(
            Measurement(
                round=budget.round,
                workload=workload,
                noisy=noisy,
                sigma=sigma,
                rho_select=budget.rho_select,
                rho_measure=budget.rho_measure,
                epsilon_select=float(epsilon),
                weight=measurement_weight(sigma, reference),
            )
        )
        synth.fit(result.targets())
        result.seconds.append(time.perf_counter() - started)
    return result
