"""What every release's run reports when it ends: the summary its command prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from censusdp_spark.privacy.unit import PrivacyUnit


@dataclass(kw_only=True)
class ReleaseSummary:
    """What every release's run reports beside its own figures: where it wrote, its wall time
    (in all and per stage), its evaluation, whether it is for release and whom it protects. A
    release's summary extends it and builds its ``text`` from these lines."""

    output: Path
    elapsed_s: float
    timings: dict[str, float] = field(default_factory=dict)
    evaluation: list[dict[str, Any]] = field(default_factory=list)
    for_release: bool = True
    evaluation_dir: Path | None = None
    privacy_unit: PrivacyUnit | None = None

    def written_line(self, what: str) -> str:
        """The first line: ``what`` written to the output, marked when not for release."""
        marked = "" if self.for_release else " (NOT FOR RELEASE: --reuse-secret)"
        return f"{what} written to {self.output}{marked}"

    def unit_lines(self) -> list[str]:
        """Whom the release protects (its privacy unit), indented under the privacy line."""
        return self.privacy_unit.lines("  ") if self.privacy_unit else []

    def elapsed_line(self) -> str:
        """The wall time, in all and per stage."""
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items())
        return f"  elapsed: {self.elapsed_s:.1f} s ({stages})"

    def evaluation_dir_lines(self) -> list[str]:
        """Where ``--evaluate`` wrote (nothing without it)."""
        if self.evaluation_dir is None:
            return []
        return [f"  evaluation (internal, not for release): {self.evaluation_dir}"]
