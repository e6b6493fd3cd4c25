"""benchmarks/bench_production.py's bootstrap interval of a ratio of means over secrets: the
secrets are resampled in pairs, resamples whose denominator is 0 are dropped, and the report's
per-query table shows the interval beside each ratio."""

from __future__ import annotations

import itertools

import bench_production
import numpy as np


def test_a_ratio_the_same_on_every_secret_has_no_spread():
    den = np.array([3.0, 5.0, 1.0, 8.0])
    low, high = bench_production.bootstrap_interval(0.6 * den, den)
    assert np.isclose(low, 0.6) and np.isclose(high, 0.6)


def test_the_interval_matches_the_enumerated_bootstrap_distribution():
    num, den = np.array([1.0, 4.0, 2.0]), np.array([2.0, 3.0, 5.0])
    exact = [
        num[list(p)].mean() / den[list(p)].mean() for p in itertools.product(range(3), repeat=3)
    ]
    low, high = bench_production.bootstrap_interval(num, den)
    assert min(exact) <= low < high <= max(exact)
    # 10,000 seeded resamples against the 27 equally likely ones: the tails agree to a step
    assert abs(np.mean(np.array(exact) < low) - 0.025) < 0.08
    assert abs(np.mean(np.array(exact) > high) - 0.025) < 0.08


def test_resamples_with_a_zero_denominator_are_dropped():
    low, high = bench_production.bootstrap_interval(np.ones(3), np.array([0.0, 0.0, 2.0]))
    assert np.isfinite(low) and np.isfinite(high)
    assert 0.5 - 1e-12 <= low <= high <= 1.5 + 1e-12  # one, two or three 2s among the picks


def test_the_query_table_shows_each_ratio_with_its_interval():
    def run(secret: int, method: str, value: float) -> dict:
        errors = [{"level": "tract", "metric": "mean_l1", "query": "total", "value": value}]
        return {"input": "perry", "secret": secret, "method": method, "errors": errors}

    runs = [run(s, "topdown", 2.0 + s) for s in range(4)]
    runs += [run(s, "full_information", 1.0 + s / 2) for s in range(4)]
    table = bench_production.query_table(
        runs, "perry", ["tract"], "full_information", "topdown", intervals=True
    )
    assert table[-1] == "| tract | 0.50 (0.50-0.50) |"
