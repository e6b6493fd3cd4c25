"""TopDown accuracy and speed on the real RI and HI 2010 blocks, against the block-by-block
baseline at the same rho (same run, same secret). Writes benchmarks/results/topdown.md.

    .venv/bin/python benchmarks/bench_topdown.py [--states ri hi] [--rhos 1/2 293764/114921 10]

Each run is a separate `censusdp topdown --evaluate` process (its own JVM), local[2].
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_RHO = 'rho = "293764/114921"'


def run_once(state: str, rho: str, work: Path, secret: Path) -> dict:
    text = (ROOT / "conf" / f"{state}_2010_demo.toml").read_text()
    assert DEMO_RHO in text
    config = work / f"{state}_{rho.replace('/', '_')}.toml"
    config.write_text(text.replace(DEMO_RHO, f'rho = "{rho}"'))
    out = work / config.stem
    started = time.perf_counter()
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "censusdp"),
            "topdown",
            "--config",
            str(config),
            "--output",
            str(out),
            "--secret-file",
            str(secret),
            "--evaluate",
            "--master",
            "local[2]",
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - started
    manifest = json.loads((out / "manifest.json").read_text())
    with open(out / "evaluation" / "errors.csv") as f:
        errors = list(csv.DictReader(f))
    return {"state": state, "rho": rho, "wall_s": wall, "manifest": manifest, "errors": errors}


def mae_table(results: list[dict], levels: list[str]) -> list[str]:
    lines = [
        "| state | rho | method | " + " | ".join(levels) + " |",
        "|---|---|---|" + "---|" * len(levels),
    ]
    for r in results:
        for method in ("topdown", "block_by_block"):
            vals = {
                e["level"]: float(e["value"])
                for e in r["errors"]
                if e["method"] == method and e["metric"] == "mae_total"
            }
            lines.append(
                f"| {r['state'].upper()} | {float(Fraction(r['rho'])):.3g} | {method} | "
                + " | ".join(f"{vals[lv]:.2f}" for lv in levels)
                + " |"
            )
    return lines


def mae(result: dict, method: str, level: str) -> float:
    return next(
        float(e["value"])
        for e in result["errors"]
        if e["method"] == method and e["metric"] == "mae_total" and e["level"] == level
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--states", nargs="+", default=["ri", "hi"])
    parser.add_argument("--rhos", nargs="+", default=["1/2", "293764/114921", "10"])
    args = parser.parse_args()
    levels = ["nation", "state", "county", "tract", "block_group", "block"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        secret = work / "secret.hex"
        secret.write_text("9c" * 32)
        secret.chmod(0o600)
        for state in args.states:
            for rho in args.rhos:
                r = run_once(state, rho, work, secret)
                print(f"{state} rho={rho}: {r['wall_s']:.1f} s", file=sys.stderr)
                results.append(r)
    lines = [
        "## TopDown vs block-by-block baseline (real RI/HI 2010 blocks, 16 cells)",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_topdown.py` ({time.strftime('%Y-%m-%d')}, local[2], one secret).",
        "Mean absolute error of total population per level (lower is better). The baseline spends the",
        "whole rho on each block's detailed histogram and sums noisy blocks up. State population is",
        "invariant for TopDown (error 0 at nation and state by construction).",
        "",
        *mae_table(results, levels),
        "",
        "Ratio baseline / TopDown MAE (higher means TopDown is more accurate):",
        "",
        "| state | rho | county | tract | block_group | block |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ratios = [
            mae(r, "block_by_block", lv) / max(mae(r, "topdown", lv), 1e-12) for lv in levels[2:]
        ]
        lines.append(
            f"| {r['state'].upper()} | {float(Fraction(r['rho'])):.3g} | "
            + " | ".join(f"{x:.1f}x" for x in ratios)
            + " |"
        )
    lines += [
        "",
        "Wall time per run (whole job incl. JVM start and evaluation) and per phase, seconds:",
        "",
        "| state | rho | wall | " + " | ".join(results[0]["manifest"]["timings_s"]) + " |",
        "|---|---|---|" + "---|" * len(results[0]["manifest"]["timings_s"]),
    ]
    for r in results:
        t = r["manifest"]["timings_s"]
        lines.append(
            f"| {r['state'].upper()} | {float(Fraction(r['rho'])):.3g} | {r['wall_s']:.0f} | "
            + " | ".join(f"{v:.1f}" for v in t.values())
            + " |"
        )
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "topdown.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
