"""Histogram schema: ordered categorical attributes and named recodes of them.

A record's cell index is the row-major (mixed-radix) index over the attributes' levels, so a
schema with attributes of sizes (8, 2, 2, 63) has 2,016 cells and the last attribute varies
fastest. Recodes group the levels of one attribute (e.g. ``hhinstlevels`` groups the 8 ``hhgq``
levels into household / institutional / non-institutional) and can be used in queries like an
attribute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from censusdp_spark.model.attribute import Attribute


@dataclass(frozen=True)
class Recode:
    """A grouping of one attribute's levels: ``group_of[level_index]`` is the group index."""

    name: str
    attribute: str
    groups: tuple[str, ...]
    group_of: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.groups)


@dataclass(frozen=True)
class Schema:
    attributes: tuple[Attribute, ...]
    recodes: tuple[Recode, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.attributes)

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    def attribute(self, name: str) -> Attribute:
        for a in self.attributes:
            if a.name == name:
                return a
        raise KeyError(name)

    def recode(self, name: str) -> Recode | None:
        for r in self.recodes:
            if r.name == name:
                return r
        return None

    def strides(self) -> np.ndarray:
        """Row-major strides: cell = sum(level_index[a] * strides[a])."""
        shape = np.array(self.shape, dtype=np.int64)
        return np.concatenate([np.cumprod(shape[::-1])[::-1][1:], [1]]).astype(np.int64)

    def cell_of(self, level_indices: np.ndarray) -> np.ndarray:
        """Cell index for an array of shape (rows, n_attributes) of level indices."""
        return np.asarray(level_indices, dtype=np.int64) @ self.strides()

    def levels_of(self, cells: np.ndarray) -> np.ndarray:
        """Inverse of ``cell_of``: an array (rows, n_attributes) of level indices."""
        cells = np.asarray(cells, dtype=np.int64)
        shape = np.array(self.shape, dtype=np.int64)
        return (cells[:, None] // self.strides()[None, :]) % shape[None, :]

    def labels_of(self, cells: np.ndarray) -> dict[str, np.ndarray]:
        """Each attribute's level label of every cell in ``cells``, by attribute name."""
        levels = self.levels_of(cells)
        return {
            attr.name: np.asarray(attr.levels, dtype=object)[levels[:, pos]]
            for pos, attr in enumerate(self.attributes)
        }

    def cells_matching(self, selection: dict[str, frozenset[str]]) -> np.ndarray:
        """Sorted cell indices whose level is in ``selection[attr]`` for every named attribute."""
        keep = np.ones(self.n_cells, dtype=bool)
        levels = self.levels_of(np.arange(self.n_cells))
        for pos, attr in enumerate(self.attributes):
            if attr.name in selection:
                allowed = [attr.index_of(v) for v in selection[attr.name]]
                keep &= np.isin(levels[:, pos], allowed)
        return np.flatnonzero(keep)
