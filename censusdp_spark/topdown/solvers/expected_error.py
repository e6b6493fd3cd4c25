"""The expected error of a measurement strategy, from the shape of the tree alone (no data).

Model. The tree is *homogeneous*: every node of level ``i`` has ``fanouts[i]`` children (the
level's mean fan-out on a real spine, a real number). Each level's queries are measured with
independent noise of variance ``1 / w_q`` (``LevelDesign``); the estimators are linear, their
non-negativity, integrality and rounding left out. With identical siblings the estimates are:

* ``full_information``: each node's bottom-up BLUE from its subtree's measurements (what
  ``gaussian_estimates.update`` computes node by node), covariance ``U_i``: in precision form
  ``P_leaf = I_leaf`` and ``P_i = P_{i+1} / k + I_i`` (``I_i`` the node's own information
  ``sum_q w_q Q_q^T Q_q``; the sum of ``k`` independent children of covariance ``U`` has
  precision ``P / k``), ``U_i = P_i^{-1}``. Then the top-down fit of a family to its parent's
  final estimate, ``x_c = u_c + (p - sum_j u_j) / k`` (the weighted fit of equal weights): the
  Rauch-Tung-Striebel smoother of the tree, so the final covariance is exactly the GLS of
  every measurement of the tree: ``F_c = U + (F_p - k U) / k^2``, with ``F_root = U_root``.
* ``topdown``: the same fit with ``u_c`` each node's GLS from its own measurements alone
  (``U_i = I_i^{-1}``); the parent's estimate is independent of the children's measurements,
  and the same formula follows: ``F_c = U - U / k + F_p / k^2``.

An invariant total (``exact_totals[i]``: the level's node totals are public, and so every
level's above) conditions ``U_i`` on it: ``U_i = Z (Z^T P_i Z)^{-1} Z^T`` with ``Z`` a basis of
the complement of the all-ones vector, and ``F`` has no variance along it. A field of a released table
(a 0/1 combination ``f`` of the active cells) has variance ``f^T F f`` at every node of its
level, and, its error being Gaussian, an expected absolute error ``sqrt(2 f^T F f / pi)``.

Covariances are dense or compact (``symmetric_covariance``) as the designs' layout says, so a
2,016-cell schema costs a few 15 x 15 blocks a level, not 2,016 x 2,016 matrices: every matrix
here is a stack of blocks ``(C, d, d)`` (dense: one ``n x n`` block), the all-ones vector
lives in block 0 alone, and the information is linear in the weights
(``unit_informations``), so an optimizer's evaluation is a few small inverses.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Literal

import numpy as np
from scipy.linalg import null_space

from censusdp_spark.topdown.solvers.gaussian_estimates import Covariance, LevelDesign
from censusdp_spark.topdown.solvers.symmetric_covariance import (
    SymmetricLayout,
    SymmetricMatrix,
    information_matrix,
)

Method = Literal["full_information", "topdown"]
IDENTIFIED = 1e-10
"""A precision block whose smallest eigenvalue is below this times its largest (or 1) leaves
some cell unidentified."""


def unit_informations(design: LevelDesign) -> np.ndarray:
    """``Q_q^T Q_q`` of each of the level's queries at weight 1, as blocks ``(queries, C, d,
    d)``: ``C = 1, d = n`` dense, else the compact layout's ``2^k`` blocks over the core. A
    level's information at weights ``w`` is ``sum_q w_q`` of them (linear in the weights)."""
    if design.layout is None:
        n = design.n_cells
        grams = []
        for cell_to_marginal, size in zip(design.marginals, design.marginal_sizes, strict=True):
            query = np.zeros((size, n))
            query[cell_to_marginal, np.arange(n)] = 1.0
            grams.append((query.T @ query)[None])
        return np.stack(grams)
    return np.stack(
        [information_matrix(design.layout, [m], np.ones(1)).blocks for m in design.marginals]
    )


def final_covariances(
    designs: Sequence[LevelDesign],
    fanouts: Sequence[float],
    exact_totals: Sequence[bool],
    method: Method = "full_information",
) -> list[Covariance]:
    """Each level's covariance of a node's final (unrounded) estimate, root first: dense, or
    compact in the designs' layout.

    ``fanouts[i]``: children per node of level ``i - 1`` (``fanouts[0]`` is not read);
    ``exact_totals[i]``: level ``i``'s node totals are invariant. Raises ``ValueError`` naming
    the level when a level whose own GLS is needed does not identify every cell."""
    informations = [
        np.einsum("q,qcij->cij", np.asarray(d.weights, dtype=np.float64), unit_informations(d))
        for d in designs
    ]
    blocks = final_blocks(informations, fanouts, exact_totals, [d.level for d in designs], method)
    layout = designs[0].layout
    return [as_covariance(b, layout) for b in blocks]


def as_covariance(blocks: np.ndarray, layout: SymmetricLayout | None) -> Covariance:
    """Blocks ``(C, d, d)`` as a dense matrix (``C = 1``) or a compact one of ``layout``."""
    return blocks[0] if layout is None else SymmetricMatrix(layout, blocks)


def final_blocks(
    informations: Sequence[np.ndarray],
    fanouts: Sequence[float],
    exact_totals: Sequence[bool],
    levels: Sequence[str],
    method: Method = "full_information",
) -> list[np.ndarray]:
    """``final_covariances`` from each level's information blocks ``(C, d, d)`` (a node's own
    measurements): in precision form, the bottom-up pass is ``P_i = P_{i+1} / k + I_i`` (the sum
    of ``k`` children of covariance ``U`` has precision ``P / k``), ``U_i = P_i^{-1}``, on the
    complement of the all-ones vector (block 0's ``1^perp``) where the totals are exact."""
    if not (len(informations) == len(fanouts) == len(exact_totals) == len(levels)):
        raise ValueError("final_covariances: one design, fan-out and total flag per level")
    if not informations:
        raise ValueError("final_covariances: no level")
    if any(k < 1 for k in fanouts[1:]):
        raise ValueError(f"final_covariances: a fan-out below 1 in {list(fanouts[1:])}")
    if method == "topdown":
        own = [
            _covariance(p, exact, level)
            for p, exact, level in zip(informations, exact_totals, levels, strict=True)
        ]
    else:
        precision = informations[-1]
        own = [_covariance(precision, exact_totals[-1], levels[-1])]
        for i in range(len(informations) - 2, -1, -1):
            # positive definite when the leaves' is: poorly determined, never unidentified
            precision = precision / float(fanouts[i + 1]) + informations[i]
            own.insert(0, _covariance(precision, exact_totals[i], levels[i], identified=True))
    final = [own[0]]
    for i in range(1, len(own)):
        k = float(fanouts[i])
        final.append(own[i] + (final[-1] - k * own[i]) / k**2)
    return final


def _covariance(
    precision: np.ndarray, exact_total: bool, level: str, identified: bool = False
) -> np.ndarray:
    """The inverse of every block; with an exact total, block 0's inverse on ``1^perp``.
    Unless ``identified`` (known positive definite), a block too close to singular is refused
    as leaving a cell unidentified."""
    out = np.empty_like(precision)
    for c, block in enumerate(precision):
        basis = _complement(block.shape[0]) if exact_total and c == 0 else None
        reduced = block if basis is None else basis.T @ block @ basis
        if reduced.size and not identified:
            values = np.linalg.eigvalsh(reduced)
            if values[0] <= IDENTIFIED * max(values[-1], 1.0):
                raise ValueError(
                    f"level {level}: its queries do not identify every cell (a level below"
                    " it, or its own, must measure them all)"
                )
        inverse = np.linalg.inv(reduced) if reduced.size else reduced
        out[c] = inverse if basis is None else basis @ inverse @ basis.T
    return out


@cache
def _complement(d: int) -> np.ndarray:
    """An orthonormal basis ``(d, d - 1)`` of the complement of the all-ones vector."""
    return null_space(np.ones((1, d)))


class FieldGrams:
    """Fields (0/1 columns over the active cells) ready for ``f^T C f`` against many
    covariances of one layout. Compact: ``f^T (sum_c E_c (x) B_c) f = sum_c <H_fc, B_c>`` with
    ``H_fc = sum_{j in c} s_j s_j^T`` over the Helmert coordinates ``s`` of ``f`` (columns ``j``
    of component ``c``), so each evaluation is one contraction, no transform."""

    def __init__(self, fields: np.ndarray, layout: SymmetricLayout | None) -> None:
        columns = np.asarray(fields, dtype=np.float64).T  # (fields, active cells)
        self.layout = layout
        if layout is None:
            self.columns = columns
            return
        spectral = layout.spectral(columns)  # (fields, n_N, M)
        self.grams = np.stack(
            [
                np.einsum("fim,fjm->fij", s, s)
                for s in (
                    spectral[..., layout.component_of_spectral == c]
                    for c in range(layout.n_components)
                )
            ],
            axis=1,
        )  # (fields, 2^k, n_N, n_N)

    def variances(self, covariance: Covariance) -> np.ndarray:
        """``f^T C f`` for every field."""
        if isinstance(covariance, SymmetricMatrix):
            if covariance.layout is not self.layout:
                raise ValueError("FieldGrams: a covariance of another layout")
            values = np.einsum("fcij,cij->f", self.grams, covariance.blocks)
        else:
            values = np.einsum("fi,ij,fj->f", self.columns, np.asarray(covariance), self.columns)
        return np.maximum(values, 0.0)


def expected_absolute_error(variances: np.ndarray) -> np.ndarray:
    """``E|e|`` of a centred Gaussian error of each variance: ``sqrt(2 v / pi)``."""
    return np.sqrt(2.0 * np.asarray(variances) / np.pi)
