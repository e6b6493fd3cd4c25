"""HPD-Fixed and HPD-Gen: the two parameterisations of a mixture of product distributions.

Both produce, for K components, one row of logits laid out as (group attributes, household size,
M member slots × individual attributes); a softmax per block gives the probability tables of a
:class:`~censusdp_spark.synth.product.ProductMixture`.

* **HPD-Fixed** (RAP^softmax-like): the K × D logits are the parameters.
* **HPD-Gen** (GEM-like): a two-layer ReLU network with a residual connection maps K draws of
  z ~ N(0, I) to the K × D logits; fresh z every step, so the mixture is the generator's
  distribution and not K fixed rows. Backpropagation is written out by hand.

Both fit the squared error to all noisy measurements so far (plus the exact public mean household
size) with Adam. Structural facts declared by the config (the one head sits in slot 0 and no
other slot holds a head) are imposed by masking logits, so every sampled household is valid.

Fitting touches only noisy measurements and public totals: it is post-processing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from censusdp_spark.synth.domain import HouseholdDomain
from censusdp_spark.synth.product import ProductMixture, Target, expected_answers, loss_and_grad
from censusdp_spark.synth.workloads import WorkloadSet

MASKED = -1e4
"""Logit offset of an impossible level: its probability underflows to exactly 0."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where each probability table's logits live in a component's row of D logits."""

    group: tuple[slice, ...]
    size: slice
    member: tuple[slice, ...]  # M × n_j logits each, slot-major
    width: int
    group_sizes: tuple[int, ...]
    individual_sizes: tuple[int, ...]
    max_members: int
    mask: np.ndarray  # (D,) additive logit mask: 0 or MASKED
    dtype: type

    @classmethod
    def of(cls, domain: HouseholdDomain, dtype: type = np.float32) -> Layout:
        """float32 by default: the fit is memory-bound, and its gradients need no more."""
        pos = 0

        def block(n: int) -> slice:
            nonlocal pos
            pos += n
            return slice(pos - n, pos)

        m = domain.max_members
        group = tuple(block(n) for n in domain.group_sizes)
        size = block(m)
        member = tuple(block(m * n) for n in domain.individual_sizes)
        mask: np.ndarray = np.zeros(pos, dtype=dtype)
        if domain.roles is not None:
            n_rel = domain.individual_sizes[domain.roles.attribute]
            rel = np.zeros((m, n_rel))
            rel[0, :] = MASKED
            rel[0, domain.roles.head] = 0.0
            rel[1:, domain.roles.head] = MASKED
            mask[member[domain.roles.attribute]] = rel.ravel()
        return cls(
            group=group,
            size=size,
            member=member,
            width=pos,
            group_sizes=domain.group_sizes,
            individual_sizes=domain.individual_sizes,
            max_members=m,
            mask=mask,
            dtype=dtype,
        )

    def mixture(self, logits: np.ndarray) -> ProductMixture:
        z = logits.astype(self.dtype, copy=False) + self.mask
        k = len(z)
        return ProductMixture(
            [_softmax(z[:, s]) for s in self.group],
            _softmax(z[:, self.size]),
            [
                np.ascontiguousarray(
                    _softmax(z[:, s].reshape(k, self.max_members, n)).transpose(1, 0, 2)
                )
                for s, n in zip(self.member, self.individual_sizes, strict=True)
            ],
        )

    def logits_grad(self, mix: ProductMixture, grad: ProductMixture) -> np.ndarray:
        """Gradient with respect to the logits, given it with respect to the probabilities."""
        k = mix.components
        out: np.ndarray = np.zeros((k, self.width), dtype=self.dtype)
        for s, p, g in zip(self.group, mix.group, grad.group, strict=True):
            out[:, s] = _softmax_backward(p, g)
        out[:, self.size] = _softmax_backward(mix.size, grad.size)
        for s, p, g in zip(self.member, mix.member, grad.member, strict=True):
            out[:, s] = _softmax_backward(p, g).transpose(1, 0, 2).reshape(k, -1)
        return out


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_backward(p: np.ndarray, g: np.ndarray) -> np.ndarray:
    return p * (g - (p * g).sum(axis=-1, keepdims=True))


class Adam:
    """Adam (Kingma & Ba) over a list of arrays, updated in place."""

    def __init__(
        self, params: Sequence[np.ndarray], lr: float, beta1: float = 0.9, beta2: float = 0.999
    ) -> None:
        self.lr, self.beta1, self.beta2, self.t = lr, beta1, beta2, 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, params: Sequence[np.ndarray], grads: Sequence[np.ndarray]) -> None:
        self.t += 1
        c1, c2 = 1 - self.beta1**self.t, 1 - self.beta2**self.t
        for p, g, m, v in zip(params, grads, self.m, self.v, strict=True):
            m *= self.beta1
            m += (1 - self.beta1) * g
            v *= self.beta2
            v += (1 - self.beta2) * g * g
            p -= self.lr * (m / c1) / (np.sqrt(v / c2) + 1e-8)


class FixedModel:
    """HPD-Fixed: K rows of free logits."""

    def __init__(
        self, layout: Layout, components: int, init_scale: float, rng: np.random.Generator
    ) -> None:
        self.layout = layout
        self.logits: np.ndarray = rng.normal(
            0.0, init_scale, size=(components, layout.width)
        ).astype(layout.dtype)
        self.params = [self.logits]

    def mixture(self) -> ProductMixture:
        return self.layout.mixture(self.logits)

    def fit_step(
        self, targets: Sequence[Target], ratio: float, mean_size: float, adam: Adam
    ) -> float:
        mix = self.mixture()
        loss, grad = loss_and_grad(mix, targets, ratio, mean_size)
        adam.step(self.params, [self.layout.logits_grad(mix, grad)])
        return loss

    def sampling_mixture(self, n: int, rng: np.random.Generator) -> ProductMixture:
        return self.mixture()


class GenModel:
    """HPD-Gen: logits = W3ᵀ(h2) + b3 with h1 = relu(z W1 + b1), h2 = relu(h1 W2 + b2) + h1."""

    def __init__(
        self, layout: Layout, components: int, hidden: int, latent: int, rng: np.random.Generator
    ) -> None:
        self.layout, self.components, self.latent = layout, components, latent

        dtype = layout.dtype

        def he(n_in: int, n_out: int, gain: float = 2.0) -> np.ndarray:
            return rng.normal(0.0, np.sqrt(gain / n_in), size=(n_in, n_out)).astype(dtype)

        self.w1, self.w2, self.w3 = (
            he(latent, hidden),
            he(hidden, hidden),
            he(hidden, layout.width, 0.01),
        )
        self.b1: np.ndarray = np.zeros(hidden, dtype=dtype)
        self.b2: np.ndarray = np.zeros(hidden, dtype=dtype)
        self.b3: np.ndarray = np.zeros(layout.width, dtype=dtype)
        self.params = [self.w1, self.b1, self.w2, self.b2, self.w3, self.b3]
        self.rng = rng

    def forward(self, z: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        a1 = z @ self.w1 + self.b1
        h1 = np.maximum(a1, 0.0)
        a2 = h1 @ self.w2 + self.b2
        h2 = np.maximum(a2, 0.0) + h1
        return h2 @ self.w3 + self.b3, (z, a1, h1, a2, h2)

    def backward(self, d_logits: np.ndarray, cache: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        z, a1, h1, a2, h2 = cache
        d_w3, d_b3 = h2.T @ d_logits, d_logits.sum(axis=0)
        d_h2 = d_logits @ self.w3.T
        d_a2 = d_h2 * (a2 > 0)
        d_w2, d_b2 = h1.T @ d_a2, d_a2.sum(axis=0)
        d_h1 = d_a2 @ self.w2.T + d_h2
        d_a1 = d_h1 * (a1 > 0)
        d_w1, d_b1 = z.T @ d_a1, d_a1.sum(axis=0)
        return [d_w1, d_b1, d_w2, d_b2, d_w3, d_b3]

    def latents(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        return (rng or self.rng).standard_normal((n, self.latent), dtype=self.layout.dtype)

    def mixture(self, z: np.ndarray | None = None) -> ProductMixture:
        logits, _ = self.forward(self.latents(self.components) if z is None else z)
        return self.layout.mixture(logits)

    def fit_step(
        self, targets: Sequence[Target], ratio: float, mean_size: float, adam: Adam
    ) -> float:
        logits, cache = self.forward(self.latents(self.components))
        mix = self.layout.mixture(logits)
        loss, grad = loss_and_grad(mix, targets, ratio, mean_size)
        adam.step(self.params, self.backward(self.layout.logits_grad(mix, grad), cache))
        return loss

    def sampling_mixture(self, n: int, rng: np.random.Generator) -> ProductMixture:
        """One component per household: the generator applied to n fresh latent draws."""
        return self.mixture(self.latents(n, rng))


class HpdSynthesiser:
    """Adaptive Measurements' refit for HPD-Fixed or HPD-Gen: Adam steps on the squared error.

    Adam's state carries over between rounds (a warm start); Gen's answers for selection use one
    fixed batch of latents, so the scores do not jitter with fresh draws.
    """

    def __init__(
        self,
        model: FixedModel | GenModel,
        steps_per_round: int,
        learning_rate: float,
        ratio: float,
        mean_size: float,
    ) -> None:
        self.model, self.steps, self.ratio, self.mean_size = (
            model,
            steps_per_round,
            ratio,
            mean_size,
        )
        self.adam = Adam(model.params, learning_rate)
        self.losses: list[float] = []
        self._eval_z = model.latents(model.components) if isinstance(model, GenModel) else None

    def mixture(self) -> ProductMixture:
        if isinstance(self.model, GenModel):
            return self.model.mixture(self._eval_z)
        return self.model.mixture()

    def answers(self, workloads: WorkloadSet) -> np.ndarray:
        return expected_answers(self.mixture(), workloads, self.ratio)

    def fit(self, targets: Sequence[Target]) -> None:
        for _ in range(self.steps):
            loss = self.model.fit_step(targets, self.ratio, self.mean_size, self.adam)
        self.losses.append(loss)
