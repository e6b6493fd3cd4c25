"""The synthetic-data job, shared by ``censusdp synth`` (``synth.cli``) and ``spark-submit jobs/synth.py``.

Stages:
1. validate the config and options (a domain too large for ``mwem`` among them, from the config
   alone); refuse an existing output without ``--overwrite``;
2. read and link the household and person tables, and answer every candidate workload on the
   cluster (confidential sums, in driver memory only; nothing is written if the input fails);
3. the method (pure numpy on the driver): Adaptive Measurements for ``mwem``, ``hpd_fixed`` and
   ``hpd_gen``, one-way noisy marginals for ``independent``; every measurement's ρ is recorded;
4. ``synthetic_households`` and ``synthetic_persons`` (N_G households, labels as in the config)
   and ``noisy_measurements`` written to Delta;
5. with ``--evaluate``: max and mean error on Q_G, Q_I and Q_R against the truth, in
   ``<output>.evaluation/``, beside the release and never inside it (internal, not for release);
6. the manifest, last: ρ per round, method, hyperparameters, public totals, versions, timings.
   No secret (only its fingerprint) and no true answer.

Privacy: ρ-zCDP for the change-one-person neighbour relation of
:mod:`censusdp_spark.synth.adaptive` (group attributes and household membership fixed), with
N_G, N_I and M public.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from censusdp_spark.engine.progress import reporting_progress
from censusdp_spark.model.errors import InputError
from censusdp_spark.privacy import zcdp_to_approx_dp
from censusdp_spark.privacy.accounting import BudgetError
from censusdp_spark.privacy.conversions import bun_steinke_epsilon
from censusdp_spark.release.runner import (
    ReleaseChoices,
    ReleaseRun,
    input_fingerprint,
    release_contents,
    with_command_line,
)
from censusdp_spark.release.summary import ReleaseSummary
from censusdp_spark.synth.config import (
    SynthConfig,
    privacy_unit,
    refuse_unfit_method,
    total_rho,
)
from censusdp_spark.synth.domain import decode
from censusdp_spark.synth.evaluation import error_rows
from censusdp_spark.synth.methods import Method, method_named
from censusdp_spark.synth.synthesise import MethodOptions, synthesise, training_workloads
from censusdp_spark.synth.workloads import (
    answers,
    marginal_workloads,
    normalise,
    relationship_workloads,
)

if TYPE_CHECKING:  # Spark is imported when a run starts, so the CLI stays quick to load
    from pyspark.sql import SparkSession

SYNTHETIC_HOUSEHOLDS = "synthetic_households"
SYNTHETIC_PERSONS = "synthetic_persons"
NOISY_MEASUREMENTS = "noisy_measurements"


@dataclass(frozen=True, kw_only=True)
class SynthOptions(ReleaseChoices):
    method: Method
    rho: Fraction | None = None
    epsilon: float | None = None
    delta: float | None = None
    rounds: int | None = None


@dataclass(kw_only=True)
class SynthSummary(ReleaseSummary):
    method: Method
    rho: Fraction
    epsilon: float
    delta: float
    households: int
    individuals: int
    dropped_oversize: int | None = None  # None: such households are refused, never dropped
    max_members: int = 0

    def text(self) -> str:
        lines = [
            self.written_line(f"synthetic data ({self.method})"),
            f"  {self.households} households, {self.individuals} persons in the input "
            "(public totals)",
        ]
        if self.dropped_oversize is not None:
            lines.append(
                f"  {self.dropped_oversize} households of more than {self.max_members} persons"
                ' dropped (input.larger_households = "drop"); not in the totals above'
            )
        lines += [
            f"  privacy: rho = {self.rho} (~{float(self.rho):.6f}) zCDP, "
            f"epsilon = {self.epsilon:.3f} at delta = {self.delta:g}",
            *self.unit_lines(),
            self.elapsed_line(),
            f"  tables: {SYNTHETIC_HOUSEHOLDS}, {SYNTHETIC_PERSONS}, {NOISY_MEASUREMENTS}; "
            f"manifest: {self.output / 'manifest.json'}",
        ]
        for row in self.evaluation:
            lines.append(
                f"  evaluation {row['target']:>6} {row['query_class']:<4} "
                f"max {row['max_error']:.4f} mean {row['mean_error']:.5f}"
            )
        lines += self.evaluation_dir_lines()
        return "\n".join(lines)


def resolve_rho(config: SynthConfig, options: SynthOptions) -> tuple[Fraction, float]:
    """(ρ, δ used to report ε): ``--rho``, else ``--epsilon`` at δ, else the config's ρ
    (:func:`censusdp_spark.synth.config.total_rho`, which ``censusdp budget`` shares)."""
    return total_rho(config, options.rho, options.epsilon, options.delta)


SYNTH = "synth"


def run_synth(spark: SparkSession, config: SynthConfig, options: SynthOptions) -> SynthSummary:
    method_named(options.method)  # typed, but the API's callers pass strings: refuse any other
    refuse_unfit_method(config, options.method)
    rho, delta_ = resolve_rho(config, options)
    run_options = with_command_line(config.run, options.output, options.secret_file)
    config = replace(config, run=run_options)
    rounds = options.rounds or config.budget.rounds_for(rho)
    inputs = [config.input.households, config.input.persons]
    contents = release_contents(
        SYNTH,
        config.document.doc,
        input_fingerprint(inputs),
        tables=[SYNTHETIC_HOUSEHOLDS, SYNTHETIC_PERSONS, NOISY_MEASUREMENTS],
        settings={"method": options.method, "rho": str(rho), "rounds": rounds},
    )
    streams = f"{SYNTH}/{options.method}"
    release = ReleaseRun.of(SYNTH, run_options, contents, options, inputs, streams)
    with release, reporting_progress(spark):
        return _run_synth(spark, config, options, release, rho, delta_, rounds)


def _run_synth(
    spark: SparkSession,
    config: SynthConfig,
    options: SynthOptions,
    release: ReleaseRun,
    rho: Fraction,
    delta_: float,
    rounds: int,
) -> SynthSummary:
    from censusdp_spark.io import delta
    from censusdp_spark.synth.spark import (
        measurements_frame,
        read_linked,
        workload_counts,
        write_frames,
    )

    clock = release.clock
    run = config.run
    output = run.output
    method_options = MethodOptions(
        rounds, config.budget.select_share, config.mwem, config.hpd_fixed, config.hpd_gen
    )
    domain = config.domain

    candidates = training_workloads(options.method, domain, config.degree)
    evaluation = marginal_workloads(domain, config.degree) + relationship_workloads(
        domain, config.degree
    )
    needed = candidates + evaluation if options.evaluate else candidates
    linked = read_linked(spark, config.input, domain)
    counted = workload_counts(
        linked, domain, needed, config.input.household_id, config.input.member_order
    )
    if counted.totals.households == 0:
        raise InputError(
            str(config.input.households),
            "rows",
            f"no household of at most {domain.max_members} persons",
        )
    totals = counted.totals
    truth = normalise(counted.counts, needed, totals)
    clock.lap("read_and_answer")
    secret = release.secret()  # only once the input has passed validation

    result = synthesise(
        options.method,
        domain,
        candidates,
        truth[: candidates.n_queries],
        totals,
        rho,
        method_options,
        secret,
    )
    if result.rho_spent() != rho:
        raise BudgetError(f"the run spent rho {result.rho_spent()}, not {rho}")
    clock.lap("method")
    clock.timings.update({f"method_{k}": v for k, v in result.timings.items()})
    release.prepare_output()
    households, persons = decode(domain, result.households)
    write_frames(
        spark,
        {
            SYNTHETIC_HOUSEHOLDS: households,
            SYNTHETIC_PERSONS: persons,
            NOISY_MEASUREMENTS: measurements_frame(result.noisy),
        },
        output,
    )
    clock.lap("write")

    error_table: list[dict[str, Any]] = []
    eval_dir: Path | None = None
    if options.evaluate:
        true_eval = truth[candidates.n_queries :]
        model_set = marginal_workloads(domain, config.degree)
        error_table = error_rows(
            true_eval[: model_set.n_queries], result.model_answers(model_set), model_set, "model"
        )
        error_table += error_rows(
            true_eval, answers(result.households, domain, evaluation), evaluation, "tables"
        )
        for row in error_table:
            row["method"] = options.method
        frame = pd.DataFrame(error_table)[
            ["method", "target", "query_class", "queries", "max_error", "mean_error"]
        ]
        eval_dir = release.evaluation_folder()
        delta.write_table(spark.createDataFrame(frame), eval_dir, delta.EVALUATION_TABLE)
        frame.to_csv(eval_dir / delta.EVALUATION_CSV, index=False)
        clock.lap("evaluate")

    summary = SynthSummary(
        output=output,
        method=options.method,
        rho=rho,
        epsilon=zcdp_to_approx_dp(rho, delta_),
        delta=delta_,
        households=totals.households,
        individuals=totals.individuals,
        elapsed_s=clock.elapsed(),
        timings=clock.timings,
        evaluation=error_table,
        for_release=release.for_release,
        evaluation_dir=eval_dir,
        dropped_oversize=counted.dropped_oversize if config.input.drop_larger else None,
        max_members=domain.max_members,
        privacy_unit=privacy_unit(config),
    )
    release.write_manifest(
        {
            "run": run.name,
            "method": options.method,
            "config_file": config.source,
            "config_text": config.document.text,
            "input": {
                "households": str(config.input.households),
                "persons": str(config.input.persons),
            },
            "privacy": {
                "definition": "rho-zCDP; neighbours change one person's individual attributes "
                "(household membership, group attributes, N_G, N_I and M fixed and public)",
                "unit": privacy_unit(config).manifest(),
                "rho": str(rho),
                "rho_float": float(rho),
                "delta": delta_,
                "epsilon_tight": summary.epsilon,
                "epsilon_bun_steinke": bun_steinke_epsilon(rho, delta_),
                "rounds": rounds if options.method != "independent" else None,
                "select_share": str(config.budget.select_share),
                "rho_spent_exact": str(result.rho_spent()),
                "noise": "exact discrete Gaussian on counts and exact exponential mechanism "
                "(rational epsilon, rounded down), from keyed ChaCha20 streams",
            },
            "budget": result.budget_rows,
            "public_totals": {
                "households": totals.households,
                "individuals": totals.individuals,
                "max_members": domain.max_members,
                "households_dropped_over_max_members": counted.dropped_oversize,
            },
            "hyperparameters": result.hyperparameters,
        },
    )
    return summary
