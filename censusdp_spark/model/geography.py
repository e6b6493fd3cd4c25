"""The geographic hierarchy: levels identified by geocode prefix length.

The root (e.g. the nation) has the empty geocode; every other level keeps the first ``digits``
characters of the leaf geocode, so each leaf has exactly one chain of ancestors and the parent
of a node is the prefix of its geocode at the level above. The set of leaves is the public
spine: the ``[geography] spine`` file when one is configured (``config.SpineSpec``), else the
leaves of a block-count input (zero-population leaves included); the node set of every level
is the set of its prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    name: str
    digits: int  # geocode length; 0 for the root


@dataclass(frozen=True)
class LevelSpan:
    """The levels a release holds: ``levels[top:bottom]`` of its hierarchy. Every level by
    default; from the states down in a state-by-state release (``top`` 1: each state the root
    of its own tree, no root row); the nation and the states in a nation assembled from state
    runs (``bottom`` 2)."""

    top: int = 0
    bottom: int | None = None

    def of(self, hierarchy: Hierarchy) -> tuple[Level, ...]:
        return hierarchy.levels[self.top : self.bottom]

    def names(self, hierarchy: Hierarchy) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.of(hierarchy))

    @property
    def has_leaves(self) -> bool:
        return self.bottom is None


EVERY_LEVEL = LevelSpan()


@dataclass(frozen=True)
class Hierarchy:
    levels: tuple[Level, ...]  # root first, leaf last

    def __post_init__(self) -> None:
        if len(self.levels) < 2:
            raise ValueError("a hierarchy needs a root and at least one more level")
        if self.levels[0].digits != 0:
            raise ValueError("the root level must have 0 digits")
        digits = [lv.digits for lv in self.levels]
        if any(b <= a for a, b in zip(digits, digits[1:], strict=False)):
            raise ValueError(f"level digits must increase strictly from the root: {digits}")
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"level names must be unique: {names}")

    @property
    def root(self) -> Level:
        return self.levels[0]

    @property
    def leaf(self) -> Level:
        return self.levels[-1]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.levels)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def level(self, name: str) -> Level:
        return self.levels[self.index(name)]


@dataclass(frozen=True)
class LevelShape:
    """A level of the public geography: its nodes, the most children one node of the level
    above has among them (1 at the root), the most of them one noise group holds."""

    name: str
    nodes: int
    largest_family: int
    largest_noise_group: int
