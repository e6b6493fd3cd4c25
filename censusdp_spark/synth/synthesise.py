"""One synthetic-data run, pure numpy: budget split, method, synthetic households.

The caller supplies the true normalised answers of :func:`training_workloads` (computed on the
driver by :mod:`censusdp_spark.synth.workloads` or on a cluster by ``synth.spark``) and the
public totals; this module never sees microdata. Every random draw comes from a keyed stream
``keyed_rng(secret, "synth", method, …)``, so the same secret reproduces a run exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from censusdp_spark.privacy import keyed_rng
from censusdp_spark.synth.adaptive import adaptive_measurements, plan_budget
from censusdp_spark.synth.config import HpdFixedOptions, HpdGenOptions, MwemOptions
from censusdp_spark.synth.domain import HouseholdDomain, Households
from censusdp_spark.synth.hpd import FixedModel, GenModel, HpdSynthesiser, Layout
from censusdp_spark.synth.independent import independent_marginals, one_way_workloads
from censusdp_spark.synth.methods import Method, method_named
from censusdp_spark.synth.mwem import MwemSynthesiser
from censusdp_spark.synth.product import expected_answers
from censusdp_spark.synth.sampling import sample_product_mixture
from censusdp_spark.synth.workloads import Totals, WorkloadSet, marginal_workloads


@dataclass(frozen=True)
class MethodOptions:
    rounds: int
    select_share: Fraction
    mwem: MwemOptions = field(default_factory=MwemOptions)
    hpd_fixed: HpdFixedOptions = field(default_factory=HpdFixedOptions)
    hpd_gen: HpdGenOptions = field(default_factory=HpdGenOptions)


@dataclass(kw_only=True)
class SynthResult:
    method: Method
    rho: Fraction
    households: Households  # the synthetic households (N_G of them)
    model_answers: Callable[[WorkloadSet], np.ndarray]  # expected answers of the fitted model
    budget_rows: list[dict[str, Any]]  # what each measurement cost: no truth, no secret
    noisy: list[tuple[int, str, np.ndarray]]  # (round, workload, noisy answers): releasable
    hyperparameters: dict[str, Any]
    timings: dict[str, float]

    def rho_spent(self) -> Fraction:
        return sum(
            (Fraction(r["rho_select"]) + Fraction(r["rho_measure"]) for r in self.budget_rows),
            Fraction(0),
        )


def training_workloads(method: Method, domain: HouseholdDomain, degree: int) -> WorkloadSet:
    """The workloads a method may measure: the one-way marginals and the size histogram (all
    that the baseline measures, and the adaptive methods' initial measurements), then for the
    adaptive methods every Q_G and Q_I workload of ``degree`` attributes, the candidates of the
    rounds."""
    if method == "independent":
        return one_way_workloads(domain)
    return one_way_workloads(domain) + marginal_workloads(domain, degree)


def synthesise(
    method: Method,
    domain: HouseholdDomain,
    candidates: WorkloadSet,
    truth: np.ndarray,
    totals: Totals,
    rho: Fraction,
    options: MethodOptions,
    secret: bytes,
) -> SynthResult:
    method = method_named(method)  # typed, but benchmarks and tests pass strings
    if len(truth) != candidates.n_queries:
        raise ValueError("truth does not match the candidate workloads")
    stream = f"synth/{method}"
    ratio = totals.households / totals.individuals
    mean_size = totals.individuals / totals.households
    timings: dict[str, float] = {}
    started = time.perf_counter()
    sample_rng = keyed_rng(secret, stream, "sample")
    n = totals.households

    if method == "independent":
        mix, measured = independent_marginals(domain, truth, totals, rho, secret, stream)
        timings["measure_and_fit"] = time.perf_counter() - started
        rows = [
            {"measurement": m.label, "rho_select": "0", "rho_measure": str(m.rho), "sigma": m.sigma}
            for m in measured
        ]
        t = time.perf_counter()
        households = sample_product_mixture(mix, n, sample_rng)
        timings["sample"] = time.perf_counter() - t
        noisy = [(0, m.label, m.noisy) for m in measured]
        return SynthResult(
            method=method,
            rho=rho,
            households=households,
            model_answers=lambda w: expected_answers(mix, w, ratio),
            budget_rows=rows,
            noisy=noisy,
            hyperparameters={},
            timings=timings,
        )

    plan = plan_budget(
        rho, options.rounds, options.select_share, len(one_way_workloads(domain).workloads)
    )
    init_rng = keyed_rng(secret, stream, "init")
    synth: MwemSynthesiser | HpdSynthesiser
    if method == "mwem":
        synth = MwemSynthesiser(domain, options.mwem, ratio, mean_size)
        hyper: dict[str, Any] = dict(options.mwem.__dict__)
    else:
        layout = Layout.of(domain)
        model: FixedModel | GenModel
        if method == "hpd_fixed":
            fixed = options.hpd_fixed
            model = FixedModel(layout, fixed.components, fixed.init_scale, init_rng)
            steps, lr, hyper = fixed.steps_per_round, fixed.learning_rate, dict(fixed.__dict__)
        else:
            gen = options.hpd_gen
            model = GenModel(layout, gen.components, gen.hidden, gen.latent, init_rng)
            steps, lr, hyper = gen.steps_per_round, gen.learning_rate, dict(gen.__dict__)
        synth = HpdSynthesiser(model, steps, lr, ratio, mean_size)
    hyper.update(rounds=options.rounds, select_share=str(options.select_share))
    result = adaptive_measurements(synth, candidates, truth, totals, plan, secret, stream)
    timings["rounds"] = time.perf_counter() - started
    rows = [
        {
            "round": m.round,
            "measurement": m.workload.label,
            "rho_select": str(m.rho_select),
            "rho_measure": str(m.rho_measure),
            "epsilon_select": m.epsilon_select,
            "sigma": m.sigma,
            "weight": m.weight,
            "seconds": s,
        }
        for m, s in zip(result.measurements, result.seconds, strict=True)
    ]
    t = time.perf_counter()
    if isinstance(synth, MwemSynthesiser):
        households = synth.sample(n, sample_rng)
        answer_fn: Callable[[WorkloadSet], np.ndarray] = synth.answers
    else:
        answer_fn = synth.answers
        if isinstance(synth.model, GenModel):
            households = _sample_generator(synth.model, n, sample_rng)
        else:
            households = sample_product_mixture(synth.model.mixture(), n, sample_rng)
    timings["sample"] = time.perf_counter() - t
    noisy = [(m.round, m.workload.label, m.noisy) for m in result.measurements]
    return SynthResult(
        method=method,
        rho=rho,
        households=households,
        model_answers=answer_fn,
        budget_rows=rows,
        noisy=noisy,
        hyperparameters=hyper,
        timings=timings,
    )


def _sample_generator(
    model: GenModel, n: int, rng: np.random.Generator, chunk: int = 20_000
) -> Households:
    """One generator draw per household, in chunks so memory stays bounded for large N_G."""
    parts = []
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        parts.append(
            sample_product_mixture(model.sampling_mixture(m, rng), m, rng, one_per_component=True)
        )
    return Households(
        np.concatenate([p.group for p in parts]), np.concatenate([p.members for p in parts])
    )
