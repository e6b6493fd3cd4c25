"""A categorical attribute: a name and its ordered levels.

The axis of TopDown's histogram (``topdown.schema``) and of synth's household domain
(``synth.domain.BinnedAttribute``, which also says how a raw column's values become its levels).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attribute:
    name: str
    levels: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.levels)

    def index_of(self, level: str) -> int:
        return self.levels.index(level)
