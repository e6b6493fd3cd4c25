"""What ``[[estimation.occupancy]]`` changes (issue 15): the Providence legacy config with and
without its occupancy group, on the same noisy measurements.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_occupancy.py [--secrets 2] [--work DIR]

Every (secret, variant) is one ``censusdp topdown --evaluate`` process on
``conf/pl94_e2e_providence.toml`` (``with``: as shipped; ``without``: its
``[[estimation.occupancy]]`` removed, a post-processing key, so both variants read the same
``noisy_measurements``), with the config's own method. Per level: total-population MAE and the
mean detailed L1 from the evaluation's rows; at the blocks, the mean released population of the
blocks with no housing units and no group-quarters population (the file's H1 and P5; the ones
occupancy holds at 0) and of the file's other empty blocks. Writes
benchmarks/results/occupancy.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from gls_reference import read_delta

from censusdp_spark.io.pl94_layout import GEOHEADER_FIELDS, RECORD_KEY, SEGMENTS
from censusdp_spark.topdown.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "conf" / "pl94_e2e_providence.toml"
RESULTS = ROOT / "benchmarks" / "results" / "occupancy.md"
LEVELS = ["county", "tract", "block_group", "block"]
OCCUPANCY = re.compile(r"(?ms)^\[\[estimation\.occupancy\]\]\n.*?(?=^\[|\Z)")


def secret_hex(i: int) -> str:
    return hashlib.sha256(f"bench_occupancy secret {i}".encode()).hexdigest()


def variant_config(variant: str, work: Path) -> Path:
    if variant == "with":
        return CONFIG
    text, found = OCCUPANCY.subn("", CONFIG.read_text())
    assert found == 1, "the shipped config has one occupancy group"
    path = work / "providence_without_occupancy.toml"
    path.write_text(text)
    return path


def file_blocks() -> pd.DataFrame:
    """The sample's blocks: their persons (P0010001) and dwellings (H0010001 + P0050001)."""
    spec = load_config(CONFIG, ROOT).input
    assert spec is not None
    files = spec.legacy_files()
    geo = pd.read_csv(
        files.geoheader, sep="|", header=None, names=list(GEOHEADER_FIELDS), dtype=str
    )
    columns = {}
    for segment in (1, 2, 3):
        names = [*RECORD_KEY, *SEGMENTS[segment - 1]]
        cells = pd.read_csv(files.segment(segment), sep="|", header=None, names=names, dtype=str)
        columns.update({c: cells[c] for c in ("P0010001", "H0010001", "P0050001") if c in cells})
    blocks = pd.concat([geo[["SUMLEV", "GEOCODE"]], pd.DataFrame(columns)], axis=1)
    blocks = blocks[blocks["SUMLEV"] == "750"].set_index("GEOCODE")
    values = blocks[["P0010001", "H0010001", "P0050001"]].astype("int64")
    return pd.DataFrame(
        {"persons": values["P0010001"], "dwellings": values["H0010001"] + values["P0050001"]}
    )


def run_once(variant: str, secret_i: int, work: Path, truth: pd.DataFrame) -> dict:
    secret = work / f"secret{secret_i}.hex"
    secret.write_text(secret_hex(secret_i))
    secret.chmod(0o600)
    out = work / f"{variant}_{secret_i}"
    evaluation = work / f"{variant}_{secret_i}.evaluation"
    command = [
        str(ROOT / ".venv" / "bin" / "censusdp"), "topdown",
        "--config", str(variant_config(variant, work)),
        "--output", str(out), "--overwrite", "--evaluate", "--evaluation-output", str(evaluation),
        "--secret-file", str(secret), "--reuse-secret", "--master", "local[2]",
    ]  # fmt: skip
    started = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CENSUSDP_SECRET_REGISTRY": str(work / "secret_registry"),
    }
    subprocess.run(command, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    errors = pd.read_csv(evaluation / "errors.csv")
    released = errors[errors["method"] != "block_by_block"]
    estimates = read_delta(out / "estimates")
    blocks = estimates[estimates["level"] == "block"].groupby("geocode")["count"].sum()
    blocks = blocks.reindex(truth.index, fill_value=0)
    empty = truth["persons"] == 0
    unoccupied = truth["dwellings"] == 0
    return {
        "variant": variant,
        "secret": secret_i,
        "wall_s": wall,
        "mae_total": _per_level(released, "mae_total"),
        "mean_l1": _per_level(released, "mean_l1", "detailed"),
        "unoccupied": float(blocks[unoccupied].mean()),
        "other_empty": float(blocks[empty & ~unoccupied].mean()),
        "n_unoccupied": int(unoccupied.sum()),
        "n_other_empty": int((empty & ~unoccupied).sum()),
    }


def _per_level(errors: pd.DataFrame, metric: str, query: str | None = None) -> dict[str, float]:
    rows = errors[errors["metric"] == metric]
    if query is not None:
        rows = rows[rows["query"] == query]
    return {lv: float(rows.loc[rows["level"] == lv, "value"].sum()) for lv in LEVELS}


def report(runs: list[dict], command: str) -> str:
    frame = pd.DataFrame(runs)
    n = runs[0]
    lines = [
        "## Occupancy (issue 15): the Providence legacy config with and without it",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, local[2] on 2 shared CPUs,"
        f" {frame['secret'].nunique()} secret(s); figures are means over the secrets). Both"
        " variants post-process the same `noisy_measurements` per secret"
        " (`conf/pl94_e2e_providence.toml`, 252 cells, its shipped method).",
        "",
        "| variant | "
        + " | ".join(f"{lv} MAE" for lv in LEVELS)
        + " | block detailed L1 | unoccupied blocks: mean released"
        f" ({n['n_unoccupied']}) | other empty blocks ({n['n_other_empty']}) | wall (s) |",
        "|---" * (len(LEVELS) + 5) + "|",
    ]
    for variant, group in frame.groupby("variant", sort=False):
        mae = {lv: sum(r[lv] for r in group["mae_total"]) / len(group) for lv in LEVELS}
        l1 = sum(r["block"] for r in group["mean_l1"]) / len(group)
        lines.append(
            f"| {variant} | "
            + " | ".join(f"{mae[lv]:.2f}" for lv in LEVELS)
            + f" | {l1:.2f} | {group['unoccupied'].mean():.2f} | {group['other_empty'].mean():.2f}"
            f" | {group['wall_s'].mean():.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--secrets", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/censusdp_occupancy"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    truth = file_blocks()
    runs = []
    for secret_i in range(args.secrets):
        for variant in ("with", "without"):
            runs.append(run_once(variant, secret_i, args.work, truth))
            print(f"secret {secret_i} {variant}: {runs[-1]['wall_s']:.0f} s", flush=True)
    command = shlex.join(["benchmarks/bench_occupancy.py", *sys.argv[1:]])
    args.results.write_text(report(runs, command))


if __name__ == "__main__":
    main()
