"""Contracts of the samplers that need no statistics: the draws for a given stream never change,
and drawing many streams at once gives each exactly its own one-stream draws (the laws
themselves are tested in ``tests/statistical/test_samplers.py``)."""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np
import pytest

from censusdp_spark.privacy import (
    bernoulli_exp_minus,
    discrete_gaussian,
    discrete_gaussian_rows,
    discrete_laplace,
    exponential_mechanism,
    keyed_rng,
    samplers,
)

SECRET = bytes(range(32))
BASELINE_SIGMA2 = Fraction(114921, 293764)  # 1 / rho of the RI demo
ROWS_CASES = [
    (BASELINE_SIGMA2, 16),
    (Fraction(1, 2), 1),
    (Fraction(1, 1000), 16),
    (Fraction(101, 10), 37),
    (Fraction(7956), 50),
    (Fraction(2**34), 20),  # t > 2**16: bounded draws come from rng.integers
]


def rng_for(*key: str | int) -> np.random.Generator:
    return keyed_rng(SECRET, "tests/privacy/samplers", *key)


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.int64).tobytes()).hexdigest()[:16]


def test_the_draws_of_a_stream_are_the_ones_every_earlier_version_drew():
    """A resumed run redraws the noise it drew before, so these values may never change."""
    draws = np.concatenate(
        [
            discrete_gaussian(BASELINE_SIGMA2, 1000, rng_for("gaussian")),
            discrete_gaussian(Fraction(7956), 100, rng_for("wide gaussian")),
            discrete_gaussian(Fraction(2**34), 10, rng_for("huge gaussian")),
            discrete_laplace(Fraction(5, 2), 100, rng_for("laplace")),
            bernoulli_exp_minus([Fraction(1, 3), Fraction(22, 7), 0] * 30, rng_for("bernoulli")),
            [
                exponential_mechanism([Fraction(1, 3), 0, Fraction(5, 3)], 1, 1, rng_for("em", i))
                for i in range(20)
            ],
        ]
    )
    assert digest(draws) == "a1e865302e73cb6f"  # drawn by the samplers of d45da4a


def assert_rows_are_the_one_stream_draws(sigma2: Fraction, size: int, n: int, tag: str) -> None:
    keys = [(tag, str(sigma2), size, i) for i in range(n)]
    rngs = [rng_for(*key) for key in keys]
    got = discrete_gaussian_rows(sigma2, size, rngs)
    assert got.shape == (n, size) and got.dtype == np.int64
    for key, row, rng in zip(keys, got, rngs, strict=True):
        alone = rng_for(*key)
        np.testing.assert_array_equal(row, discrete_gaussian(sigma2, size, alone), err_msg=key)
        # ... and the generator is left where the one-stream call leaves it.
        np.testing.assert_array_equal(
            rng.bit_generator.random_raw(4), alone.bit_generator.random_raw(4), err_msg=key
        )


@pytest.mark.parametrize(("sigma2", "size"), ROWS_CASES, ids=str)
def test_many_streams_at_once_draw_each_stream_exactly_as_alone(sigma2, size):
    assert_rows_are_the_one_stream_draws(sigma2, size, 300, "rows")


@pytest.mark.parametrize("digit_bits", [2, 4])
def test_many_streams_stay_exact_when_most_draws_tie_on_the_first_digit(monkeypatch, digit_bits):
    """Ties are settled one draw at a time from the tied draw's own stream."""
    monkeypatch.setattr(samplers, "_DIGIT_BITS", digit_bits)
    for sigma2, size in ROWS_CASES[:4]:
        assert_rows_are_the_one_stream_draws(sigma2, size, 100, f"ties {digit_bits}")


def test_many_streams_stay_exact_when_rows_need_more_batches(monkeypatch):
    """With batches sized for an acceptance rate far too high, most rows need several, each row
    with its own number of trials."""
    monkeypatch.setattr(samplers, "_gaussian_acceptance_rate", lambda p, q: 3.0)
    for sigma2, size in ROWS_CASES[:4]:
        assert_rows_are_the_one_stream_draws(sigma2, size, 100, "batches")


def test_many_streams_stay_exact_when_a_call_spans_several_bounded_batches(monkeypatch):
    """Calls of more than ``_BATCH_DRAWS`` draws run in batches of at most that many, the same
    for one stream and for many."""
    monkeypatch.setattr(samplers, "_BATCH_DRAWS", 7)
    for sigma2, size in ROWS_CASES[:4]:
        assert_rows_are_the_one_stream_draws(sigma2, size, 100, "bounded batches")


def test_calls_within_the_batch_bound_draw_as_without_it(monkeypatch):
    size = 1000
    unbounded = discrete_gaussian(BASELINE_SIGMA2, size, rng_for("bound"))
    monkeypatch.setattr(samplers, "_BATCH_DRAWS", size)
    np.testing.assert_array_equal(
        discrete_gaussian(BASELINE_SIGMA2, size, rng_for("bound")), unbounded
    )
    monkeypatch.setattr(samplers, "_BATCH_DRAWS", size - 1)
    assert (discrete_gaussian(BASELINE_SIGMA2, size, rng_for("bound")) != unbounded).any()


def test_no_rows_or_no_draws():
    assert discrete_gaussian_rows(BASELINE_SIGMA2, 16, []).shape == (0, 16)
    assert discrete_gaussian_rows(BASELINE_SIGMA2, 0, [rng_for("empty")] * 3).shape == (3, 0)


def test_many_streams_refuse_what_one_stream_refuses():
    with pytest.raises(TypeError, match="Fraction"):
        discrete_gaussian_rows(0.5, 4, [rng_for("float")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative"):
        discrete_gaussian_rows(BASELINE_SIGMA2, -1, [rng_for("negative")])
