"""A noise group's measurements take their noise, in order, from the one stream of their key."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from censusdp_spark.privacy import (
    discrete_gaussian,
    discrete_laplace,
    keyed_rng,
    noisy_measurements,
)

SECRET = bytes(range(32))
KEY = ("release", "county", "44001")


def test_each_measurement_takes_the_next_draws_of_the_one_stream_in_its_shape():
    first, second = np.arange(6).reshape(2, 3), np.full((2, 5), 10)
    noisy = noisy_measurements(
        SECRET, KEY, [(first, Fraction(4)), (second, Fraction(1, 2))], discrete_gaussian
    )
    rng = keyed_rng(SECRET, *KEY)
    expected = [
        first + discrete_gaussian(Fraction(4), 6, rng).reshape(2, 3),
        second + discrete_gaussian(Fraction(1, 2), 10, rng).reshape(2, 5),
    ]
    assert [a.shape for a in noisy] == [(2, 3), (2, 5)]
    assert all(np.array_equal(a, b) for a, b in zip(noisy, expected, strict=True))


def test_the_same_key_redraws_the_same_noise_and_another_key_does_not():
    zeros = np.zeros((3, 4), dtype=np.int64)
    draw = [(zeros, Fraction(3))]
    (noisy,) = noisy_measurements(SECRET, KEY, draw, discrete_laplace)
    (again,) = noisy_measurements(SECRET, KEY, draw, discrete_laplace)
    (other,) = noisy_measurements(SECRET, (*KEY[:2], "44003"), draw, discrete_laplace)
    assert np.array_equal(noisy, again)
    assert not np.array_equal(noisy, other)
