"""Group-size release: peak memory of one Spark Python call of each mechanism, per cell, the
figures behind ``censusdp_spark/group_sizes/memory.py`` (a config whose N would make a
mechanism exceed memory is refused at the door). Writes benchmarks/results/mechanism_memory.md.

    .venv/bin/python benchmarks/bench_mechanism_memory.py [--sizes 1000 4000 16000]
    .venv/bin/python benchmarks/bench_mechanism_memory.py --end-to-end dp:2000:10x10x30 ...

``--end-to-end MECHANISM:N:FANOUTS`` runs the whole job instead (``censusdp pgsr`` in this
process, ``local[1]``) on a SYNTHETIC households input: a full tree of the given fan-outs, 100,000
households placed uniformly on its leaves with sizes ~ 1/size^2 over 1..N, top-coded; it
polls the Python workers' peak resident memory every 0.1 s and writes it beside the door's
estimate (``group_sizes.memory.check_memory``, from the same geography) to
benchmarks/results/mechanism_memory_spark.md.

Each case runs, in a fresh forked process, what a Spark Python worker runs on one Arrow batch:
the batch as Arrow (children rows with their parents' rows, as ``engine.families.map_children``
ships them; one noise group's rows for the noise pass) -> pandas -> the engine's family plumbing
(``engine.families``) and the release's own solver (``group_sizes.measure.noise_solver``,
``group_sizes.exact``'s ``dp_tables_solver`` and ``dp_split_solver``, ``group_sizes.baselines``'
``cumulative_solver`` and ``relaxed_family_solver``)
-> the result back to Arrow. Peak = the process's peak resident memory (``VmHWM``, reset once
the Arrow batch is built) less its resident memory then, plus the Arrow batch itself. Inputs
are synthetic: heavy-tailed sizes 1..N (probability ~ 1/size^2, about 30 groups per leaf),
noise from the project's sampler at the scales of a 5-level tree at epsilon = 1 (histograms
10, cumulative counts 5); dp's windows are ``first_window`` of that scale (half-width 44).

A *cell* is a (node, size) pair of the batch's children; a *unit* is one slope of a listed
cost table (dp: a parent's table on its window, or an internal child's), counted in the call's
input and output.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import _common as common
import numpy as np
import pandas as pd
import pyarrow as pa

from censusdp_spark.engine.families import (
    _ROLE,
    PARENT,
    FamilySolver,
    _children_with_parents,
    _one_by_one,
    _streamed,
    level_shapes,
)
from censusdp_spark.group_sizes import memory
from censusdp_spark.group_sizes.baselines import cumulative_solver, relaxed_family_solver
from censusdp_spark.group_sizes.exact import DpPlan, dp_split_solver, dp_tables_solver
from censusdp_spark.group_sizes.measure import NoisePlan, noise_solver, noisy_group
from censusdp_spark.group_sizes.shapes import arrow_batch_rows, leaf_nodes
from censusdp_spark.group_sizes.solvers.cost_tables import first_window

RESULTS = common.RESULTS_DIR / "mechanism_memory.md"
SPARK_RESULTS = common.RESULTS_DIR / "mechanism_memory_spark.md"
HOUSEHOLDS = 100_000
HISTOGRAM_SCALE = Fraction(10)  # 2L / epsilon, L = 5 levels, epsilon = 1
CUMULATIVE_SCALE = Fraction(5)
GROUPS_PER_LEAF = 30
SECRET = bytes(range(32))


# --- synthetic batches ---------------------------------------------------------------------------


def _truth(rng: np.random.Generator, nodes: int, sizes: int, groups: int) -> np.ndarray:
    law = np.arange(1, sizes + 1, dtype=np.float64) ** -2.0
    return rng.multinomial(groups, law / law.sum(), size=nodes).astype(np.int64)


def _noisy(truth: np.ndarray, measurement: str, scale: Fraction) -> np.ndarray:
    """What is measured of ``truth`` (histograms; ``cumulative``: their cumulative counts), noisy."""
    plan = NoisePlan(measurement, truth.shape[1], {"all": scale}, "level", "root")
    return noisy_group(SECRET, plan, "all", "", truth)


def _arrays(rows: np.ndarray) -> list[np.ndarray]:
    return list(rows)


def _placeholder(value: object) -> object:
    """What ``map_children`` puts in a column a row does not use: an empty array, "", 0."""
    if isinstance(value, np.ndarray):
        return value[:0]
    if isinstance(value, str):
        return ""
    return None if value is None else 0


def _family_batch(children: pd.DataFrame, parents: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """The rows ``map_children`` ships to a task: each parent's row first in its family, then its
    children's, sorted (what ``_children_with_parents`` receives)."""
    names = [c for c in parents.columns if c != "geocode"]
    down = children.assign(**{_ROLE: 1})
    for c in names:
        down[f"parent_{c}"] = [_placeholder(parents[c].iat[0])] * len(down)
    up = pd.DataFrame({PARENT: parents["geocode"].to_numpy(), _ROLE: 0})
    for c in children.columns:
        if c != PARENT:
            up[c] = [_placeholder(children[c].iat[0])] * len(up)
    for c in names:
        up[f"parent_{c}"] = list(parents[c].to_numpy())
    batch = pd.concat([up, down[up.columns]], ignore_index=True)
    return batch.sort_values([PARENT, _ROLE, *order], kind="stable").reset_index(drop=True)


@dataclass
class Case:
    name: str
    mechanism: str  # noise, cumulative, relaxed_families, dp
    kind: str  # batch (many small families), family (one large family), tables, split
    cells: int  # children (node, size) cells in the call
    family_cells: int  # the largest family's
    make: Callable[[], tuple[pa.RecordBatch, Callable[[pd.DataFrame], list[pd.DataFrame]]]]
    units: Callable[[pa.RecordBatch, list[pd.DataFrame]], int] = lambda _b, _o: 0
    sizes: int = 0


def _geocodes(prefix: str, count: int, digits: int) -> list[str]:
    return [prefix + str(i).zfill(digits) for i in range(count)]


def _children_call(
    solve: FamilySolver, children_columns: list[str], parent_columns: list[str], batched: bool
) -> Callable[[pd.DataFrame], list[pd.DataFrame]]:
    each = solve if batched else _one_by_one([PARENT], solve)
    task = _streamed([PARENT], _children_with_parents(children_columns, parent_columns, each), None)
    return lambda frame: list(task(iter([frame])))


def leaf_rows(
    families: int,
    kids: int,
    sizes: int,
    measurement: str,
    parents: list[str] | None = None,
    groups: int = GROUPS_PER_LEAF,
):
    """Leaf rows of ``families`` families of ``kids`` leaves (a leaf's geocode: its parent's and
    5 digits) with ``groups`` groups each, the parents' geocodes and the leaves' truth."""
    rng = np.random.default_rng(1)
    truth = _truth(rng, families * kids, sizes, groups)
    scale = HISTOGRAM_SCALE if measurement == "histogram" else CUMULATIVE_SCALE
    noisy = _noisy(truth, measurement, scale)  # cumulative: H_1..H_N of the histograms
    parents = parents or _geocodes("", families, 6)
    geocodes = [p + c for p in parents for c in _geocodes("", kids, 5)]
    frame = pd.DataFrame(
        {
            PARENT: np.repeat(parents, kids),
            "level": "leaf",
            "geocode": geocodes,
            "groups": 0,
            "noisy": _arrays(noisy),
        }
    )
    return frame, parents, truth


def _dp_plan(sizes: int) -> DpPlan:
    w = first_window(HISTOGRAM_SCALE)
    return DpPlan("l2", "level", 10**9, {"top": None, "mid": w, "leaf": None}, sizes)


def _arrow(frame: pd.DataFrame) -> pa.RecordBatch:
    return pa.RecordBatch.from_pandas(frame, preserve_index=False)


def _units_of(frames: list[pd.DataFrame | pa.RecordBatch]) -> int:
    total = 0
    for f in frames:
        if "lengths" in f.column_names if isinstance(f, pa.RecordBatch) else "lengths" in f:
            lengths = f.column("lengths") if isinstance(f, pa.RecordBatch) else f["lengths"]
            values = lengths.to_pylist() if isinstance(f, pa.RecordBatch) else list(lengths)
            total += int(sum(int(np.sum(v)) for v in values))
    return total


def cumulative_case(families: int, kids: int, sizes: int, groups: int = GROUPS_PER_LEAF) -> Case:
    def make():
        frame, parents, truth = leaf_rows(families, kids, sizes, "cumulative", groups=groups)
        counts = truth.reshape(families, kids, sizes).sum(1)
        up = pd.DataFrame({"geocode": parents, "counts": _arrays(counts)})
        batch = _family_batch(frame.drop(columns="level"), up, ["geocode"])
        solve = cumulative_solver("leaf", "level", int(counts.sum()))  # G: these families
        return _arrow(batch), _children_call(
            solve, ["geocode", "groups", "noisy"], ["parent_counts"], False
        )

    cells = families * kids * sizes
    kind = "family" if families == 1 else "batch"
    return Case(
        f"cumulative {families} x {kids}, {groups:,} groups per child",
        "cumulative",
        kind,
        cells,
        kids * sizes,
        make,
        sizes=sizes,
    )


def relaxed_case(families: int, kids: int, sizes: int) -> Case:
    def make():
        frame, parents, truth = leaf_rows(families, kids, sizes, "histogram")
        solution = truth.reshape(families, kids, sizes).sum(1).astype(np.float64)
        up = pd.DataFrame({"geocode": parents, "solution": _arrays(solution)})
        batch = _family_batch(frame, up, ["geocode"])
        solve = relaxed_family_solver("level")
        columns = ["level", "geocode", "groups", "noisy"]
        return _arrow(batch), _children_call(solve, columns, ["parent_solution"], False)

    cells = families * kids * sizes
    kind = "family" if families == 1 else "batch"
    name = f"relaxed_families {families} x {kids}"
    return Case(name, "relaxed_families", kind, cells, kids * sizes, make, sizes=sizes)


def _leaf_tables_input(families: int, kids: int, sizes: int, parents: list[str] | None = None):
    frame, parents, truth = leaf_rows(families, kids, sizes, "histogram", parents)
    plan = _dp_plan(sizes)
    parent_truth = truth.reshape(families, kids, sizes).sum(1)
    return frame, _parent_rows(parents, "mid", parent_truth), plan, parent_truth


def _parent_rows(geocodes: list[str], level: str, truth: np.ndarray) -> pd.DataFrame:
    """The parents' rows of a family batch: their noisy histograms of ``truth``."""
    return pd.DataFrame(
        {
            "geocode": geocodes,
            "level": level,
            "groups": 0,
            "noisy": _arrays(_noisy(truth, "histogram", HISTOGRAM_SCALE)),
            "widen": None,
        }
    )


def dp_leaf_tables_case(families: int, kids: int, sizes: int) -> Case:
    def make():
        frame, up, plan, _ = _leaf_tables_input(families, kids, sizes)
        batch = _family_batch(frame, up, ["geocode"])
        solve = dp_tables_solver(plan, leaves=True)
        parent_columns = ["parent_level", "parent_groups", "parent_noisy", "parent_widen"]
        return _arrow(batch), _children_call(
            solve, ["level", "geocode", "groups", "noisy"], parent_columns, True
        )

    cells = families * kids * sizes
    name = f"dp tables, leaves {families} x {kids}"
    return Case(name, "dp", "tables", cells, kids * sizes, make, _units, sizes=sizes)


def dp_leaf_split_case(families: int, kids: int, sizes: int) -> Case:
    def make():
        frame, _, plan, parent_truth = _leaf_tables_input(families, kids, sizes)
        parents = _geocodes("", families, 6)
        up = pd.DataFrame({"geocode": parents, "counts": _arrays(parent_truth)})
        batch = _family_batch(frame, up, ["geocode"])
        solve = dp_split_solver("leaf", plan, leaves=True)
        return _arrow(batch), _children_call(
            solve, ["level", "geocode", "groups", "noisy"], ["parent_counts"], True
        )

    cells = families * kids * sizes
    return Case(
        f"dp split, leaves {families} x {kids}",
        "dp",
        "split",
        cells,
        kids * sizes,
        make,
        sizes=sizes,
    )


def _mid_tables(families: int, kids: int, sizes: int, leaves_per_kid: int):
    """Cost-table rows of ``families * kids`` internal children (each over its own leaves), as
    the level above the leaves writes them (``TABLE_SCHEMA``), and their parents' truth."""
    mids = [t + m for t in _geocodes("", families, 3) for m in _geocodes("", kids, 3)]
    frame, up, plan, _ = _leaf_tables_input(len(mids), leaves_per_kid, sizes, mids)
    batch = _family_batch(frame, up, ["geocode"])
    solve = dp_tables_solver(plan, leaves=True)
    parent_columns = ["parent_level", "parent_groups", "parent_noisy", "parent_widen"]
    call = _children_call(solve, ["level", "geocode", "groups", "noisy"], parent_columns, True)
    tables = pd.concat(call(batch), ignore_index=True)
    tables[PARENT] = tables["geocode"].str[:3]
    # A parent value inside every family's merged domain: its children's window centres.
    centre = tables["lo"] + tables["lengths"].map(lambda x: int(np.sum(x)) // 2)
    top = centre.to_numpy().reshape(families, kids, sizes).sum(1)
    return tables, plan, top


def dp_mid_tables_case(families: int, kids: int, sizes: int) -> Case:
    def make():
        tables, plan, top = _mid_tables(families, kids, sizes, 4)
        up = _parent_rows(sorted(set(tables[PARENT])), "top", top)
        children = tables.drop(columns="level")
        batch = _family_batch(children, up, ["geocode", "size"])
        solve = dp_tables_solver(plan, leaves=False)
        columns = [c for c in children.columns if c != PARENT]
        parent_columns = ["parent_level", "parent_groups", "parent_noisy", "parent_widen"]
        return _arrow(batch), _children_call(solve, columns, parent_columns, True)

    cells = families * kids * sizes
    name = f"dp tables, internal {families} x {kids}"
    return Case(name, "dp", "tables", cells, kids * sizes, make, _units, sizes=sizes)


def dp_mid_split_case(families: int, kids: int, sizes: int) -> Case:
    def make():
        tables, plan, top = _mid_tables(families, kids, sizes, 4)
        parents = sorted(set(tables[PARENT]))
        up = pd.DataFrame({"geocode": parents, "counts": _arrays(top)})
        children = tables.drop(columns="level")
        batch = _family_batch(children, up, ["geocode", "size"])
        solve = dp_split_solver("mid", plan, leaves=False)
        columns = [c for c in children.columns if c != PARENT]
        return _arrow(batch), _children_call(solve, columns, ["parent_counts"], True)

    cells = families * kids * sizes
    name = f"dp split, internal {families} x {kids}"
    return Case(name, "dp", "split", cells, kids * sizes, make, _units, sizes=sizes)


def noise_case(nodes: int, sizes: int, measurement: str) -> Case:
    def make():
        rng = np.random.default_rng(5)
        truth = _truth(rng, nodes, sizes, GROUPS_PER_LEAF)
        cells = [np.flatnonzero(row).astype(np.int32) for row in truth]
        counts = [row[c] for row, c in zip(truth, cells, strict=True)]
        frame = pd.DataFrame(
            {
                "level": "leaf",
                "geocode": _geocodes("", nodes, 10),
                "cells": cells,
                "counts": counts,
                "group": "g",
            }
        )
        plan = NoisePlan(measurement, sizes, {"leaf": HISTOGRAM_SCALE}, "level", "top")
        task = _streamed(
            ["level", "group"], _one_by_one(["level", "group"], noise_solver(SECRET, plan)), None
        )
        return _arrow(frame), lambda f: list(task(iter([f])))

    cells = nodes * sizes
    return Case(f"noise ({measurement}) {nodes}", "noise", "batch", cells, cells, make, sizes=sizes)


def _units(batch: pa.RecordBatch, outputs: list[pd.DataFrame]) -> int:
    return _units_of([batch, *outputs])


# --- measurement ----------------------------------------------------------------------------------


def _measured(case: Case) -> tuple[int, float, int, int]:
    batch, call = case.make()
    before = common.memory_baseline()
    started = time.perf_counter()
    frame = batch.to_pandas()
    outputs = call(frame)
    shipped = [_arrow(o) for o in outputs]
    seconds = time.perf_counter() - started
    peak = common.memory_status("VmHWM:") - before + batch.nbytes
    return peak, seconds, case.units(batch, outputs), sum(s.num_rows for s in shipped)


def measure(case: Case) -> dict:
    result = common.in_fresh_process(lambda: _measured(case))
    assert result is not None  # no timeout
    peak, seconds, units, rows = result
    return {
        "case": case.name,
        "mechanism": case.mechanism,
        "kind": case.kind,
        "sizes": case.sizes,
        "cells": case.cells,
        "family_cells": case.family_cells,
        "units": units,
        "peak": peak,
        "seconds": seconds,
        "rows_out": rows,
    }


def cases(sizes: list[int]) -> list[Case]:
    """Per N: batches of many small families (the batch's rows dominate) and one large family
    (the family's solve dominates; for ``cumulative`` with few groups per child, as blocks
    have, and with many, as the benchmarks' heavy-tailed leaves have), each sized to stay
    within a few hundred MiB and a few minutes on a shared machine."""
    out: list[Case] = []
    for n in sizes:
        out += [
            noise_case(max(100, 2_000_000 // n), n, "histogram"),
            noise_case(max(100, 2_000_000 // n), n, "cumulative"),
            cumulative_case(max(4, 40_000 // n), 10, n),
            cumulative_case(1, max(50, 200_000 // n), n),
            cumulative_case(1, max(28, 200_000 // n), n, groups=10_000),
            dp_leaf_tables_case(max(10, 200_000 // n), 10, n),
            dp_leaf_split_case(max(10, 200_000 // n), 10, n),
            dp_mid_tables_case(max(1, 10_000 // n), 10, n),
            dp_mid_split_case(max(1, 10_000 // n), 10, n),
        ]
        if n <= 4000:
            out += [relaxed_case(10, 10, n), relaxed_case(1, 50, n)]
    return out


def derive(rows: list[dict]) -> dict[str, float]:
    """The per-cell and per-unit figures of ``group_sizes.memory``, the largest of each kind:
    batch figures from the calls of many small families, family figures from one large family
    less the batch figure, dp's cell figure from the leaves' splits (no tables) and its unit
    figure from the calls holding tables, less their cells."""

    def most(values) -> float:
        return max(values, default=float("nan"))

    def of(mechanism: str, kind: str) -> list[dict]:
        return [r for r in rows if r["mechanism"] == mechanism and r["kind"] == kind]

    out = {"NOISE_CELL_BYTES": most(r["peak"] / r["cells"] for r in of("noise", "batch"))}
    for mechanism, prefix in (
        ("cumulative", "CUMULATIVE"),
        ("relaxed_families", "RELAXED_FAMILIES"),
    ):
        batch = most(r["peak"] / r["cells"] for r in of(mechanism, "batch"))
        family = most(r["peak"] / r["family_cells"] - batch for r in of(mechanism, "family"))
        out[f"{prefix}_BATCH_CELL_BYTES"], out[f"{prefix}_FAMILY_CELL_BYTES"] = batch, family
    dp = [r for r in rows if r["mechanism"] == "dp"]
    cell = most(r["peak"] / r["cells"] for r in dp if not r["units"])
    out["DP_CELL_BYTES"] = cell
    out["DP_UNIT_BYTES"] = most(
        (r["peak"] - cell * r["cells"]) / r["units"] for r in dp if r["units"]
    )
    return out


def predicted(row: dict) -> float:
    """The call's need by ``group_sizes.memory``'s figures (as the door estimates it)."""
    m = memory
    if row["mechanism"] == "noise":
        return m.NOISE_CELL_BYTES * row["cells"]
    if row["mechanism"] == "dp":
        return m.DP_CELL_BYTES * row["cells"] + m.DP_UNIT_BYTES * row["units"]
    prefix = "CUMULATIVE" if row["mechanism"] == "cumulative" else "RELAXED_FAMILIES"
    batch, family = (getattr(m, f"{prefix}_{k}_CELL_BYTES") for k in ("BATCH", "FAMILY"))
    return batch * row["cells"] + family * row["family_cells"]


def report(rows: list[dict], command: str, load: str, seconds: float) -> list[str]:
    figures = derive(rows)
    lines = [
        "# Group-size release: peak memory of one Spark Python call per mechanism",
        "",
        f"Command: `{command}`  ",
        f"{common.machine_line(('numpy', 'pandas', 'pyarrow'))}; load average at start {load} "
        f"(shared machine: the times are pessimistic, the memory is not). Wall time {seconds:.0f} s.",
        "",
        "Each row is one call in a fresh forked process: the Arrow batch -> pandas -> the "
        "engine's family plumbing and the release's solver -> Arrow. `peak` = peak resident "
        "memory during the call less the resident memory before it, plus the Arrow batch. A cell "
        "is a (child, size) pair of the batch; `family cells` those of its largest family; "
        "`units` the slopes of the listed dp cost tables in the call's input and output. "
        "`estimate / peak`: what `group_sizes.memory` reckons for the same call over what it used.",
        "",
        "| call | N | cells | family cells | units | peak MiB | B / cell | estimate / peak | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['sizes']:,} | {r['cells']:,} | {r['family_cells']:,} | "
            f"{r['units']:,} | {r['peak'] / 2**20:.1f} | {r['peak'] / r['cells']:.0f} | "
            f"{predicted(r) / r['peak']:.2f} | {r['seconds']:.1f} |"
        )
    lines += [
        "",
        "Derived (the largest of each kind over the rows; `group_sizes.memory` holds them "
        "rounded up):",
        "",
        "| figure | measured | in `group_sizes.memory` |",
        "|---|---|---|",
        *[
            f"| `{name}` | {value:.0f} | {getattr(memory, name)} |"
            for name, value in figures.items()
        ],
        "",
    ]
    return lines


# --- the whole job ---------------------------------------------------------------------------------


def synthetic_job(folder: Path, fanouts: list[int], sizes: int) -> Path:
    """A households input on a full tree of ``fanouts`` and its config (level l0 the root)."""
    rng = np.random.default_rng(2)
    codes, digits = [""], [0]
    for fanout in fanouts:
        width = len(str(fanout - 1))
        codes = [c + str(i).zfill(width) for c in codes for i in range(fanout)]
        digits.append(digits[-1] + width)
    (folder / "spine.csv").write_text("block\n" + "\n".join(codes) + "\n")
    law = np.arange(1, sizes + 1, dtype=np.float64) ** -2.0
    size = rng.choice(np.arange(1, sizes + 1), size=HOUSEHOLDS, p=law / law.sum())
    leaf = np.asarray(codes)[rng.integers(0, len(codes), HOUSEHOLDS)]
    pd.DataFrame({"block": leaf, "hh": np.arange(HOUSEHOLDS), "n": size}).to_csv(
        folder / "households.csv", index=False
    )
    levels = ", ".join(f'{{ name = "l{i}", digits = {d} }}' for i, d in enumerate(digits))
    config = folder / "pgsr.toml"
    config.write_text(
        f"""[run]
name = "memory"
output = "{folder / "out"}"
private_dir = "{folder / "private"}"
[geography]
levels = [{levels}]
spine = {{ path = "{folder / "spine.csv"}", geocode = "block" }}
[groups]
max_size = {sizes}
topcode = true
[input]
path = "{folder / "households.csv"}"
layout = "households"
geocode = "block"
household = "hh"
size = "n"
[budget]
epsilon = "1"
"""
    )
    return config


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _worker_peaks(peaks: dict[int, int], stop: threading.Event) -> None:
    """Poll the Python workers (``pyspark.daemon`` and its forks) below this process."""
    while not stop.is_set():
        for pid in _descendants(os.getpid()):
            try:
                if b"pyspark.daemon" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:
                continue
            hwm = next(int(x.split()[1]) * 1024 for x in status if x.startswith("VmHWM:"))
            peaks[pid] = max(peaks.get(pid, 0), hwm)
        time.sleep(0.1)


def end_to_end(spec: str) -> dict:
    """One job run (``MECHANISM:N:FANOUTS``): the largest worker's peak and the estimate."""
    from dataclasses import replace

    from censusdp_spark.cli import main as censusdp
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.group_sizes.config import load_group_sizes_config
    from censusdp_spark.group_sizes.readers import read_leaf_histograms
    from censusdp_spark.release.runner import REGISTRY_ENV

    mechanism, sizes, shape = spec.split(":")
    fanouts = [int(x) for x in shape.split("x")]
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        folder = Path(tmp)
        os.environ[REGISTRY_ENV] = str(folder / "registry")  # not the user's secret bindings
        os.environ[memory.WORKER_MEMORY_ENV] = "1t"  # measured, not refused at the door
        config = synthetic_job(folder, fanouts, int(sizes))
        secret = common.write_secret(folder / "secret.hex", "7a" * 32 + "\n")
        spark = spark_session("censusdp-memory", "local[1]")
        peaks: dict[int, int] = {}
        stop = threading.Event()
        poller = threading.Thread(target=_worker_peaks, args=(peaks, stop), daemon=True)
        poller.start()
        started = time.perf_counter()
        args = ["pgsr", "--config", str(config), "--mechanism", mechanism, "--reuse-secret"]
        code = censusdp([*args, "--secret-file", str(secret), "--master", "local[1]"])
        seconds = time.perf_counter() - started
        stop.set()
        poller.join()
        run = replace(load_group_sizes_config(config), mechanism=mechanism)
        assert run.input is not None
        leaves = read_leaf_histograms(
            spark, run.input, run.groups, run.hierarchy.leaf.digits, run.spine
        )
        shapes = level_shapes(leaf_nodes(leaves, run.hierarchy), run.hierarchy)
        estimate = memory.estimate_memory(run, shapes, arrow_batch_rows(spark))
        manifest = (folder / "out" / "manifest.json").read_text() if code == 0 else "{}"
    optimality = json.loads(manifest).get("optimality", {})
    windows = ", ".join(f"{k} {v}" for k, v in optimality.items() if k.startswith("window_"))
    return {
        "spec": spec,
        "nodes": sum(s.nodes for s in shapes),
        "code": code,
        "seconds": seconds,
        "peak": max(peaks.values(), default=0),
        "estimate": estimate,
        "windows": windows,
    }


def spark_report(rows: list[dict], command: str, load: str) -> list[str]:
    lines = [
        "## The whole job: the largest Python worker's peak against the door's estimate",
        "",
        f"Command: `{command}`  ",
        f"Date: {common.timestamp()}; `local[1]`, load average at start "
        f"{load}. SYNTHETIC households ({HOUSEHOLDS:,}, sizes ~ 1/size^2, top-coded at N) on "
        "full trees; epsilon = 1, level faithfulness. `peak`: the largest `VmHWM` of the "
        "Python workers (polled every 0.1 s; a fresh worker holds about 60 MiB), `estimate`: "
        "`group_sizes.memory` for the same config and geography; `dp windows`: the l2 "
        "half-widths the run ended with (a widened rerun multiplies the first, "
        "`first_window`, by 8).",
        "",
        "| mechanism:N:tree | nodes | exit | s | peak GiB | estimate GiB | estimate / peak | "
        "largest call (estimate) | dp windows |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = r["estimate"]
        lines.append(
            f"| {r['spec']} | {r['nodes']:,} | {r['code']} | {r['seconds']:.0f} | "
            f"{r['peak'] / 2**30:.2f} | {e.bytes / 2**30:.2f} | {e.bytes / r['peak']:.2f} | "
            f"{e.call} | {r['windows']} |"
        )
    return [*lines, ""]


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--only", help="only the cases whose name contains this")
    parser.add_argument("--end-to-end", nargs="+", metavar="MECHANISM:N:FANOUTS")
    args = parser.parse_args()
    load = common.load_averages()
    command = common.command_line("python")
    if args.end_to_end:
        runs = []
        for spec in args.end_to_end:
            runs.append(end_to_end(spec))
            print(spark_report(runs, command, load)[-2], flush=True)
        common.write_report(SPARK_RESULTS, spark_report(runs, command, load), announce=True)
        return
    started = time.perf_counter()
    rows = []
    for case in cases(args.sizes):
        if args.only and args.only not in case.name:
            continue
        row = measure(case)
        rows.append(row)
        print(
            f"{row['case']:<32} N {row['sizes']:>6,} cells {row['cells']:>11,} units "
            f"{row['units']:>12,} peak {row['peak'] / 2**20:8.1f} MiB "
            f"{row['peak'] / row['cells']:7.1f} B/cell {row['seconds']:.1f} s",
            flush=True,
        )
    lines = report(rows, command, load, time.perf_counter() - started)
    if not args.only:
        common.write_report(RESULTS, lines, announce=True)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
