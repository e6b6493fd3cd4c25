"""The memory a group-size mechanism needs, estimated at the door from public quantities only,
and the rule that refuses a config beyond the budget before any noise is drawn.

What is estimated. Every mechanism runs in Spark's Python workers, a level at a time, one
Arrow batch per call (``engine.families``): at most ``R`` rows
(``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 by default), plus the family or
noise group that straddles the batch's end, carried over whole. The estimate is the largest
call of the run, at the measured cost per cell (``benchmarks/bench_mechanism_memory.py``,
``BENCHMARKS.md``; a cell is one (node, size) pair):

* the noise pass (every mechanism), per level: up to ``R`` + its largest noise group nodes,
  each with N cells, at ``NOISE_CELL_BYTES``;
* ``cumulative`` and ``relaxed_families``, per level below the root: a batch of up to ``R`` +
  the largest family children (N cells each) at ``*_BATCH_CELL_BYTES``, plus the one family
  being solved, largest family x N cells, at ``*_FAMILY_CELL_BYTES``;
* ``dp``, per level below the root (families of a batch solved together): its cells at
  ``DP_CELL_BYTES`` (leaves: up to ``R`` + the largest family, times N; internal children:
  ``R`` + largest family x N cost-table rows of one cell each) plus the units of the cost
  tables it holds at ``DP_UNIT_BYTES`` (a unit is one slope: an internal child's l2 table
  spans at most its window, ``2 w`` units; a parent's as much, the root's all of its
  children's, largest family x ``2 w``). ``w`` is the window of the rerun with every window
  ``WINDOW_WIDENING`` times wider, ``WINDOW_WIDENING x first_window`` of the level's noise
  scale: at large N the first pass often finds G out of the root tables' reach (the small
  positive lower bounds of many empty cells' windows add up: on a synthetic 3,111-node tree
  with 100,000 groups, in one trial, at N = 2,000 and not at N = 500), and the rerun holds
  ``WINDOW_WIDENING`` times the units. A batch's families are counted at the level's mean
  family size;
* ``relaxed``: the whole-tree QP's ``RELAXED_MAX_CELLS`` (``solvers/relaxed.py``), and the
  noise pass.

Checked end to end (``bench_mechanism_memory.py --end-to-end``, ``BENCHMARKS.md``): on a
synthetic 3,111-node tree at N = 2,000 the largest Python worker peaked at 4.85 GiB (``dp``,
whose run did widen its windows) and 0.66 GiB (``cumulative``), against estimates of 7.0 and
1.1 GiB; the first window alone would have estimated ``dp`` at 1.8 GiB.

Public quantities only: N (``[groups] max_size``, the number of size buckets, after
top-coding if ``topcode = true``), the geography's shape (nodes per level, the most children
of one parent, the most nodes of one noise group: the spine's or the input's list of leaves,
public by the release's definition), the noise scales (the config's ε) and Spark's batch size.
No count is read, G included.

Not estimated: the JVM's side (its heap is ``CENSUSDP_DRIVER_MEMORY``, and it spills to
disk); dp's further widenings (of the few cells found on a window bound, or of every window a
second time); dp on a tree of two levels, whose root table spans ``0..G``, and dp
under l1 or node faithfulness, whose tables are listed family by family (l2 under node
faithfulness on ``0..G^r``): their tables depend on counts, so for them the estimate counts
the cells only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from censusdp_spark.group_sizes.config import GroupSizesConfig, Mechanism
from censusdp_spark.group_sizes.solvers.cost_tables import WINDOW_WIDENING, first_window
from censusdp_spark.group_sizes.solvers.relaxed import RelaxedTooLarge, check_relaxed_size
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.model.geography import LevelShape
from censusdp_spark.model.memory import parse_memory, size_text

WORKER_MEMORY_ENV = "CENSUSDP_WORKER_MEMORY"
DEFAULT_WORKER_MEMORY = "4g"
"""The memory one Spark Python worker may use for one call of a mechanism, unless
``$CENSUSDP_WORKER_MEMORY`` says otherwise (``512m``, ``4g``, ``1.5t``; bytes without a
suffix). Local mode runs one worker per core beside the driver's JVM
(``CENSUSDP_DRIVER_MEMORY``, 6 GiB): on the project's 2-core, 24 GiB machine, two 4 GiB
workers and the heap leave room for the OS and other jobs; a cluster sets it to its
executors' Python memory per core."""
ARROW_BATCH_ROWS = 10_000
"""Spark's default ``spark.sql.execution.arrow.maxRecordsPerBatch``: rows per Python call."""

# Measured (benchmarks/bench_mechanism_memory.py: one call of the Spark code path, Arrow in to
# Arrow out, at N = 1,000, 4,000 and 16,000; BENCHMARKS.md): the largest figure of each kind
# over three runs (the allocator varies by 10% and more between runs), rounded up to a
# multiple of 8 bytes; per cell of a call, or per cost-table unit.
NOISE_CELL_BYTES = 80  # measured 67-77
CUMULATIVE_BATCH_CELL_BYTES = 184  # 116-179 in a batch of small families
CUMULATIVE_FAMILY_CELL_BYTES = 536  # one family: 652-712 per cell in all, less the batch's
RELAXED_FAMILIES_BATCH_CELL_BYTES = 160  # 128-159
RELAXED_FAMILIES_FAMILY_CELL_BYTES = 1064  # one family: 1,124-1,219 in all (Clarabel)
DP_CELL_BYTES = 184  # 163-183: leaves' splits, which list no table
DP_UNIT_BYTES = 56  # up to 55 per unit, beyond the cells' share


def worker_memory() -> int:
    """The budget of one worker's call, bytes (``$CENSUSDP_WORKER_MEMORY``, default 4g)."""
    text = os.environ.get(WORKER_MEMORY_ENV) or DEFAULT_WORKER_MEMORY
    return parse_memory(text, WORKER_MEMORY_ENV)


@dataclass(frozen=True)
class MemoryEstimate:
    """The largest call of a run and what it needs."""

    bytes: int
    call: str  # which call, in words

    def text(self) -> str:
        return f"~{size_text(self.bytes)} for {self.call}"


def _rows(nodes: int, carried: int, batch_rows: int) -> int:
    """Rows of a level in one call: a batch plus the family carried over (no limit if R <= 0)."""
    return nodes if batch_rows <= 0 else min(nodes, batch_rows + carried)


def _windows(config: GroupSizesConfig) -> dict[str, int]:
    """dp's l2 half-width per internal level below the root (l2, level faithfulness), once
    widened: ``WINDOW_WIDENING`` x the first."""
    if not (config.norm == "l2" and config.faithfulness == "level"):
        return {}
    inner = config.hierarchy.levels[1:-1]
    scale = config.budget.scale
    return {lv.name: WINDOW_WIDENING * first_window(scale(lv.name, 2)) for lv in inner}


def _noise_calls(shapes: Sequence[LevelShape], sizes: int, batch_rows: int):
    for s in shapes:
        rows = _rows(s.nodes, s.largest_noise_group, batch_rows)
        call = f"the noise pass of level {s.name!r} ({rows:,} nodes x {sizes:,} sizes)"
        yield MemoryEstimate(NOISE_CELL_BYTES * rows * sizes, call)


def _family_calls(
    shapes: Sequence[LevelShape], sizes: int, batch_rows: int, batch_bytes: int, family_bytes: int
):
    for s in shapes[1:]:
        rows = _rows(s.nodes, s.largest_family, batch_rows)
        need = batch_bytes * rows * sizes + family_bytes * s.largest_family * sizes
        call = (
            f"the families of level {s.name!r} (a batch of {rows:,} children x {sizes:,} sizes, "
            f"the largest family {s.largest_family:,} children)"
        )
        yield MemoryEstimate(need, call)


def _dp_calls(shapes: Sequence[LevelShape], sizes: int, batch_rows: int, windows: dict[str, int]):
    for parent, s in zip(shapes, shapes[1:], strict=False):
        leaves = s is shapes[-1]
        if leaves:
            children = _rows(s.nodes, s.largest_family, batch_rows)
            cells, child_units = children * sizes, 0
        else:
            cells = _rows(s.nodes * sizes, s.largest_family * sizes, batch_rows)
            children = -(-cells // sizes)
            child_units = cells * 2 * windows.get(s.name, 0)
        families = min(parent.nodes, -(-children * parent.nodes // s.nodes))
        if parent.name in windows:
            per_parent_cell = 2 * windows[parent.name]
        else:  # the root: all its children's units (none listed under leaves: 0..G, see above)
            per_parent_cell = s.largest_family * 2 * windows.get(s.name, 0)
        units = child_units + families * sizes * per_parent_cell
        call = f"the cost tables of level {s.name!r} ({cells:,} cells, {units:,} table units)"
        yield MemoryEstimate(DP_CELL_BYTES * cells + DP_UNIT_BYTES * units, call)


def estimate_memory(
    config: GroupSizesConfig, shapes: Sequence[LevelShape], batch_rows: int = ARROW_BATCH_ROWS
) -> MemoryEstimate:
    """The largest call of a run of ``config`` (its mechanism) over a geography of ``shapes``
    (root first), from public quantities only."""
    sizes, mechanism = config.groups.max_size, config.mechanism
    calls = list(_noise_calls(shapes, sizes, batch_rows))
    if mechanism == Mechanism.CUMULATIVE:
        calls += _family_calls(
            shapes, sizes, batch_rows, CUMULATIVE_BATCH_CELL_BYTES, CUMULATIVE_FAMILY_CELL_BYTES
        )
    elif mechanism == Mechanism.RELAXED_FAMILIES:
        calls += _family_calls(
            shapes,
            sizes,
            batch_rows,
            RELAXED_FAMILIES_BATCH_CELL_BYTES,
            RELAXED_FAMILIES_FAMILY_CELL_BYTES,
        )
    elif mechanism == Mechanism.EXACT:
        calls += _dp_calls(shapes, sizes, batch_rows, _windows(config))
    return max(calls, key=lambda c: c.bytes)


def check_memory(
    config: GroupSizesConfig,
    shapes: Sequence[LevelShape],
    batch_rows: int = ARROW_BATCH_ROWS,
    budget: int | None = None,
) -> MemoryEstimate:
    """The estimate of a run of ``config``, or ``ConfigError`` in one line if its mechanism
    would need more than ``budget`` (default ``worker_memory()``) in one call, or (``relaxed``)
    more cells than ``RELAXED_MAX_CELLS``. Raised before any noise is drawn."""
    sizes = config.groups.max_size
    if config.mechanism == Mechanism.RELAXED:
        try:
            check_relaxed_size(sum(s.nodes for s in shapes) * sizes)
        except RelaxedTooLarge as error:
            raise ConfigError(config.source, "mechanism", str(error)) from None
    found = estimate_memory(config, shapes, batch_rows)
    limit = worker_memory() if budget is None else budget
    if found.bytes > limit:
        rule = (
            f"max_size = {sizes:,}: the {config.mechanism} mechanism would need {found.text()} "
            f"in one Spark Python worker, more than {WORKER_MEMORY_ENV} = {size_text(limit)}; use "
            f"fewer sizes (top-code: a smaller max_size with topcode = true) or raise "
            f"{WORKER_MEMORY_ENV}"
        )
        raise ConfigError(config.source, "groups", rule)
    return found
