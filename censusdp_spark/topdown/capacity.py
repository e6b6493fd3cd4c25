"""The disk a TopDown release needs, estimated before any noise from public quantities only, and
the rule that refuses a run the output's file system cannot hold.

What is estimated, per part (constants measured by ``benchmarks/bench_national_production.py``
on the 2,016-cell production schema and the 16-cell demo, ``BENCHMARKS.md``):

* ``noisy_measurements``: every noised cell of every node (nodes per level x the cells of the
  level's queries) at ``NOISY_BYTES_PER_CELL`` (Parquet, zstd; measured 1.32 at 1% of the nation);
* ``bottom_up`` (``full_information``): per node above the leaves its mean and packed covariance
  as doubles (the leaves store neither when the top-down pass fits them to their own answers);
* ``estimates`` and ``microdata``: ``OUTPUT_BYTES_PER_LEAF`` a leaf (measured 33 bytes on the
  16-cell demo, 47 on the production schema), and the P.L. 94-171 tables with their CSV copy
  ``TABLE_BYTES_PER_NODE`` a node (measured 0.7 KB for P1-P5);
* Spark's scratch space (shuffle files, on the same machine): as much as the noisy measurements
  again (``SCRATCH_FACTOR``), which the bottom-up and top-down passes shuffle.

Public quantities only: the nodes per level come from the spine (or the input's blocks where
there is no spine: the released geography either way), the cells from the config. The free
space is that of the file system holding the output folder (or its nearest existing parent).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from censusdp_spark.topdown.bottom_up import config_layout
from censusdp_spark.topdown.config import RunConfig

NOISY_BYTES_PER_CELL = 1.5
OUTPUT_BYTES_PER_LEAF = 64
TABLE_BYTES_PER_NODE = 1_000
SCRATCH_FACTOR = 1.0
BYTES_PER_DOUBLE = 8
NOISE_CELL_BYTES = 24


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes each part of a run needs on disk."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def text(self) -> str:
        shown = ", ".join(f"{name} {_size(n)}" for name, n in self.parts.items())
        return f"~{_size(self.total)} ({shown})"


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.0f} MiB"


def noised_cells(config: RunConfig, nodes: dict[str, int]) -> int:
    """Cells the measurement noises: every node's every query's marginal cells."""
    return sum(n * sum(q.size for q in config.queries[level]) for level, n in nodes.items())


def estimate_disk(config: RunConfig, nodes: dict[str, int]) -> DiskEstimate:
    """The disk a run of ``config`` over ``nodes`` (nodes per level) needs, by part."""
    noisy = int(noised_cells(config, nodes) * NOISY_BYTES_PER_CELL)
    parts = {"noisy measurements": noisy}
    if config.estimation_method == "full_information":
        layout = config_layout(config)
        n = config.schema.n_cells - len(config.structural_zero_cells)
        packed = n * (n + 1) // 2  # dense: the upper triangle; compact: 2^k core blocks
        if layout is not None:
            n_core = layout.core_cells
            packed = layout.n_components * n_core * (n_core + 1) // 2
        inner = sum(nodes.values()) - nodes[config.hierarchy.leaf.name]
        parts["bottom_up"] = inner * (n + packed) * BYTES_PER_DOUBLE
    parts["estimates"] = nodes[config.hierarchy.leaf.name] * OUTPUT_BYTES_PER_LEAF
    if config.pl94_tables is not None:
        parts["P.L. 94-171 tables"] = sum(nodes.values()) * TABLE_BYTES_PER_NODE
    parts["Spark scratch"] = int(noisy * SCRATCH_FACTOR)
    return DiskEstimate(parts)


def free_disk(path: Path) -> int:
    """Free bytes of the file system that holds ``path`` (or its nearest existing parent)."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    return shutil.disk_usage(existing).free


def check_disk(
    config: RunConfig, nodes: dict[str, int], output: Path, free: int | None = None
) -> DiskEstimate:
    """The estimate, or ``CapacityError`` in one line when it exceeds the free space of
    ``output``'s file system (``free``: that space, default measured)."""
    found = estimate_disk(config, nodes)
    available = free_disk(output) if free is None else free
    if found.total > available:
        leaves = nodes[config.hierarchy.leaf.name]
        raise CapacityError(
            f"{config.source}: the release of {leaves:,} {config.hierarchy.leaf.name}s needs "
            f"{found.text()} on disk, more than the {_size(available)} free at {output}; free "
            "disk space, write the output elsewhere or release a smaller input"
        )
    return found


class CapacityError(ValueError):
    """The run would need more than the machine has; nothing was drawn or written."""
