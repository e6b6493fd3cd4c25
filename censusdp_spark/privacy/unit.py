"""A release's privacy unit: whom its guarantee protects, and what it takes as public.

A DP guarantee bounds how much a release can change between *neighbouring* inputs, so it means
no more than its neighbouring relation says: what differs between neighbours is protected, and
what neighbours share is not (it may be released exactly, or shape the release without noise).
Each release states its unit from its config (``privacy_unit`` in its ``config`` module), and
that one statement is what ``censusdp budget`` prints before the budget, what a run prints in
its summary, and what the manifest records, so a user reads it where the budget is decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PrivacyUnit:
    """``neighbours``: how two neighbouring inputs differ; ``public``: what they share, each
    a phrase (the release may reveal these exactly)."""

    neighbours: str
    public: tuple[str, ...]

    def lines(self, indent: str = "") -> list[str]:
        """Two lines: ``privacy unit: <neighbours>`` and ``public (not protected): <...>``."""
        return [
            f"{indent}privacy unit: {self.neighbours}",
            f"{indent}public (not protected): {'; '.join(self.public)}",
        ]

    def manifest(self) -> dict[str, Any]:
        """As the manifest's ``privacy.unit`` records it."""
        return {"neighbours": self.neighbours, "public": list(self.public)}
