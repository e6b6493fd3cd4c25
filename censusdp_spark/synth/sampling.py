"""Sampling synthetic households from a fitted model (post-processing of the noisy measurements).

Draws are by inverse CDF on uniforms from the generator passed in (a keyed stream in the job, so
the same secret reproduces the same tables). Slot 0 is always present; slots ``1 … size−1`` are
filled, the rest left ``ABSENT``.
"""

from __future__ import annotations

import numpy as np

from censusdp_spark.synth.domain import ABSENT, Households
from censusdp_spark.synth.product import ProductMixture


def categorical(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row of ``probs`` (..., n), by inverse CDF."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[:-1]) * cdf[..., -1]
    return np.minimum((cdf < u[..., None]).sum(axis=-1), probs.shape[-1] - 1)


def spread_components(components: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Component of each of n households: every component ⌊n/K⌋ or ⌈n/K⌉ times, in random order."""
    base = np.resize(np.arange(components), n)
    return rng.permutation(base)


def sample_product_mixture(
    mix: ProductMixture, n: int, rng: np.random.Generator, one_per_component: bool = False
) -> Households:
    """n households from the mixture (``one_per_component``: household i from component i)."""
    if one_per_component:
        if mix.components != n:
            raise ValueError(
                f"one household per component needs {n} components, got {mix.components}"
            )
        comp = np.arange(n)
    else:
        comp = spread_components(mix.components, n, rng)
    group = np.stack([categorical(p[comp], rng) for p in mix.group], axis=1).astype(np.int16)
    size = categorical(mix.size[comp], rng) + 1
    members = np.stack(
        [categorical(p[:, comp].transpose(1, 0, 2), rng) for p in mix.member], axis=2
    )
    members = members.astype(np.int16)
    members[np.arange(mix.max_members)[None, :] >= size[:, None]] = ABSENT
    return Households(group, members)
