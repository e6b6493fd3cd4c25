"""Mixtures of hierarchical product distributions, and query answers in expectation over them.

A component ``k`` of the mixture (Liu & Wu's HPD family) draws a household as
* each group attribute ``j`` independently from ``group[j][k]``;
* the size ``s`` in 1 … M from ``size[k]``; slots ``0 … s−1`` are present;
* each present slot ``m`` and individual attribute ``j`` independently from ``member[j][m, k]``.

The mixture is the uniform average over its K components. For a workload with group values
``g`` on S_G and person values ``c`` on S_I, with P_k(g) = Π_j group[j][k, g_j] and
a_km(c) = Π_j member[j][m, k, c_j]:

* Q_G: E = (1/K) Σ_k P_k(g) · (1 − Σ_s size[k, s] Π_{m<s} (1 − a_km(c)))  — "at least one
  present member satisfies c";
* Q_I: E = (N_G/N_I) (1/K) Σ_k P_k(g) · Σ_m Pr_k(size > m) a_km(c) — expected count of such
  members per household, over the public mean household size N_I/N_G;
* size: E = (1/K) Σ_k size[k, s].

:func:`loss_and_grad` returns the squared-error loss against noisy measurements and its exact
gradient with respect to every probability table (reverse-mode, written out by hand; checked
against finite differences in the tests). Everything is vectorised over K, M and the cells; member
tables are slot-major (M, K, n) so the running products over slots read contiguous blocks.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from censusdp_spark.synth.workloads import GROUP, INDIVIDUAL, SIZE, Workload, WorkloadSet

PUBLIC_SIZE_WEIGHT = 10.0
"""Weight of the public mean household size N_I/N_G (exact, free) in the fitting loss."""


@dataclass
class ProductMixture:
    group: list[np.ndarray]  # per group attribute: (K, n_j)
    size: np.ndarray  # (K, M): probability of size 1 … M
    member: list[np.ndarray]  # per individual attribute, slot-major: (M, K, n_j)

    @property
    def components(self) -> int:
        return int(self.size.shape[0])

    @property
    def max_members(self) -> int:
        return int(self.size.shape[1])

    def zeros_like(self) -> ProductMixture:
        return ProductMixture(
            [np.zeros_like(a) for a in self.group],
            np.zeros_like(self.size),
            [np.zeros_like(a) for a in self.member],
        )

    def mean_size(self) -> float:
        return float((self.size * np.arange(1, self.max_members + 1)).sum(axis=1).mean())


@dataclass(frozen=True)
class Target:
    """A noisy measurement to fit: the workload, its noisy (normalised) answers and the weight of
    its squared error (its inverse noise variance, relative to the other measurements)."""

    workload: Workload
    noisy: np.ndarray
    weight: float = 1.0


def outer(
    factors: Sequence[np.ndarray], lead: tuple[int, ...], dtype: np.dtype | type = np.float64
) -> np.ndarray:
    """C-order outer product over the last axis of each factor; ones((*lead, 1)) if none."""
    if not factors:
        return np.ones((*lead, 1), dtype=dtype)
    out = factors[0]
    for f in factors[1:]:
        out = (out[..., :, None] * f[..., None, :]).reshape(*lead, -1)
    return out


def outer_backward(factors: Sequence[np.ndarray], grad: np.ndarray) -> list[np.ndarray]:
    """Gradient of each factor given the gradient of ``outer(factors)``."""
    if len(factors) == 1:
        return [grad]
    lead = factors[0].shape[:-1]
    letters = string.ascii_lowercase[: len(factors)]
    batch = "XYZ"[: len(lead)]
    g = grad.reshape(*lead, *(f.shape[-1] for f in factors))
    full = batch + letters
    out = []
    for j in range(len(factors)):
        others = [f"{batch}{letters[i]}" for i in range(len(factors)) if i != j]
        spec = f"{full}," + ",".join(others) + f"->{batch}{letters[j]}"
        out.append(np.einsum(spec, g, *[factors[i] for i in range(len(factors)) if i != j]))
    return out


def running_product(e: np.ndarray) -> np.ndarray:
    """Cumulative product over the first axis (a slot loop: far faster than ``np.cumprod``)."""
    out = np.empty_like(e)
    out[0] = e[0]
    for t in range(1, len(e)):
        np.multiply(out[t - 1], e[t], out=out[t])
    return out


class _Forward:
    """Shared intermediate tables of one mixture, cached per attribute set."""

    def __init__(self, mix: ProductMixture, ratio: float) -> None:
        self.mix = mix
        self.ratio = ratio  # N_G / N_I
        k, m = mix.size.shape
        self.k, self.m, self.dtype = k, m, mix.size.dtype
        # Pr(size > m) for slot m = 0 … M−1.
        self.survival = np.cumsum(mix.size[:, ::-1], axis=1)[:, ::-1]
        self._group: dict[tuple[int, ...], np.ndarray] = {}
        self._slots: dict[tuple[int, ...], np.ndarray] = {}
        self._b: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}
        self._none: dict[tuple[int, ...], np.ndarray] = {}

    def group(self, attrs: tuple[int, ...]) -> np.ndarray:
        if attrs not in self._group:
            self._group[attrs] = outer([self.mix.group[j] for j in attrs], (self.k,), self.dtype)
        return self._group[attrs]

    def slots(self, attrs: tuple[int, ...]) -> np.ndarray:
        if attrs not in self._slots:
            self._slots[attrs] = outer(
                [self.mix.member[j] for j in attrs], (self.m, self.k), self.dtype
            )
        return self._slots[attrs]

    def member_term(self, kind: str, attrs: tuple[int, ...]) -> np.ndarray:
        """(K, n_c): Pr(some present member has c) for Q_G, ratio · E[#members with c] for Q_I."""
        key = (kind, attrs)
        if key not in self._b:
            a = self.slots(attrs)
            if kind == GROUP:
                self._b[key] = 1.0 - np.einsum("km,mkc->kc", self.mix.size, self.none(attrs))
            else:
                self._b[key] = self.ratio * np.einsum("km,mkc->kc", self.survival, a)
        return self._b[key]

    def none(self, attrs: tuple[int, ...]) -> np.ndarray:
        """(M, K, n_c): F_t = Π_{m≤t} (1 − a_m), no member among the first t+1 has c."""
        if attrs not in self._none:
            self._none[attrs] = running_product(1.0 - self.slots(attrs))
        return self._none[attrs]

    def answer(self, w: Workload) -> np.ndarray:
        if w.kind == SIZE:
            return self.mix.size.mean(axis=0)
        if w.kind not in (GROUP, INDIVIDUAL):
            raise ValueError(f"{w.kind} workloads have no expected answers under a product mixture")
        return (self.group(w.group).T @ self.member_term(w.kind, w.person) / self.k).ravel()


def expected_answers(mix: ProductMixture, workloads: WorkloadSet, ratio: float) -> np.ndarray:
    """Expected normalised answers of every query of ``workloads`` (Q_G, Q_I, size)."""
    forward = _Forward(mix, ratio)
    out = np.empty(workloads.n_queries)
    for i, w in enumerate(workloads.workloads):
        out[workloads.cells(i)] = forward.answer(w)
    return out


def loss_and_grad(
    mix: ProductMixture, targets: Sequence[Target], ratio: float, mean_size: float | None = None
) -> tuple[float, ProductMixture]:
    """Σ_targets weight · ‖answers − noisy‖² (+ the public mean-size term) and its gradient."""
    forward = _Forward(mix, ratio)
    grad = mix.zeros_like()
    k, m = forward.k, forward.m
    loss = 0.0
    for target in targets:
        w = target.workload
        residual = forward.answer(w) - target.noisy
        loss += target.weight * float(residual @ residual)
        g = (2.0 * target.weight * residual).astype(forward.dtype)
        if w.kind == SIZE:
            grad.size += g[None, :] / k
            continue
        p = forward.group(w.group)
        b = forward.member_term(w.kind, w.person)
        g = g.reshape(w.n_group, w.n_person)
        d_p = b @ g.T / k  # (K, n_g)
        d_b = p @ g / k  # (K, n_c)
        if w.group:
            for j, d in zip(
                w.group, outer_backward([mix.group[j] for j in w.group], d_p), strict=True
            ):
                grad.group[j] += d
        a = forward.slots(w.person)  # (M, K, n_c)
        if w.kind == GROUP:
            none = forward.none(w.person)  # F_t = Π_{m≤t} E_m with E = 1 − a
            grad.size -= np.einsum("kc,tkc->kt", d_b, none)
            # dF_t = −dB σ_t; dE_m = F_{m−1} · R_m with R_m = dF_m + E_{m+1} R_{m+1}; dA = −dE.
            d_a = np.empty_like(a)
            running = np.zeros_like(d_b)
            for slot in range(m - 1, -1, -1):
                d_none = -d_b * mix.size[:, slot, None]
                running = d_none if slot == m - 1 else d_none + (1.0 - a[slot + 1]) * running
                d_a[slot] = -(none[slot - 1] * running if slot else running)
        else:
            d_a = ratio * forward.survival.T[:, :, None] * d_b[None, :, :]
            d_survival = ratio * np.einsum("mkc,kc->km", a, d_b)
            grad.size += np.cumsum(d_survival, axis=1)
        if w.person:
            for j, d in zip(
                w.person, outer_backward([mix.member[j] for j in w.person], d_a), strict=True
            ):
                grad.member[j] += d
    if mean_size is not None:
        sizes = np.arange(1, m + 1)
        gap = (mix.mean_size() - mean_size) / m
        loss += PUBLIC_SIZE_WEIGHT * gap * gap
        grad.size += 2.0 * PUBLIC_SIZE_WEIGHT * gap / m * sizes[None, :] / k
    return loss, grad
