"""Hierarchical synthetic data on the real ACS PUMS (Oregon PUMA 600): max and mean error on
Q_G, Q_I and Q_R for each method at ε ∈ {0.125, 0.25, 0.5, 1} with δ = 1/N_G², and runtimes.
Writes benchmarks/results/synth.md.

    .venv/bin/python benchmarks/bench_synth.py [--epsilons 0.125 0.25 0.5 1] \
        [--datasets reduced full]

Pure numpy on the driver (no Spark): the same encoding, workloads and methods as
``censusdp synth``, with the configs' hyperparameters. MWEM runs on the reduced data only.
One fixed benchmark secret, so a rerun reproduces the table.
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # small matrices: BLAS threads only add contention

import argparse  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from fractions import Fraction  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from censusdp_spark.privacy import approx_dp_to_zcdp  # noqa: E402
from censusdp_spark.synth.config import SynthConfig, load_synth_config  # noqa: E402
from censusdp_spark.synth.domain import encode_tables  # noqa: E402
from censusdp_spark.synth.evaluation import error_rows  # noqa: E402
from censusdp_spark.synth.synthesise import MethodOptions, synthesise, training_workloads  # noqa: E402
from censusdp_spark.synth.workloads import (  # noqa: E402
    answers,
    marginal_workloads,
    relationship_workloads,
    totals_of,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"reduced": "synth_pums_reduced.toml", "full": "synth_pums.toml"}
METHODS = {
    "reduced": ("mwem", "hpd_fixed", "hpd_gen", "independent"),
    "full": ("hpd_fixed", "hpd_gen", "independent"),
}
SECRET = bytes.fromhex("5a" * 32)  # a fixed benchmark secret: reproducible, never a release's
GRID = 10**12
NOTES = [
    "## Reading the tables",
    "",
    "- Max error is over every query of a class (tens of thousands on the full data), so it is "
    "dominated by the few workloads no round measured; the mean is the typical query.",
    "- T is the config's and the same at every ε (not tuned per ε); at small "
    "ε fewer rounds would leave more budget per measurement.",
    "- Hyperparameters (K, steps, learning rates, MWEM step) were set by a few trial runs on "
    "these same data at ε = 1; that choice is not itself private.",
    "- Sizes matter: N_G here is about 4,000 households (the paper's ACS NY has 87,000), and "
    "every noise scale is proportional to 1/N_G.",
    "",
]


def run_dataset(name: str, epsilons: list[float]) -> tuple[list[dict], dict]:
    config: SynthConfig = load_synth_config(ROOT / "conf" / CONFIGS[name], ROOT)
    domain, spec = config.domain, config.input
    encoded = encode_tables(
        domain,
        pd.read_csv(spec.households, dtype=str),
        pd.read_csv(spec.persons, dtype=str),
        spec.household_id,
        spec.member_order,
    )
    households = encoded.households
    totals = totals_of(households, domain)
    delta = 1.0 / totals.households**2
    marginals = marginal_workloads(domain, config.degree)
    relations = relationship_workloads(domain, config.degree)
    true_marginals = answers(households, domain, marginals)
    true_relations = answers(households, domain, relations)
    candidates = {m: training_workloads(m, domain, config.degree) for m in METHODS[name]}
    truth = {m: answers(households, domain, candidates[m]) for m in METHODS[name]}
    options = MethodOptions(
        config.budget.rounds,
        config.budget.select_share,
        config.mwem,
        config.hpd_fixed,
        config.hpd_gen,
    )
    info = {
        "households": totals.households,
        "individuals": totals.individuals,
        "family": totals.family_individuals,
        "dropped": encoded.dropped_oversize,
        "delta": delta,
        "q_g": int(marginals.of_kind("Q_G").sum()),
        "q_i": int(marginals.of_kind("Q_I").sum()),
        "q_r": relations.n_queries,
        "rounds": config.budget.rounds,
        "config": config,
    }
    rows = []
    for epsilon in epsilons:
        rho = Fraction(math.floor(approx_dp_to_zcdp(epsilon, delta) * GRID), GRID)
        for method in METHODS[name]:
            started = time.perf_counter()
            result = synthesise(
                method, domain, candidates[method], truth[method], totals, rho, options, SECRET
            )
            fit_s = time.perf_counter() - started
            assert result.rho_spent() == rho
            errors = error_rows(true_marginals, result.model_answers(marginals), marginals, "model")
            errors += error_rows(
                true_marginals, answers(result.households, domain, marginals), marginals, "tables"
            )
            errors += error_rows(
                true_relations, answers(result.households, domain, relations), relations, "tables"
            )
            row = {
                "dataset": name,
                "epsilon": epsilon,
                "rho": float(rho),
                "method": method,
                "fit_s": fit_s,
            }
            for e in errors:
                row[f"{e['target']}_{e['query_class']}_max"] = e["max_error"]
                row[f"{e['target']}_{e['query_class']}_mean"] = e["mean_error"]
            rows.append(row)
            print(
                f"{name} eps={epsilon} {method}: {fit_s:.1f} s, "
                f"tables Q_G max {row['tables_Q_G_max']:.4f}",
                flush=True,
            )
    return rows, info


def error_table(rows: list[dict], target: str, classes: tuple[str, ...]) -> list[str]:
    head = (
        "| data | ε | ρ | method | "
        + " | ".join(f"{c} max | {c} mean" for c in classes)
        + " | fit+sample s |"
    )
    lines = [head, "|---|---|---|---|" + "---:|---:|" * len(classes) + "---:|"]
    for r in rows:
        cells = " | ".join(
            f"{r[f'{target}_{c}_max']:.4f} | {r[f'{target}_{c}_mean']:.5f}" for c in classes
        )
        lines.append(
            f"| {r['dataset']} | {r['epsilon']:g} | {r['rho']:.5f} | {r['method']} | {cells} "
            f"| {r['fit_s']:.1f} |"
        )
    return lines


def describe(info: dict, name: str) -> list[str]:
    config = info["config"]
    domain, fixed, gen = config.domain, config.hpd_fixed, config.hpd_gen
    attrs = lambda side: ", ".join(f"{a.name} ({a.size})" for a in side)  # noqa: E731
    return [
        f"**{name}** (`conf/{CONFIGS[name]}`): N_G = {info['households']}, "
        f"N_I = {info['individuals']}, M = {domain.max_members} "
        f"({info['dropped']} larger households dropped), δ = 1/N_G² = {info['delta']:.3g}; "
        f"|Q_G| = |Q_I| = {info['q_g']}, |Q_R| = {info['q_r']} "
        f"(over N_R = {info['family']} head/spouse/child members); T = {info['rounds']} rounds.",
        f"Group: {attrs(domain.group)}. Individual: {attrs(domain.individual)}.",
        f"HPD-Fixed K = {fixed.components}, {fixed.steps_per_round} Adam steps/round, "
        f"lr {fixed.learning_rate}; HPD-Gen K = {gen.components}, hidden {gen.hidden}, "
        f"latent {gen.latent}, {gen.steps_per_round} steps/round, lr {gen.learning_rate}"
        + (
            f"; MWEM {config.mwem.passes} passes/round, step {config.mwem.step}."
            if "mwem" in METHODS[name]
            else "."
        ),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epsilons", nargs="+", type=float, default=[0.125, 0.25, 0.5, 1.0])
    parser.add_argument("--datasets", nargs="+", default=["reduced", "full"], choices=list(CONFIGS))
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "synth.md")
    args = parser.parse_args()
    started = time.perf_counter()
    rows, infos = [], {}
    for name in args.datasets:
        r, infos[name] = run_dataset(name, args.epsilons)
        rows += r
    total = time.perf_counter() - started
    lines = [
        "# Hierarchical synthetic data: accuracy and runtime",
        "",
        "Command: `.venv/bin/python benchmarks/bench_synth.py` "
        f"(single-threaded BLAS; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, shared with other jobs; total {total / 60:.1f} min). "
        "Real ACS 2006–2010 PUMS, Oregon PUMA 600 (`data/pums/README.md`). "
        "Errors are absolute errors of normalised answers (fractions).",
        "",
        "*tables*: the released synthetic households and persons (N_G households sampled from "
        "the fitted model); *model*: the fitted distribution's expected answers (no sampling "
        "error). Q_R is answered on the tables.",
        "",
    ]
    for name in args.datasets:
        lines += describe(infos[name], name)
    lines += [
        "## Released tables: Q_G, Q_I, Q_R",
        "",
        *error_table(rows, "tables", ("Q_G", "Q_I", "Q_R")),
        "",
    ]
    lines += [
        "## Fitted model (expected answers): Q_G, Q_I",
        "",
        *error_table(rows, "model", ("Q_G", "Q_I")),
        "",
    ]
    args.output.write_text("\n".join([*lines, *NOTES]))
    print(f"wrote {args.output} in {total / 60:.1f} min")


if __name__ == "__main__":
    main()
