"""The disk and memory a TopDown release needs, estimated before any noise from public
quantities only, and the rules that refuse a run the output's file system or, in local mode,
this machine cannot hold.

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

Memory, in local mode (where the driver's JVM is the executor and its Python workers, one a
core, run on this machine; a cluster's executors are sized by the cluster): the JVM's heap
(``spark.driver.memory``) and ``JVM_NATIVE_BYTES`` beyond it, the driver's Python process
(``DRIVER_PYTHON_BYTES``), and every worker (``PYTHON_WORKER_BYTES`` of interpreter and
imports) at once in the largest call of the run. That call is the noise pass of one noise group
(``engine.families.noise_group``: the blocks of a county, the block groups of a state, the
tracts of the nation), handed to one call whole whatever its size:
``PYTHON_CALL_BYTES + NOISE_CELL_BYTES`` a noised cell (``benchmarks/bench_topdown_memory.py``).
The estimation passes' calls take Spark's Arrow batches of 10,000 rows and are not estimated
apart. The estimate is an upper bound by construction (every worker at its largest call while
the heap is full); ``bench_national_production.py`` sets it beside the measured peak of the
whole process tree.

Public quantities only: the nodes per level come from the spine (or the input's blocks where
there is no spine: the released geography either way), the cells from the config. The free
space is that of the file system holding the output folder (or its nearest existing parent).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from censusdp_spark.engine.session import LocalMode
from censusdp_spark.model.geography import LevelShape
from censusdp_spark.model.memory import physical_memory, size_text
from censusdp_spark.topdown.bottom_up import config_layout
from censusdp_spark.topdown.config import TopDownConfig

NOISY_BYTES_PER_CELL = 1.5
OUTPUT_BYTES_PER_LEAF = 64
TABLE_BYTES_PER_NODE = 1_000
SCRATCH_FACTOR = 1.0
BYTES_PER_DOUBLE = 8
NOISE_CELL_BYTES = 24  # measured 20.5 a cell at the margin, 23.6 all in, at 16,000 nodes
PYTHON_CALL_BYTES = 192 * 2**20  # a call's fixed part: 130 MiB measured at 1,000 nodes
PYTHON_WORKER_BYTES = 256 * 2**20  # interpreter, numpy, pandas, Arrow, SciPy: 168 MiB measured
JVM_NATIVE_BYTES = 2**30  # metaspace, code, threads, Arrow and network buffers
DRIVER_PYTHON_BYTES = 512 * 2**20  # the driver's Python process: 190-230 MiB seen


@dataclass(frozen=True)
class _Estimate:
    """Bytes each part of a run needs."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def text(self, note: str = "") -> str:
        """``~total (part size, ...)``, ``note`` after the parts."""
        shown = ", ".join(f"{name} {size_text(n)}" for name, n in self.parts.items())
        return f"~{size_text(self.total)} ({shown}{note})"


@dataclass(frozen=True)
class DiskEstimate(_Estimate):
    """Bytes each part of a run needs on disk."""


def noised_cells(config: TopDownConfig, nodes: dict[str, int]) -> int:
    """Cells the measurement noises: every node's every query's marginal cells."""
    return sum(n * sum(q.size for q in config.queries[level]) for level, n in nodes.items())


def estimate_disk(config: TopDownConfig, nodes: dict[str, int]) -> DiskEstimate:
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
    config: TopDownConfig, nodes: dict[str, int], output: Path, free: int | None = None
) -> DiskEstimate:
    """The estimate, or ``CapacityError`` in one line when it exceeds the free space of
    ``output``'s file system (``free``: that space, default measured)."""
    found = estimate_disk(config, nodes)
    available = free_disk(output) if free is None else free
    if found.total > available:
        leaves = nodes[config.hierarchy.leaf.name]
        raise CapacityError(
            f"{config.source}: the release of {leaves:,} {config.hierarchy.leaf.name}s needs "
            f"{found.text()} on disk, more than the {size_text(available)} free at {output}; free "
            "disk space, write the output elsewhere or release a smaller input"
        )
    return found


@dataclass(frozen=True)
class MemoryEstimate(_Estimate):
    """Bytes each part of a local-mode run needs at its peak, and the largest Python call."""

    call: str

    def text(self, note: str = "") -> str:
        return super().text(f"; the largest call: {self.call}{note}")


def largest_call(config: TopDownConfig, shapes: Sequence[LevelShape]) -> tuple[int, str]:
    """Bytes of the run's largest Python call, the noise pass of its largest noise group, and
    that call in words."""
    calls = []
    for shape in shapes:
        cells = shape.largest_noise_group * sum(q.size for q in config.queries[shape.name])
        call = (
            f"the noise pass of {shape.largest_noise_group:,} {shape.name} nodes in one group, "
            f"{cells:,} noised cells"
        )
        calls.append((PYTHON_CALL_BYTES + NOISE_CELL_BYTES * cells, call))
    return max(calls)


def estimate_memory(
    config: TopDownConfig, shapes: Sequence[LevelShape], local: LocalMode
) -> MemoryEstimate:
    """The memory a local-mode run of ``config`` over the geography of ``shapes`` needs."""
    call, words = largest_call(config, shapes)
    parts = {
        "JVM": local.heap + JVM_NATIVE_BYTES,
        "driver": DRIVER_PYTHON_BYTES,
        f"{local.cores} Python workers": local.cores * (PYTHON_WORKER_BYTES + call),
    }
    return MemoryEstimate(parts, words)


def check_memory(
    config: TopDownConfig,
    shapes: Sequence[LevelShape],
    local: LocalMode | None,
    available: int | None = None,
) -> MemoryEstimate | None:
    """The estimate of a local-mode run (None for a cluster's or Spark Connect's), or
    ``CapacityError`` in one line when it exceeds ``available`` (default: this machine's
    memory)."""
    if local is None:
        return None
    found = estimate_memory(config, shapes, local)
    limit = physical_memory() if available is None else available
    if found.total > limit:
        leaves = {s.name: s.nodes for s in shapes}[config.hierarchy.leaf.name]
        raise CapacityError(
            f"{config.source}: the release of {leaves:,} {config.hierarchy.leaf.name}s needs "
            f"{found.text()} of memory in local mode, more than the {size_text(limit)} of this "
            "machine; run on fewer cores (--master local[1]), lower CENSUSDP_DRIVER_MEMORY, "
            "or run on a cluster"
        )
    return found


class CapacityError(ValueError):
    """The run would need more than the machine has; nothing was drawn or written."""
