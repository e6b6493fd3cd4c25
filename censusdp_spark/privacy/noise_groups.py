"""A noise group's measurements, noised from one keyed stream: the draw both noise passes share.

Privacy claim
-------------
None of its own: each measurement gets independent noise from ``sampler`` at its ``scale``,
so what it costs is the sampler's claim (``privacy.samplers``) for that measurement's
sensitivity, composed as the caller's accounting says. What this module promises is how the
noise is drawn, on which the claims and a retried task both rest: every value of every
measurement comes, in order, from the one stream ``keyed_rng(secret, *key)``, one sampler call
per measurement. Distinct keys give independent streams (``privacy.streams``), and within a
stream every draw is fresh, so the noise of every value is independent of every other and of
the data; the same secret, key and measurement shapes draw the same noise again, bit for bit.
The caller keys the stream by what depends only on the public geography (the release, the
level, the group's ancestor) and passes the measurements in an order that does too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction

import numpy as np

from censusdp_spark.privacy.streams import keyed_rng

Sampler = Callable[[Fraction, int, np.random.Generator], np.ndarray]
"""``(scale, size, rng) -> size`` int64 draws: ``discrete_gaussian`` (scale σ²) or
``discrete_laplace`` (scale b)."""


def noisy_measurements(
    secret: bytes,
    key: tuple[str | int, ...],
    measurements: Iterable[tuple[np.ndarray, Fraction]],
    sampler: Sampler,
) -> list[np.ndarray]:
    """Each exact ``(measurement, scale)`` plus noise of its shape: ``sampler(scale, size,
    rng)`` reshaped, in the order given, all from the stream ``keyed_rng(secret, *key)``.
    ``measurements`` is read lazily, one at a time, so a caller can compute each as it is
    noised (confidential until then)."""
    rng = keyed_rng(secret, *key)
    return [
        exact + sampler(scale, exact.size, rng).reshape(exact.shape)
        for exact, scale in measurements
    ]
