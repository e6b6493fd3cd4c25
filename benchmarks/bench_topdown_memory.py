"""TopDown: peak memory of one Spark Python call of the noise pass, per noised cell, the figure
behind ``censusdp_spark/topdown/capacity.py``'s memory estimate (a run whose largest noise
group would not fit a Python worker is refused before any noise).

    .venv/bin/python benchmarks/bench_topdown_memory.py [--nodes 1000 4000 16000]

The noise pass hands each noise group (the nodes sharing their ancestor three levels up: the
blocks of a county, the block groups of a state, the tracts of the nation) to one call, whole,
however large: it is the call whose memory grows with the geography. Each case runs, in a fresh
forked process, what a Spark Python worker runs on it: one Arrow batch of ``k`` block rows of
``conf/national_production.toml`` (2,016 cells, 11 queries, 2,603 noised cells a node; each
block holds 40 persons in 20 cells, sparse as the PPMF is) -> pandas -> ``engine.families``'
plumbing and ``topdown.measure``'s noise -> Arrow, each output batch dropped once converted as
the JVM's reader would. Peak = the process's peak resident memory (``VmHWM``, reset once the
input is built) less its resident memory then, plus the input batch. Writes
benchmarks/results/topdown_memory.md.
"""

from __future__ import annotations

import time

import _common as common
import numpy as np
import pyarrow as pa

from censusdp_spark.engine.families import _one_by_one, _streamed, _through_pandas
from censusdp_spark.topdown.capacity import NOISE_CELL_BYTES
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.measure import _noise_groups, noise_plan

RESULTS = common.RESULTS_DIR / "topdown_memory.md"
CONFIG = common.ROOT / "conf" / "national_production.toml"
PERSONS_PER_BLOCK = 40
CELLS_PER_BLOCK = 20
OUTPUT = pa.schema(
    [
        ("level", pa.string()),
        ("geocode", pa.string()),
        ("query", pa.string()),
        ("noisy", pa.list_(pa.int64())),
        ("sigma2", pa.string()),
        ("budget_levels", pa.list_(pa.string())),
    ]
)


def blocks_batch(k: int, n_cells: int) -> pa.RecordBatch:
    """``k`` block rows of one noise group, sorted by geocode, as the noise pass gets them."""
    rng = np.random.default_rng(k)
    cells = [np.sort(rng.choice(n_cells, CELLS_PER_BLOCK, replace=False)) for _ in range(k)]
    counts = [
        rng.multinomial(PERSONS_PER_BLOCK, [1 / CELLS_PER_BLOCK] * CELLS_PER_BLOCK)
        for _ in range(k)
    ]
    return pa.RecordBatch.from_pydict(
        {
            "level": ["block"] * k,
            "geocode": [f"11001{i:010d}" for i in range(k)],
            "cells": [c.astype(np.int32) for c in cells],
            "counts": [c.astype(np.int64) for c in counts],
            "budget_levels": [["block"]] * k,
            "group": ["11001"] * k,
        }
    )


def _measured(k: int) -> tuple[int, float, int]:
    config = load_topdown_config(CONFIG)
    batch = blocks_batch(k, config.schema.n_cells)
    solve = _one_by_one(["level", "group"], _noise_groups(bytes(32), noise_plan(config)))
    task = _through_pandas(_streamed(["level", "group"], solve, None), OUTPUT)
    before = common.memory_baseline()
    started = time.perf_counter()
    cells = 0
    for out in task(iter([batch])):
        cells += len(out.column("noisy").flatten())
        del out
    seconds = time.perf_counter() - started
    return common.memory_status("VmHWM:") - before + batch.nbytes, seconds, cells


def measure(k: int) -> dict:
    result = common.in_fresh_process(lambda: _measured(k))
    assert result is not None  # no timeout
    peak, seconds, cells = result
    return {"nodes": k, "cells": cells, "peak": peak, "seconds": seconds}


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "## TopDown noise pass: peak memory of one Python call",
        "",
        common.command_note(command, load=True) + ". One noise group of k SYNTHETIC production "
        f"blocks ({PERSONS_PER_BLOCK} persons in {CELLS_PER_BLOCK} cells each) through "
        "`engine.families` and `topdown.measure` in a forked process; peak = VmHWM growth plus "
        f"the input batch. `capacity.NOISE_CELL_BYTES` = {NOISE_CELL_BYTES}.",
        "",
        "| nodes | noised cells | peak (MiB) | bytes per noised cell | seconds |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['cells']:,} | {r['peak'] / 2**20:,.0f} | "
            f"{r['peak'] / r['cells']:.1f} | {r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 4000, 16000])
    common.results_option(parser, RESULTS)
    args = parser.parse_args()
    rows = [measure(k) for k in args.nodes]
    for r in rows:
        print(r, flush=True)
    command = "benchmarks/bench_topdown_memory.py --nodes " + " ".join(map(str, args.nodes))
    common.write_report(args.results, markdown(rows, command))


if __name__ == "__main__":
    main()
