"""TopDown accuracy and speed on the real RI and HI 2010 blocks, against the exact GLS (best
linear unbiased) estimate from the same noisy measurements
(censusdp_spark/testing/gls_reference.py) and the block-by-block baseline at the same rho and
secret. Writes benchmarks/results/topdown.md (and the per-secret figures to
benchmarks/results/topdown.json).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/bench_topdown.py [--states ri hi]
        [--rhos 1/2 293764/114921 10] [--secrets 2] [--methods topdown,full_information] [--append]
        [--bypass]

Each (state, rho, secret, method) is a separate ``censusdp topdown`` process (its own JVM),
local[2], run on this worktree's code. A method other than ``topdown`` is written into the
generated config as ``[estimation] method = "<name>"``; ``<name>@total`` also sets
``[estimation] passes = ["total", "all"]`` (the Census's two passes at every level) and
``<name>@total:county+tract`` the same at the listed levels only. The config is loaded here
first, so a method the installed code does not know fails at the door, before any run. GLS and
the baseline depend only on the noisy measurements (the secret and rho), not on the method:
they are computed once per (state, rho, secret), from the first method's
``noisy_measurements``.

Per level, against the input: the mean absolute error of node totals (MAE) and the mean over
nodes of the detailed L1 error (sum over the 16 cells of |released - true|); at the blocks, the
mean released total of the empty blocks (true total 0). Figures are means over the secrets.
The baseline spends the whole rho on each block's detailed histogram (sigma^2 = 1/rho per
cell) and sums the noisy blocks up; its noise is redrawn here from the release's own keyed
stream, so it is the same baseline the release's ``--evaluate`` reports.

``--bypass`` sets ``[budget] bypass_single_child = true`` in every generated config (GLS then
reads each row's own variance, and has no rows for the bypassed parents).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import _common as common
import numpy as np
from _topdown_runs import censusdp_topdown

from censusdp_spark.model.errors import ConfigError
from censusdp_spark.privacy import discrete_gaussian, keyed_rng
from censusdp_spark.testing.gls_reference import (
    ESTIMATES,
    NOISY_MEASUREMENTS,
    gls_reference,
    level_errors,
    read_delta,
)
from censusdp_spark.topdown.config import load_topdown_config

DEMO_RHO = 'rho = "293764/114921"'
DEFAULT_METHOD = "topdown"
GLS = "gls"
GLS_INTEGER = "gls_integer"
"""The GLS's node totals rounded to the nearest integer: an integer release's reference."""
BASELINE = "block_by_block"
FIRST_SECRET = "9c" * 32  # the secret of the earlier one-secret tables


def secret_hex(i: int) -> str:
    """Secret ``i`` of the benchmark: fixed, so a rerun measures the same noise."""
    if i == 0:
        return FIRST_SECRET
    return common.secret_hex(f"bench_topdown secret {i}")


def config_text(state: str, rho: str, method: str, bypass: bool = False) -> str:
    """The demo config at ``rho`` with ``method`` (``<name>[@<pass>...]``) in ``[estimation]``
    (and with ``bypass``, ``bypass_single_child = true`` in ``[budget]``)."""
    text = (common.ROOT / "conf" / f"{state}_2010_demo.toml").read_text()
    assert DEMO_RHO in text
    text = text.replace(
        DEMO_RHO, f'rho = "{rho}"' + ("\nbypass_single_child = true" if bypass else "")
    )
    # A shipped default is overridden below.
    text = re.sub(r"(?m)^(method|passes)\s*=.*\n", "", text)
    line = f'method = "{method.split("@")[0]}"\n'
    if passes := estimation_passes(method):
        line += f"passes = {passes}\n"
    if "[estimation]\n" in text:
        return text.replace("[estimation]\n", "[estimation]\n" + line, 1)
    return text + "\n[estimation]\n" + line


def estimation_passes(method: str) -> str | None:
    """The TOML value of ``[estimation] passes`` for ``method``: none for ``<name>``,
    ``["total", "all"]`` for ``<name>@total`` (every level), a table for
    ``<name>@total:<level>+<level>...`` (those levels; the others one pass)."""
    if "@" not in method:
        return None
    first, _, levels = method.split("@", 1)[1].partition(":")
    passes = json.dumps([first, "all"])
    if not levels:
        return passes
    return "{ " + ", ".join(f"{level} = {passes}" for level in levels.split("+")) + " }"


def check_methods(
    states: list[str], rhos: list[str], methods: list[str], work: Path, bypass: bool = False
) -> None:
    """Load every generated config once, so an unknown method fails before any run."""
    for state in states:
        for method in methods:
            path = work / f"check_{state}_{method}.toml"
            path.write_text(config_text(state, rhos[0], method, bypass))
            try:
                load_topdown_config(path, common.ROOT)
            except ConfigError as err:
                sys.exit(f"method {method!r} is not accepted by this worktree's code: {err}")


def run_once(
    state: str, rho: str, method: str, secret: Path, work: Path, bypass: bool = False
) -> tuple[Path, float, dict]:
    name = f"{state}_{rho.replace('/', '_')}_{secret.stem}_{method}" + ("_bypass" if bypass else "")
    config = work / f"{name}.toml"
    config.write_text(config_text(state, rho, method, bypass))
    out = work / name
    wall = censusdp_topdown(
        # An experiment: one secret across states, rhos and methods, by design (the outputs
        # are marked not for release), with its own secret-binding registry.
        ["--config", str(config), "--output", str(out), "--secret-file", str(secret)]
        + ["--reuse-secret", "--master", "local[2]"],
        work,
    )
    return out, wall, json.loads((out / "manifest.json").read_text())


def released(out: Path, levels: list, n_cells: int) -> dict[str, np.ndarray]:
    """Each level's released histograms, dense, in the reference's node order (absent cells
    are 0)."""
    table = read_delta(out / ESTIMATES)
    dense = {}
    for lv in levels:
        rows = table[table["level"] == lv.name]
        geocodes = rows["geocode"].to_numpy().astype(str)
        index = np.searchsorted(lv.geocodes, geocodes)
        assert (lv.geocodes[np.minimum(index, len(lv.geocodes) - 1)] == geocodes).all()
        dense[lv.name] = np.zeros((len(lv.geocodes), n_cells))
        np.add.at(dense[lv.name], (index, rows["cell"].to_numpy()), rows["count"].to_numpy())
    return dense


def baseline_noise(secret: bytes, blocks: np.ndarray, rho: Fraction, n_cells: int) -> np.ndarray:
    """Per block, the baseline's detailed noise from the release's keyed stream (as
    ``topdown.evaluate.baseline_error_sums`` draws it)."""
    sigma2 = 1 / rho
    return np.stack(
        [
            discrete_gaussian(
                sigma2, n_cells, keyed_rng(secret, "baseline", "block", g, "detailed")
            )
            for g in blocks
        ]
    ).astype(np.float64)


def empty_blocks(estimate: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    empty = truth.sum(axis=1) == 0
    totals = estimate[empty].sum(axis=1)
    return {
        "empty_blocks": int(empty.sum()),
        "empty_mean_total": float(totals.mean()) if empty.any() else 0.0,
        "empty_share_ge_1": float((totals >= 1).mean()) if empty.any() else 0.0,
    }


def total_distance(estimate: np.ndarray, reference: np.ndarray) -> float:
    """Mean over nodes of |estimate's total - reference's total| (either may be already
    summed: one value per node)."""

    def totals(a: np.ndarray) -> np.ndarray:
        return a.sum(axis=1) if a.ndim == 2 else a

    return float(np.abs(totals(estimate) - totals(reference)).mean())


def measure_case(
    state: str,
    rho: str,
    secret_i: int,
    methods: list[str],
    work: Path,
    keep: bool,
    bypass: bool = False,
) -> dict:
    """Every method, GLS and the baseline for one (state, rho, secret)."""
    secret = common.write_secret(work / f"secret{secret_i}.hex", secret_hex(secret_i))
    case: dict = {
        "state": state,
        "rho": rho,
        "secret": secret_i,
        "runs": {},
        "errors": {},
        "from_gls": {},
        "bypass": bypass,
    }
    outputs = {}
    for method in methods:
        out, wall, manifest = run_once(state, rho, method, secret, work, bypass)
        outputs[method] = out
        case["runs"][method] = {"wall_s": wall, "timings_s": manifest["timings_s"]}
        print(f"{state} rho={rho} secret={secret_i} {method}: {wall:.0f} s", file=sys.stderr)
    first = outputs[methods[0]]
    ref = gls_reference(first, work / f"{first.name}.toml")
    case["gls"] = {**vars(ref.stats), "read_s": ref.read_s}
    print(f"  GLS: read {ref.read_s:.1f} s; {ref.stats.text()}", file=sys.stderr)
    noisy = read_delta(first / NOISY_MEASUREMENTS)
    for method in methods[1:]:
        other = read_delta(outputs[method] / NOISY_MEASUREMENTS)
        if not _same_measurements(noisy, other):
            print(f"  warning: {method}'s noisy_measurements differ from {methods[0]}'s")
    blocks = ref.levels[-1]
    n_cells = blocks.gls.shape[1]
    started = time.perf_counter()
    noise = baseline_noise(
        bytes.fromhex(secret_hex(secret_i)), blocks.geocodes, Fraction(rho), n_cells
    )
    case["baseline_s"] = time.perf_counter() - started
    estimates = {m: released(out, ref.levels, n_cells) for m, out in outputs.items()}
    for lv in ref.levels:
        per: dict[str, dict[str, float]] = {}
        for method in outputs:
            per[method] = level_errors(estimates[method][lv.name], lv.truth)
        per[GLS] = level_errors(lv.gls, lv.truth)
        digits = len(lv.geocodes[0])
        _, node_of_block = np.unique([g[:digits] for g in blocks.geocodes], return_inverse=True)
        summed = np.zeros_like(lv.gls)
        np.add.at(summed, node_of_block, noise)
        per[BASELINE] = level_errors(lv.truth + summed, lv.truth)
        case["errors"][lv.name] = per
        case["from_gls"][lv.name] = {
            **{m: total_distance(estimates[m][lv.name], lv.gls) for m in outputs},
            GLS_INTEGER: total_distance(np.round(lv.gls.sum(axis=1)), lv.truth),
        }
    case["empty"] = {
        **{m: empty_blocks(estimates[m][blocks.name], blocks.truth) for m in outputs},
        GLS: empty_blocks(blocks.gls, blocks.truth),
        BASELINE: empty_blocks(blocks.truth + noise, blocks.truth),
    }
    if not keep:
        for out in outputs.values():
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(out.parent / f"{out.name}.private", ignore_errors=True)
    return case


def _same_measurements(a, b) -> bool:
    def key(df):
        return df.sort_values(["level", "geocode", "query"])["noisy"].map(tuple).tolist()

    return len(a) == len(b) and key(a) == key(b)


# --- the report -----------------------------------------------------------------------------


def _mean(cases: list[dict], level: str, method: str, metric: str) -> float:
    return float(np.mean([c["errors"][level][method][metric] for c in cases]))


def _groups(cases: list[dict]) -> list[tuple[str, str, list[dict]]]:
    keys = list(dict.fromkeys((c["state"], c["rho"]) for c in cases))
    return [(s, r, [c for c in cases if (c["state"], c["rho"]) == (s, r)]) for s, r in keys]


def _rho(rho: str) -> str:
    return f"{float(Fraction(rho)):.3g}"


def error_table(cases: list[dict], methods: list[str], levels: list[str], metric: str) -> list[str]:
    lines = [
        "| state | rho | method | " + " | ".join(levels) + " |",
        "|---|---|---|" + "---|" * len(levels),
    ]
    for state, rho, group in _groups(cases):
        for method in [*methods, GLS, BASELINE]:
            lines.append(
                f"| {state.upper()} | {_rho(rho)} | {method} | "
                + " | ".join(f"{_mean(group, lv, method, metric):.2f}" for lv in levels)
                + " |"
            )
    return lines


def ratio_table(cases: list[dict], methods: list[str], levels: list[str]) -> list[str]:
    """Method / GLS per level: the ratio of the means over secrets, and the per-secret range."""
    lines = [
        "| state | rho | method | metric | " + " | ".join(levels) + " |",
        "|---|---|---|---|" + "---|" * len(levels),
    ]
    for state, rho, group in _groups(cases):
        for method in methods:
            for metric in ("mae_total", "l1_detailed"):
                cells = []
                for lv in levels:
                    gls = _mean(group, lv, GLS, metric)
                    if gls < 1e-9:
                        cells.append("exact")
                        continue
                    each = [
                        c["errors"][lv][method][metric] / c["errors"][lv][GLS][metric]
                        for c in group
                    ]
                    spread = f" ({min(each):.2f}-{max(each):.2f})" if len(each) > 1 else ""
                    cells.append(f"{_mean(group, lv, method, metric) / gls:.2f}x{spread}")
                lines.append(
                    f"| {state.upper()} | {_rho(rho)} | {method} | {metric} | "
                    + " | ".join(cells)
                    + " |"
                )
    return lines


def empty_table(cases: list[dict], methods: list[str]) -> list[str]:
    lines = [
        "| state | rho | empty blocks | "
        + " | ".join(f"{m}: mean total (share >= 1)" for m in [*methods, GLS, BASELINE])
        + " |",
        "|---|---|---|" + "---|" * (len(methods) + 2),
    ]
    for state, rho, group in _groups(cases):
        cells = []
        for m in [*methods, GLS, BASELINE]:
            mean = np.mean([c["empty"][m]["empty_mean_total"] for c in group])
            share = np.mean([c["empty"][m]["empty_share_ge_1"] for c in group])
            cells.append(f"{mean:+.2f} ({100 * share:.0f}%)")
        n = group[0]["empty"][methods[0]]["empty_blocks"]
        lines.append(f"| {state.upper()} | {_rho(rho)} | {n} | " + " | ".join(cells) + " |")
    return lines


def integer_table(cases: list[dict], methods: list[str], levels: list[str]) -> list[str]:
    """Per level: each method's mean |total - GLS total|, and the MAE against the input of the
    GLS totals rounded to integers, over the cases that recorded them."""
    lines = [
        "| state | rho | secrets | figure | " + " | ".join(levels) + " |",
        "|---|---|---|---|" + "---|" * len(levels),
    ]
    for state, rho, group in _groups(cases):
        have = [c for c in group if c.get("from_gls")]
        if not have:
            continue
        rows = [(f"{m}: mean abs(total - GLS total)", m) for m in methods]
        rows.append(("round(GLS total): MAE against the input", GLS_INTEGER))
        for label, key in rows:
            values = [np.mean([c["from_gls"][lv][key] for c in have]) for lv in levels]
            lines.append(
                f"| {state.upper()} | {_rho(rho)} | {len(have)} | {label} | "
                + " | ".join(f"{v:.2f}" for v in values)
                + " |"
            )
    return lines


def gls_table(cases: list[dict]) -> list[str]:
    lines = [
        "| state | rho | secret | unknowns | constraints | LU nnz | read s | assemble s | factor s"
        " | solve s | relative residual | max constraint violation |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        g = c["gls"]
        lines.append(
            f"| {c['state'].upper()} | {_rho(c['rho'])} | {c['secret']} | {g['unknowns']} | "
            f"{g['constraints']} | {g['factor_nonzeros']} | {g['read_s']:.1f} | "
            f"{g['assemble_s']:.1f} | {g['factor_s']:.1f} | {g['solve_s']:.1f} | "
            f"{g['relative_residual']:.1e} | {g['max_constraint_violation']:.1e} |"
        )
    return lines


ESTIMATION_PHASES = ("bottom_up_", "estimate_")
"""The phases that make up the estimation (the ``estimation`` column of the timing table)."""


def estimation_s(timings: dict[str, float]) -> float:
    return sum(v for p, v in timings.items() if p.startswith(ESTIMATION_PHASES))


def timing_table(cases: list[dict], methods: list[str]) -> list[str]:
    phases = list(dict.fromkeys(p for m in methods for p in cases[0]["runs"][m]["timings_s"]))
    lines = [
        "| state | rho | secret | method | wall | estimation | " + " | ".join(phases) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(phases),
    ]
    for c in cases:
        for m in methods:
            r = c["runs"][m]
            lines.append(
                f"| {c['state'].upper()} | {_rho(c['rho'])} | {c['secret']} | {m} | "
                f"{r['wall_s']:.0f} | {estimation_s(r['timings_s']):.1f} | "
                + " | ".join(f"{r['timings_s'].get(p, float('nan')):.1f}" for p in phases)
                + " |"
            )
    return lines


def all_bypassed(cases: list[dict]) -> bool:
    """Whether every case ran with ``--bypass`` (cases saved before the key existed did not)."""
    return all(c.get("bypass") for c in cases)


def chain_note(cases: list[dict]) -> list[str]:
    """What the nation and state columns mean: with or without bypassing the nation -> state
    chain (one state per run)."""
    if all_bypassed(cases):
        return [
            "With bypassing the nation (the state's single-child parent) is not measured: its",
            "share of rho moves to the state, measured at the summed rho, and the nation is",
            "released as the state; GLS reads each row's own variance.",
        ]
    return [
        "At nation and state, the single-child chain (nation = state) explains the gap:",
        "TopDown's state histogram comes from the nation's 2.5% share; GLS uses the state's own",
        "measurements as well.",
    ]


def report(cases: list[dict], methods: list[str], commands: list[str], levels: list[str]) -> str:
    secrets = [len(g) for _, _, g in _groups(cases)]
    counts = f"{min(secrets)}" if min(secrets) == max(secrets) else f"{min(secrets)}-{max(secrets)}"
    bypassed = ", single-child parents bypassed," if all_bypassed(cases) else ""
    lines = [
        f"## {' and '.join(methods)}{bypassed} vs the exact GLS and the block-by-block"
        " baseline (real RI/HI 2010 blocks, 16 cells)",
        "",
        common.command_note(
            commands,
            master="local[2]",
            extra=(
                "a shared machine",
                f"{counts} secret(s) per state and rho; figures are means over the secrets",
            ),
        )
        + ".",
        "",
        "Baselines, from the same noisy measurements: `gls` is the exact generalised-least-squares",
        "(best linear unbiased) estimate of every",
        "node's histogram from all the run's `noisy_measurements`, with the invariant (state)",
        "totals exact, unrounded and unconstrained in sign (`censusdp_spark/testing/gls_reference.py`, a sparse",
        "KKT solve independent of the project's estimators). `block_by_block` spends the whole rho",
        "on each block's detailed histogram and sums the noisy blocks up (its noise redrawn from",
        "the release's own keyed stream). State totals are invariant: total-population error is 0",
        "at nation and state for `topdown` and `gls` by construction.",
        "",
        "### Mean absolute error of total population per level (lower is better)",
        "",
        *error_table(cases, methods, levels, "mae_total"),
        "",
        "### Mean detailed L1 error per level (sum over the 16 cells of |released - true|)",
        "",
        *error_table(cases, methods, levels, "l1_detailed"),
        "",
        "### Ratio to GLS per level (ratio of the means; per-secret range in brackets)",
        "",
        "For reference, as reported for a held-out 2020 state (same budget, rho = 2.56; not measured",
        "here): TopDown/GLS MAE 1.47x county, 1.45x tract, 1.11x block group, 0.82x block; state",
        "detailed L1 60 vs 10.",
        "",
        *ratio_table(cases, methods, levels),
        "",
        "At the blocks (and partly the block groups) the ratios compare unlike things: `gls` is",
        "unrounded and signed, and most block cells are 0, so its block error is unbiased noise",
        "spread over 16 cells, which TopDown's non-negativity and rounding cut (at the cost of the bias",
        "in the empty blocks below).",
        *chain_note(cases),
        "",
        "### Distance from the GLS, and the GLS rounded to integers (node totals)",
        "",
        "A released total is an integer and the GLS's is not: rounding the GLS's own totals",
        "to the nearest integer is the reference an integer release is up against",
        "(`round(GLS total)`, not consistent across levels). Cases recorded before this table",
        "existed are left out (`secrets` counts those in).",
        "",
        *integer_table(cases, methods, levels),
        "",
        "### Empty blocks (true total 0): mean released total and share released >= 1",
        "",
        *empty_table(cases, methods),
        "",
        "### GLS solve (SuperLU on the KKT system over all node histograms, one refinement step)",
        "",
        *gls_table(cases),
        "",
        "### Wall time per run (whole job incl. JVM start) and per phase, seconds",
        "",
        *timing_table(cases, methods),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--states", nargs="+", default=["ri", "hi"])
    parser.add_argument("--rhos", nargs="+", default=["1/2", "293764/114921", "10"])
    parser.add_argument("--secrets", type=int, default=2, help="secrets per state and rho")
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHOD,
        help="comma-separated [estimation] methods, e.g. topdown,full_information;"
        " <method>@total for the two passes at every level,"
        " <method>@total:<level>+<level> at those levels only",
    )
    parser.add_argument("--keep", type=Path, help="keep the releases in this folder")
    parser.add_argument(
        "--bypass",
        action="store_true",
        help="[budget] bypass_single_child = true in every run (single-child parents bypassed)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to the cases saved beside --results (those already there are not rerun)",
    )
    common.results_option(parser, common.RESULTS_DIR / "topdown.md")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite --results from the saved cases without running anything",
    )
    args = parser.parse_args()
    if args.report_only:
        earlier = json.loads(args.results.with_suffix(".json").read_text())
        cases = earlier["cases"]
        levels = list(cases[0]["errors"])
        common.write_report(
            args.results, report(cases, list(cases[0]["runs"]), earlier["commands"], levels)
        )
        return
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    niceness = os.nice(0)
    command = common.command_line(
        "PYTHONPATH=$PWD " + (f"nice -n {niceness} " if niceness else "") + ".venv/bin/python"
    )
    levels = list(
        load_topdown_config(common.ROOT / "conf" / "ri_2010_demo.toml", common.ROOT).hierarchy.names
    )
    saved = args.results.with_suffix(".json")
    commands, cases = [command], []
    if args.append and saved.exists():
        earlier = json.loads(saved.read_text())
        commands, cases = [*earlier["commands"], command], earlier["cases"]
        if any(list(c["runs"]) != methods for c in cases):
            sys.exit(f"{saved}: the earlier cases ran other methods than {methods}")
    done = {(c["state"], c["rho"], c["secret"]) for c in cases}
    text = report(cases, methods, commands, levels) if cases else ""
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        check_methods(args.states, args.rhos, methods, work, args.bypass)
        for state in args.states:
            for rho in args.rhos:
                for i in range(args.secrets):
                    if (state, rho, i) in done:
                        continue
                    cases.append(
                        measure_case(
                            state, rho, i, methods, work, args.keep is not None, args.bypass
                        )
                    )
                    text = report(cases, methods, commands, levels)
                    # Rewritten after every case, so a run cut short keeps its figures.
                    common.write_report(args.results, text)
                    saved.write_text(json.dumps({"commands": commands, "cases": cases}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
