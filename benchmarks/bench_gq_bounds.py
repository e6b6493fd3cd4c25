"""What the group-quarters bounds do: the shipped Providence P5 release
(``conf/pl94_e2e_providence_gq.toml``: households and the seven GQ types, each type with a
facility at least one person, at most 99,999; households at most 99 a housing unit) against
the same config without its ``at_least`` / ``at_most`` (the zeros kept), with the same secret,
so both post-process the same noisy measurements.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_gq_bounds.py [--secrets 4] [--work DIR]
        [--method full_information|topdown]

Per level: the MAE of each node's group-quarters persons per type (cells 1-7) and of its
household persons (cell 0) against the file (the 2018 End-to-End file, used as if it were the
truth); at the blocks, the (block, type) pairs with an occupied facility released with nobody
of that type (what the lower bound forbids), and the run's wall time. Writes
benchmarks/results/gq_bounds.md and .json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import _common as common
import numpy as np
import pandas as pd
from _topdown_runs import evaluated_run, providence_segment, write_config

from censusdp_spark.testing.gls_reference import ESTIMATES, read_delta

CONFIG = common.ROOT / "conf" / "pl94_e2e_providence_gq.toml"
RESULTS = common.RESULTS_DIR / "gq_bounds.md"
BOUNDS = re.compile(r"(?m)^at_(least|most) = .*\n")
VARIANTS = ("with_bounds", "without_bounds")
TYPES = ("P0050003", "P0050004", "P0050005", "P0050006", "P0050008", "P0050009", "P0050010")
LEVELS = {"county": 5, "tract": 11, "block_group": 12, "block": 15}


def variant_config(variant: str, method: str, work: Path) -> Path:
    """The shipped config with ``method``, or the same without its bounds."""
    text = re.sub(r'(?m)^method = "\w+"', f'method = "{method}"', CONFIG.read_text())
    if variant == "without_bounds":
        text, removed = BOUNDS.subn("", text)
        assert removed == 15, "the shipped config has 7 at_least and 8 at_most"
    return write_config(text, work / f"providence_gq_{variant}.toml")


def file_blocks() -> pd.DataFrame:
    """Per block of the file (SUMLEV 750): household persons (P0050001 subtracted from
    P0010001) and each GQ type's persons, indexed by geocode; columns 0 (household) to 7."""
    geo = providence_segment("rigeo2018_2020Style.pl", {2: "sumlev", 7: "logrecno", 9: "geocode"})
    persons = providence_segment("ri000012018_2020Style.pl", {4: "logrecno", 5: "persons"})
    gq_columns = {4: "logrecno", 5: "P0050001"}
    gq_columns.update({5 + int(c[-2:]) - 1: c for c in TYPES})
    gq = providence_segment("ri000032018_2020Style.pl", gq_columns)
    blocks = geo[geo["sumlev"] == "750"].merge(persons, on="logrecno").merge(gq, on="logrecno")
    out = pd.DataFrame(index=blocks["geocode"].to_numpy())
    out[0] = (blocks["persons"].astype(np.int64) - blocks["P0050001"].astype(np.int64)).to_numpy()
    for g, cell in enumerate(TYPES, start=1):
        out[g] = blocks[cell].astype(np.int64).to_numpy()
    return out


def released_blocks(release: Path, index: pd.Index) -> pd.DataFrame:
    estimates = read_delta(release / ESTIMATES)
    blocks = estimates[estimates["level"] == "block"]
    return (
        blocks.pivot_table(index="geocode", columns="cell", values="count", aggfunc="sum")
        .reindex(index=index, columns=range(8))
        .fillna(0)
        .astype(np.int64)
    )


def errors(released: pd.DataFrame, truth: pd.DataFrame) -> dict:
    out: dict = {}
    for level, digits in LEVELS.items():
        key = truth.index.str[:digits]
        got, want = released.groupby(key).sum(), truth.groupby(key).sum()
        diff = (got - want).abs()
        out[level] = {"gq_mae": float(diff.loc[:, 1:].to_numpy().mean()),
                      "household_mae": float(diff[0].mean())}  # fmt: skip
    facility = truth.loc[:, 1:] > 0
    empty = facility & (released.loc[:, 1:] == 0)
    out["facility_pairs"] = int(facility.to_numpy().sum())
    out["facility_pairs_released_empty"] = int(empty.to_numpy().sum())
    return out


def run_once(variant: str, method: str, secret_i: int, work: Path, truth: pd.DataFrame) -> dict:
    out = work / f"providence_gq_{secret_i}_{variant}"
    wall, _, _ = evaluated_run(variant_config(variant, method, work), out, secret_i, work)
    released = released_blocks(out, truth.index)
    return {"variant": variant, "secret": secret_i, "wall_s": wall, **errors(released, truth)}


def report(runs: list[dict], command: str, method: str) -> str:
    frame = pd.DataFrame(runs)
    means = frame.groupby("variant")
    secrets = frame["secret"].nunique()
    lines = [
        "## The group-quarters bounds (Providence P5, 8 cells)",
        "",
        common.command_note(command, master="local[2]", extra=(f"{secrets} secrets", f"`{method}`"))
        + ". `conf/pl94_e2e_providence_gq.toml` as shipped"
        " against the same config without its `at_least` / `at_most` (its zeros kept); each"
        " secret's two runs post-process the same noisy measurements. Errors are against the"
        " 2018 End-to-End file, used as if it were the truth (it is itself DAS output); means"
        " over the secrets.",
        "",
        "| level | metric | with bounds | without | with / without |",
        "|---|---|---|---|---|",
    ]
    for level in LEVELS:
        for metric, label in (("gq_mae", "GQ persons per type, MAE"),
                              ("household_mae", "household persons, MAE")):  # fmt: skip
            value = {v: float(np.mean([r[level][metric] for r in runs if r["variant"] == v]))
                     for v in VARIANTS}  # fmt: skip
            ratio = value["with_bounds"] / value["without_bounds"] if value["without_bounds"] else 0
            lines.append(
                f"| {level} | {label} | {value['with_bounds']:.3f} |"
                f" {value['without_bounds']:.3f} | {ratio:.2f}× |"
            )
    pairs = int(runs[0]["facility_pairs"])
    empty = means["facility_pairs_released_empty"].mean()
    wall = means["wall_s"].mean()
    lines += [
        "",
        f"(block, type) pairs with an occupied facility in the file: {pairs}. Released with"
        f" nobody of that type: {empty['with_bounds']:.1f} with the bounds,"
        f" {empty['without_bounds']:.1f} without (mean over the secrets). Wall time per run:"
        f" {wall['with_bounds']:.0f} s with, {wall['without_bounds']:.0f} s without"
        f" ({wall['with_bounds'] / wall['without_bounds']:.2f}×, whole CLI runs with evaluation).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--secrets", type=int, default=4)
    parser.add_argument("--method", default="full_information")
    common.work_option(parser, "gq_bounds")
    common.results_option(parser, RESULTS)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    command = common.command_line("PYTHONPATH=$PWD .venv/bin/python")
    truth = file_blocks()
    runs = []
    for secret_i in range(args.secrets):
        for variant in VARIANTS:
            runs.append(run_once(variant, args.method, secret_i, args.work, truth))
            print(f"secret {secret_i} {variant}: {runs[-1]['wall_s']:.0f} s", flush=True)
        args.results.with_suffix(".json").write_text(json.dumps(runs, indent=1))
        common.write_report(args.results, report(runs, command, args.method))


if __name__ == "__main__":
    main()
