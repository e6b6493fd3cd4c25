"""HPD fitting: hand-written gradients against central finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp_spark.synth.hpd import FixedModel, GenModel, Layout
from censusdp_spark.synth.product import Target, loss_and_grad
from censusdp_spark.synth.sampling import sample_product_mixture
from censusdp_spark.synth.workloads import marginal_workloads, size_workload
from tests.helpers.synth import HEAD, small_domain

EPS = 1e-6


def targets(domain, seed: int) -> list[Target]:
    rng = np.random.default_rng(seed)
    workloads = (
        marginal_workloads(domain, 2) + marginal_workloads(domain, 3) + size_workload(domain)
    )
    return [Target(w, rng.random(w.n_cells) * 0.4) for w in workloads.workloads[::2]]


def loss(layout: Layout, logits: np.ndarray, measured: list[Target]) -> float:
    return loss_and_grad(layout.mixture(logits), measured, 0.55, 2.1)[0]


def test_fixed_gradient_matches_finite_differences():
    domain = small_domain()
    layout = Layout.of(domain, np.float64)
    measured = targets(domain, 0)
    logits = np.random.default_rng(1).normal(0, 1, (3, layout.width))
    mix = layout.mixture(logits)
    grad = layout.logits_grad(mix, loss_and_grad(mix, measured, 0.55, 2.1)[1])
    numeric = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape):
        up, down = logits.copy(), logits.copy()
        up[idx] += EPS
        down[idx] -= EPS
        numeric[idx] = (loss(layout, up, measured) - loss(layout, down, measured)) / (2 * EPS)
    assert np.abs(grad).max() > 1e-3
    np.testing.assert_allclose(grad, numeric, atol=1e-7)


def test_generator_backpropagation_matches_finite_differences():
    domain = small_domain()
    layout = Layout.of(domain, np.float64)
    measured = targets(domain, 2)
    model = GenModel(layout, components=4, hidden=6, latent=3, rng=np.random.default_rng(3))
    model.w3 *= 30  # a generator far from uniform, so every gradient is sizeable
    z = model.latents(4)

    def value() -> float:
        return loss(layout, model.forward(z)[0], measured)

    logits, cache = model.forward(z)
    mix = layout.mixture(logits)
    grads = model.backward(
        layout.logits_grad(mix, loss_and_grad(mix, measured, 0.55, 2.1)[1]), cache
    )
    for param, grad in zip(model.params, grads, strict=True):
        for idx in list(np.ndindex(*param.shape))[:: max(1, param.size // 25)]:
            old = param[idx]
            param[idx] = old + EPS
            up = value()
            param[idx] = old - EPS
            down = value()
            param[idx] = old
            assert grad[idx] == pytest.approx((up - down) / (2 * EPS), abs=1e-7)


def test_masks_put_the_one_head_in_slot_zero_of_every_sampled_household():
    domain = small_domain()
    layout = Layout.of(domain)
    model = FixedModel(layout, components=8, init_scale=2.0, rng=np.random.default_rng(4))
    h = sample_product_mixture(model.mixture(), 500, np.random.default_rng(5))
    rel = h.members[:, :, 0]
    assert (rel[:, 0] == HEAD).all()
    assert ((rel[:, 1:] == HEAD).sum()) == 0
    assert set(np.unique(h.sizes)) == set(range(1, domain.max_members + 1))
