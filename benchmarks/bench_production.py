"""Both estimation methods on the 2,016-cell production schema: accuracy per level and
query against the input, and run time per stage.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_production.py [--inputs perry ri]
        [--secrets 2] [--methods topdown,full_information] [--work DIR] [--append] [--gls]

``perry`` is the shipped 2010 demonstration PPMF sample (Perry County, AL) with
``conf/pl94_2020_production.toml`` as shipped; ``ri`` is the real RI 2010 blocks expanded to
2,016 cells by ``benchmarks/expand_pl94.py --seed 1`` (block, voting age and Hispanic origin
real; detailed race and GQ type SYNTHETIC), generated into ``DIR`` on first use, on the spine
of every RI 2010 block (``RI_SPINE``).

Every (input, secret, method) is one ``censusdp topdown --evaluate`` process with the same secret
file for both methods, so both post-process the same noisy measurements (the outputs are marked
not for release: an experiment, with its own secret registry). The errors are the evaluation's
own rows (``mean_l1`` per level and query: the mean over nodes of the L1 error of that marginal;
``mae_total`` for total population) and the stage times the manifest's. With ``--gls`` each
secret also gets the exact GLS from the last method's noisy measurements
(``censusdp_spark.testing.gls_reference``'s elimination along the tree), scored the same way;
a release the work folder lacks is made again first and must score exactly as the saved run. Writes
benchmarks/results/topdown_production.md (and the per-run figures beside it as JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

import _common as common
import numpy as np
import pandas as pd
from _topdown_runs import evaluated_run, production_config, production_input

from censusdp_spark.testing.gls_reference import gls_reference, release_config

RESULTS = common.RESULTS_DIR / "topdown_production.md"
BLUEDOWN = {  # BlueDown's L1 per query over ours (TopDown), Perry County, two secrets
    "state": "0.20-0.59",
    "county": "0.20-0.59",
    "tract": "0.39-0.62",
    "block_group": "0.65-0.97",
    "block": "0.98-0.99",
}


EXACT = 1e-6
"""An error below this is an invariant's (the GLS meets an exact total to round-off)."""
GLS = "gls"
"""The method name of the exact-GLS rows (not a release: a yardstick from the same noisy
measurements)."""


def release_folder(name: str, secret_i: int, method: str, work: Path) -> Path:
    return work / f"{name}_{secret_i}_{method}"


def run_once(name: str, method: str, secret_i: int, work: Path) -> dict:
    wall, manifest, errors = evaluated_run(
        production_config(method, work, name),
        release_folder(name, secret_i, method, work),
        secret_i,
        work,
        production_input(name, work),
    )
    return {
        "input": name,
        "secret": secret_i,
        "method": method,
        "wall_s": wall,
        "timings_s": manifest["timings_s"],
        "nodes": manifest["nodes"],
        "errors": errors,
    }


def gls_once(name: str, secret_i: int, method: str, work: Path) -> dict:
    """The exact GLS (``censusdp_spark.testing.gls_reference``'s tree elimination) from the
    noisy measurements of ``method``'s release of this input and secret, scored like the
    evaluation: per level the total-population MAE and each configured query's mean L1 against
    the input (unrounded, unconstrained in sign)."""
    release = release_folder(name, secret_i, method, work)
    ref = gls_reference(release, solver="tree")
    config = release_config(release, None, None)
    errors = []
    for lv in ref.levels:
        diff = lv.gls - lv.truth
        errors.append(
            {"level": lv.name, "metric": "mae_total", "query": "total",
             "value": float(np.abs(diff.sum(axis=1)).mean())}
        )  # fmt: skip
        for q in config.queries[lv.name]:
            value = float(np.abs(diff @ q.matrix().T).sum(axis=1).mean())
            errors.append({"level": lv.name, "metric": "mean_l1", "query": q.name, "value": value})
    print(f"{name} secret {secret_i} GLS: {ref.stats.text()}", flush=True)
    return {
        "input": name,
        "secret": secret_i,
        "method": GLS,
        "solve": {**vars(ref.stats), "read_s": ref.read_s},
        "errors": errors,
    }


def ensure_release(runs: list[dict], name: str, secret_i: int, method: str, work: Path) -> None:
    """Make ``method``'s release of this input and secret again if ``work`` does not hold it
    (runs saved by an earlier session), and check it scores exactly as the saved run did:
    the same secret gives the same noisy measurements and the same estimates."""
    if (release_folder(name, secret_i, method, work) / "manifest.json").exists():
        return
    saved = next(
        r for r in runs if (r["input"], r["secret"], r["method"]) == (name, secret_i, method)
    )
    again = run_once(name, method, secret_i, work)
    if again["errors"] != saved["errors"]:
        raise RuntimeError(f"{name} secret {secret_i} {method}: the rerun scores differently")
    print(f"{name} secret {secret_i} {method}: remade, same errors as saved", flush=True)


def _errors(runs: list[dict]) -> pd.DataFrame:
    rows = [
        {**e, "input": r["input"], "secret": r["secret"], "method": r["method"]}
        for r in runs
        for e in r["errors"]
    ]
    return pd.DataFrame(rows)


def _ratio(per: pd.Series, num: str, den: str) -> str:
    """Mean of ``num`` over mean of ``den`` on the secrets both have, then the range of the
    per-secret ratios (over the secrets where ``den`` is not 0)."""
    common = per[num].index.intersection(per[den].index)
    if abs(per[den][common].mean()) < EXACT:  # an invariant total: both exact
        return "-"
    measured = [s for s in common if abs(per[den][s]) >= EXACT]  # a ratio to 0 has no value
    ratios = per[num][measured] / per[den][measured]
    spread = f" ({ratios.min():.2f}-{ratios.max():.2f})" if len(ratios) > 1 else ""
    if len(measured) < len(common):
        spread += f" ({den} 0 on {len(common) - len(measured)} secret(s))"
    return f"{per[num][common].mean() / per[den][common].mean():.2f}×{spread}"


def accuracy_table(runs: list[dict], name: str, levels: list[str], methods: list[str]) -> list[str]:
    """Per level: total-population MAE and the sum over queries of the mean L1, each method's
    mean over secrets, and the ratio to the first method (per-secret range in brackets); with
    GLS rows, the GLS's too and the last method's ratio to it."""
    frame = _errors([r for r in runs if r["input"] == name])
    base, other = methods[0], methods[1:]
    gls = [GLS] if GLS in set(frame["method"]) else []
    head = "| level | metric | " + " | ".join(methods + gls)
    head += "".join(f" | {m} / {base}" for m in other)
    head += "".join(f" | {methods[-1]} / GLS" for _ in gls) + " | BlueDown / topdown (reported) |"
    width = len(methods) + 2 * len(gls) + len(other) + 1
    lines = [head, "|---|---|" + "---|" * width]
    for level in levels:
        here = frame[frame["level"] == level]
        for metric, label in (
            ("mae_total", "total-population MAE"),
            ("mean_l1", "sum of query L1"),
        ):
            per = here[here["metric"] == metric].groupby(["method", "secret"])["value"].sum()
            cells = [f"{per[m].mean():.2f}" for m in methods + gls]
            cells += [_ratio(per, m, base) for m in other]
            cells += [_ratio(per, methods[-1], GLS) for _ in gls]
            bluedown = BLUEDOWN.get(level, "-") if name == "perry" and metric == "mean_l1" else "-"
            lines.append(f"| {level} | {label} | " + " | ".join(cells) + f" | {bluedown} |")
    return lines


def bootstrap_interval(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """The 95% interval of ``mean(num) / mean(den)`` over secrets resampled in pairs (the same
    secret for both: they post-process the same noisy measurements); resamples whose ``den``
    mean is 0 have no ratio and are dropped."""
    picks = np.random.default_rng(0).integers(0, len(num), size=(common.RESAMPLES, len(num)))
    num_means, den_means = num[picks].mean(axis=1), den[picks].mean(axis=1)
    measured = np.abs(den_means) >= EXACT
    low, high = np.percentile(num_means[measured] / den_means[measured], [2.5, 97.5])
    return float(low), float(high)


def query_table(
    runs: list[dict], name: str, levels: list[str], num: str, den: str, *, intervals: bool = False
) -> list[str]:
    """Ratio of ``num``'s mean L1 to ``den``'s per level and query (means over the secrets
    both have); with ``intervals``, each ratio's 95% bootstrap interval over the secrets."""
    frame = _errors([r for r in runs if r["input"] == name])
    frame = frame[frame["metric"] == "mean_l1"]
    common = set(frame[frame["method"] == num]["secret"]) & set(
        frame[frame["method"] == den]["secret"]
    )
    frame = frame[frame["secret"].isin(common)]
    queries = list(dict.fromkeys(frame["query"]))
    lines = ["| level | " + " | ".join(queries) + " |", "|---|" + "---|" * len(queries)]
    for level in levels:
        values = (
            frame[frame["level"] == level].groupby(["query", "method", "secret"])["value"].sum()
        )
        cells = []
        for q in queries:
            if (q, den) not in values or abs(values[(q, den)].mean()) < EXACT:
                cells.append("-")
                continue
            per_num, per_den = values[(q, num)].sort_index(), values[(q, den)].sort_index()
            cell = f"{per_num.mean() / per_den.mean():.2f}"
            if intervals and len(common) > 1:
                low, high = bootstrap_interval(per_num.to_numpy(), per_den.to_numpy())
                cell += f" ({low:.2f}-{high:.2f})"
            cells.append(cell)
        lines.append(f"| {level} | " + " | ".join(cells) + " |")
    return lines


def timing_table(runs: list[dict]) -> list[str]:
    runs = [r for r in runs if r["method"] != GLS]
    stages = list(dict.fromkeys(s for r in runs for s in r["timings_s"]))
    lines = [
        "| input | secret | method | wall | " + " | ".join(stages) + " |",
        "|---|---|---|---|" + "---|" * len(stages),
    ]
    for r in runs:
        cells = [f"{r['timings_s'].get(s, float('nan')):.1f}" for s in stages]
        lines.append(
            f"| {r['input']} | {r['secret']} | {r['method']} | {r['wall_s']:.0f} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def report(runs: list[dict], command: str, methods: list[str]) -> str:
    levels = list(next(r["nodes"] for r in runs if r["method"] != GLS))
    lines = [
        "## Both estimation methods on the 2,016-cell production schema",
        "",
        common.command_note(command, master="local[2]", load=True) + ". Config:"
        " `conf/pl94_2020_production.toml` (the 2021 production persons strategy, 11 queries per"
        " level, state population invariant). Both methods post-process the same noisy"
        " measurements per secret; errors are `--evaluate`'s rows against the input.",
    ]
    for name in dict.fromkeys(r["input"] for r in runs):
        nodes = next(r["nodes"] for r in runs if r["input"] == name and r["method"] != GLS)
        ran = [m for m in methods if any((r["input"], r["method"]) == (name, m) for r in runs)]
        lines += [
            "",
            f"### {name}: nodes per level " + " / ".join(f"{nodes[lv]:,}" for lv in levels),
            "",
            *accuracy_table(runs, name, levels, ran),
            "",
            f"Per query, {ran[-1]} / {ran[0]} mean L1 (in brackets, the 95% bootstrap interval"
            " of that ratio over the secrets, resampled in pairs):",
            "",
            *query_table(runs, name, levels, ran[-1], ran[0], intervals=True),
        ]
        gls = sorted({r["secret"] for r in runs if (r["input"], r["method"]) == (name, GLS)})
        if gls:
            lines += [
                "",
                f"Per query, {ran[-1]} / GLS mean L1 (the exact GLS from the same noisy"
                f" measurements, unrounded; secrets {', '.join(map(str, gls))}):",
                "",
                *query_table(runs, name, levels, ran[-1], GLS),
            ]
    lines += ["", "Wall time per run and stage (s):", "", *timing_table(runs)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--inputs", nargs="+", choices=["perry", "ri"], default=["perry"])
    parser.add_argument("--secrets", type=int, default=2)
    parser.add_argument("--methods", default="topdown,full_information")
    common.work_option(parser, "production")
    common.results_option(parser, RESULTS)
    parser.add_argument(
        "--gls",
        action="store_true",
        help="also the exact GLS from each secret's noisy measurements (remaking a release the"
        " work folder lacks)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the runs saved beside --results and make only the missing ones",
    )
    args = parser.parse_args()
    methods = args.methods.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    command = common.command_line("PYTHONPATH=$PWD .venv/bin/python")
    saved = args.results.with_suffix(".json")
    runs = json.loads(saved.read_text()) if args.append and saved.exists() else []
    for name in args.inputs:
        for secret_i in range(args.secrets):
            for method in methods:
                if any(
                    (r["input"], r["secret"], r["method"]) == (name, secret_i, method) for r in runs
                ):
                    continue
                runs.append(run_once(name, method, secret_i, args.work))
                print(f"{name} secret {secret_i} {method}: {runs[-1]['wall_s']:.0f} s", flush=True)
                saved.write_text(json.dumps(runs, indent=1))
                write_runs_report(runs, command, methods, args.results)
            if args.gls and not any(
                (r["input"], r["secret"], r["method"]) == (name, secret_i, GLS) for r in runs
            ):
                ensure_release(runs, name, secret_i, methods[-1], args.work)
                runs.append(gls_once(name, secret_i, methods[-1], args.work))
                saved.write_text(json.dumps(runs, indent=1))
                write_runs_report(runs, command, methods, args.results)
    write_runs_report(runs, command, methods, args.results)


def write_runs_report(runs: list[dict], command: str, methods: list[str], results: Path) -> None:
    """The report of the runs made so far (only the methods that have run)."""
    done = [m for m in methods if any(r["method"] == m for r in runs)]
    common.write_report(results, report(runs, command, done))


if __name__ == "__main__":
    main()
