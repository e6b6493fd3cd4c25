"""At the leaves, ``full_information``'s fit to the bottom-up estimates is ``topdown``'s fit to
the noisy answers (``bottom_up.leaves_fit_their_answers``), which the job therefore runs there:
on random leaf families of the 16-cell demo and the 2,016-cell production schema, with and
without invariant leaf totals and with zero cells in the parent, both give the same fractional
fit and roundings of the same cost."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.topdown.bottom_up import (
    ChildEstimates,
    _leaf_task,
    config_layout,
    leaves_fit_their_answers,
    level_design,
)
from censusdp_spark.topdown.config import TopDownConfig, load_topdown_config
from censusdp_spark.topdown.estimate import family_arrays, level_plan
from censusdp_spark.topdown.full_information import _rounding_problem
from censusdp_spark.topdown.solvers.gaussian_estimates import fitting_targets
from censusdp_spark.topdown.solvers.least_squares import solve_children, solve_to_targets
from censusdp_spark.topdown.solvers.rounding import round_children
from censusdp_spark.topdown.solvers.subproblem import ChildrenProblem, PrecisionProblem

ROOT = Path(__file__).resolve().parents[2]


def leaf_family(
    config: TopDownConfig, rng: np.random.Generator, exact_totals: bool
) -> tuple[np.ndarray, pd.DataFrame]:
    """A parent's integer histogram and its children's rows of ``noisy_measurements`` (sorted
    by geocode then query, as the estimation reads them), with their ``inv_total``."""
    level = config.hierarchy.names[-1]
    n_cells = config.schema.n_cells
    live = np.ones(n_cells, dtype=bool)
    live[list(config.structural_zero_cells)] = False
    live &= rng.random(n_cells) < 0.7  # the parent is zero in the other cells
    k = int(rng.integers(2, 6))
    truth = np.where(live, rng.poisson(rng.uniform(0.2, 4.0), size=(k, n_cells)), 0)
    rows = []
    for c in range(k):
        for q in sorted(config.queries[level], key=lambda q: q.name):
            sigma2 = config.budget.sigma2_for(level, q.name)
            scale = float(sigma2) ** 0.5
            answer = q.answer(np.arange(n_cells), truth[c])
            noisy = np.rint(answer + rng.normal(scale=scale, size=q.size)).astype(np.int64)
            rows.append(
                {
                    "geocode": f"{c:04d}",
                    "query": q.name,
                    "noisy": noisy,
                    "sigma2": str(Fraction(sigma2)),
                    "inv_total": int(truth[c].sum()) if exact_totals else None,
                }
            )
    return truth.sum(axis=0), pd.DataFrame(rows)


def query_deviation(problem: ChildrenProblem, x: np.ndarray, x_hat: np.ndarray) -> float:
    """The rounder's objective: the L1 deviation of every query's answers of ``x`` from
    ``x_hat``'s, summed over children and queries."""
    return sum(
        float(np.abs(
            np.stack([np.bincount(m, r, minlength=size) for r in x - x_hat])
        ).sum())
        for m, size in zip(problem.marginals, problem.marginal_sizes, strict=True)
    )  # fmt: skip


@pytest.mark.parametrize(
    ("config_name", "seeds"),
    [("ri_2010_demo.toml", range(40)), ("pl94_2020_production.toml", range(3))],
)
@pytest.mark.parametrize("exact_totals", [False, True])
def test_full_information_at_the_leaves_is_topdowns_fit(config_name, seeds, exact_totals):
    """Same fractional fit (to round-off) from the noisy answers and from the bottom-up
    estimates, and roundings of equal cost: the rounder's optimum is often not unique (L1 ties),
    so round-off alone may pick another of the optimal roundings."""
    config = load_topdown_config(ROOT / "conf" / config_name)
    assert leaves_fit_their_answers(config)
    plan = level_plan(config, config.hierarchy.names[-1])
    design = level_design(plan, config_layout(config))
    for seed in seeds:
        parent, family = leaf_family(config, np.random.default_rng(seed), exact_totals)
        _, noisy, weights, totals = family_arrays(plan, family)
        active = np.flatnonzero((parent > 0) & ~plan.structural_zero)
        parent_active = parent[active].astype(np.int64)
        from_answers = ChildrenProblem(
            marginals=tuple(c2m[active] for c2m in plan.cell_to_marginal),
            marginal_sizes=plan.marginal_sizes,
            weights=weights,
            noisy=noisy,
            parent=parent_active,
            child_totals=totals,
        )
        x_answers = solve_children(from_answers)

        children = ChildEstimates(design, is_leaf=True, plan=plan)
        rows = _leaf_task(plan, design)(family)
        estimates = children.estimates(rows)
        free = parent[~plan.structural_zero] > 0
        targets, precisions = fitting_targets(estimates, children.precisions(rows, estimates), free)
        x_bottom_up = solve_to_targets(
            PrecisionProblem(
                targets=targets, precisions=precisions, parent=parent_active, child_totals=totals
            )
        )
        scale = max(1.0, float(np.abs(x_answers).max()))
        np.testing.assert_allclose(x_bottom_up, x_answers, rtol=0, atol=1e-7 * scale)

        rounded_answers = round_children(from_answers, x_answers)
        rounding = _rounding_problem(plan, active, x_bottom_up, parent_active, totals)
        rounded_bottom_up = round_children(rounding, x_bottom_up)
        for rounded in (rounded_answers, rounded_bottom_up):
            np.testing.assert_array_equal(rounded.sum(axis=0), parent_active)
            if totals is not None:
                np.testing.assert_array_equal(rounded.sum(axis=1), totals)
        # Each rounding is optimal at its own fit; measured at x_answers, two such roundings'
        # costs differ by at most twice the fits' own deviation from each other (round-off).
        drift = query_deviation(from_answers, x_bottom_up, x_answers)
        assert query_deviation(from_answers, rounded_answers, x_answers) == pytest.approx(
            query_deviation(from_answers, rounded_bottom_up, x_answers), abs=2 * drift + 1e-9
        )


def test_a_total_first_pass_or_bypassing_keeps_the_bottom_up_path_at_the_leaves(tmp_path):
    text = (ROOT / "conf" / "ri_2010_demo.toml").read_text()
    assert "\n[estimation]\n" in text
    passes = tmp_path / "passes.toml"
    passes.write_text(
        text.replace("\n[estimation]\n", '\n[estimation]\npasses = ["total", "all"]\n')
    )
    bypass = tmp_path / "bypass.toml"
    bypass.write_text(text.replace("\n[budget]\n", "\n[budget]\nbypass_single_child = true\n"))
    assert not leaves_fit_their_answers(load_topdown_config(passes))
    assert not leaves_fit_their_answers(load_topdown_config(bypass))
