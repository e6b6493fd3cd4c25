"""Marginal queries as Kronecker products of per-attribute matrices.

A marginal query names the attributes (or recodes) it keeps, e.g. ``votingage * hispanic``;
``total`` keeps none and ``detailed`` keeps all. Its matrix is the Kronecker product, over the
schema's attributes in order, of: the identity (attribute kept), the recode's grouping matrix
(recode kept) or a row of ones (attribute summed out). Every cell of the histogram falls in
exactly one marginal cell, so a query is stored as ``cell_to_marginal`` (an int array over
cells) and applied with ``np.bincount``; ``matrix()`` builds the explicit Kronecker product.

Under the change-one-record neighbour a marginal query has squared L2 sensitivity 2 (one cell
down by one, one up by one), which is what the accounting assumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from censusdp_spark.topdown.schema import Schema

TOTAL = "total"
DETAILED = "detailed"


@dataclass(frozen=True)
class MarginalQuery:
    name: str
    factors: tuple[str, ...]  # attribute or recode names kept, in schema order
    schema: Schema

    @cached_property
    def factor_matrices(self) -> tuple[np.ndarray, ...]:
        mats = []
        for attr in self.schema.attributes:
            recode = next(
                (
                    r
                    for r in self.schema.recodes
                    if r.attribute == attr.name and r.name in self.factors
                ),
                None,
            )
            if attr.name in self.factors:
                mats.append(np.eye(attr.size, dtype=np.int64))
            elif recode is not None:
                grouping = np.zeros((recode.size, attr.size), dtype=np.int64)
                grouping[list(recode.group_of), np.arange(attr.size)] = 1
                mats.append(grouping)
            else:
                mats.append(np.ones((1, attr.size), dtype=np.int64))
        return tuple(mats)

    @cached_property
    def cell_to_marginal(self) -> np.ndarray:
        """For every histogram cell, the index of the marginal cell it falls in."""
        levels = self.schema.levels_of(np.arange(self.schema.n_cells))
        index = np.zeros(self.schema.n_cells, dtype=np.int64)
        for pos, mat in enumerate(self.factor_matrices):
            group = np.argmax(mat, axis=0)  # each level belongs to exactly one row
            index = index * mat.shape[0] + group[levels[:, pos]]
        return index

    @property
    def size(self) -> int:
        return int(np.prod([m.shape[0] for m in self.factor_matrices]))

    def matrix(self) -> np.ndarray:
        """The explicit 0/1 query matrix (size x n_cells): the Kronecker product of factors."""
        out = np.ones((1, 1), dtype=np.int64)
        for mat in self.factor_matrices:
            out = np.kron(out, mat)
        return out

    def answer(self, cells: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Marginal answer (length ``size``) of a sparse histogram given as (cells, counts)."""
        return np.bincount(
            self.cell_to_marginal[np.asarray(cells, dtype=np.int64)],
            weights=np.asarray(counts, dtype=np.float64),
            minlength=self.size,
        ).astype(np.int64)


def parse_query(name: str, schema: Schema) -> MarginalQuery:
    """Build a query from its name: ``total``, ``detailed`` or ``a * b * ...``.

    Raises ``ValueError`` naming an unknown factor or a factor used twice.
    """
    name = name.strip()
    if name == TOTAL:
        return MarginalQuery(TOTAL, (), schema)
    if name == DETAILED:
        return MarginalQuery(DETAILED, schema.names, schema)
    parts = [p.strip() for p in name.split("*")]
    known = set(schema.names) | {r.name for r in schema.recodes}
    for part in parts:
        if part not in known:
            raise ValueError(f"query {name!r}: unknown attribute or recode {part!r}")
    base_of = {r.name: r.attribute for r in schema.recodes}
    bases = [base_of.get(p, p) for p in parts]
    if len(set(bases)) != len(bases):
        raise ValueError(f"query {name!r}: an attribute appears more than once")
    return MarginalQuery(name, tuple(parts), schema)
