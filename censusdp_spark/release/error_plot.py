"""The figure ``--evaluate`` writes beside a release: error by level, one line a series
(internal, like the evaluation table it draws)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ErrorLine:
    """One series: its value at each level (in the x axis' order), its legend label and its
    matplotlib style (``marker``, ``linestyle``)."""

    values: Sequence[float]
    label: str
    style: Mapping[str, Any] = field(default_factory=dict)


def plot_error_by_level(
    levels: Sequence[str], lines: Sequence[ErrorLine], ylabel: str, title: str, path: Path | str
) -> None:
    """PNG at ``path`` of every line over ``levels``, root first, on a symlog axis (linear
    below 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for line in lines:
        ax.plot(list(levels), line.values, label=line.label, **line.style)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
