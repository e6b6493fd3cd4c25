"""What the occupancy rule does to accuracy: the shipped Providence persons release
(``conf/pl94_e2e_providence.toml``, whose ``[[estimation.occupancy]]`` gives no persons to a
block without housing units or group-quarters population) against the same config without
the rule, with the same secret, so both post-process the same noisy measurements.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_occupancy.py [--secrets 6] [--work DIR]

Per level: total-population MAE and the sum of the query L1 (``--evaluate``'s rows against the
input, the 2018 End-to-End file used as if it were the truth); at the blocks, split by whether
the block has dwellings (``H0010001 + P0050001`` of the legacy files, read here with pandas): the
mean released persons of the blocks without (their truth is 0) and the share of them given
anyone, and the total MAE of the blocks with. Writes benchmarks/results/occupancy.md.
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

CONFIG = common.ROOT / "conf" / "pl94_e2e_providence.toml"
RESULTS = common.RESULTS_DIR / "occupancy.md"
RULE = re.compile(r"(?ms)^\[\[estimation\.occupancy\]\]\n.*?\n(?=\n)")
"""The config's one occupancy rule: its table header through the line before the next blank."""
VARIANTS = ("with_rule", "without_rule")


def variant_config(variant: str, work: Path) -> Path:
    """The shipped config, or the same without its one occupancy rule."""
    text = CONFIG.read_text()
    if variant == "without_rule":
        text, removed = RULE.subn("", text)
        assert removed == 1, "the shipped config has one [[estimation.occupancy]] rule"
    return write_config(text, work / f"providence_{variant}.toml")


def block_facts() -> pd.DataFrame:
    """Per block (SUMLEV 750): ``geocode``, ``persons`` (P0010001) and ``dwellings``
    (H0010001 + P0050001), joined on the logical record number."""
    geo = providence_segment("rigeo2018_2020Style.pl", {2: "sumlev", 7: "logrecno", 9: "geocode"})
    persons = providence_segment("ri000012018_2020Style.pl", {4: "logrecno", 5: "persons"})
    units = providence_segment("ri000022018_2020Style.pl", {4: "logrecno", 149: "units"})
    group_quarters = providence_segment("ri000032018_2020Style.pl", {4: "logrecno", 5: "gq"})
    blocks = geo[geo["sumlev"] == "750"]
    for part in (persons, units, group_quarters):
        blocks = blocks.merge(part, on="logrecno", how="left", validate="one_to_one")
    out = blocks[["geocode"]].copy()
    out["persons"] = blocks["persons"].astype(np.int64)
    out["dwellings"] = blocks["units"].astype(np.int64) + blocks["gq"].astype(np.int64)
    return out.reset_index(drop=True)


def run_once(variant: str, secret_i: int, work: Path) -> dict:
    out = work / f"providence_{secret_i}_{variant}"
    wall, _, errors = evaluated_run(variant_config(variant, work), out, secret_i, work)
    return {
        "variant": variant,
        "secret": secret_i,
        "wall_s": wall,
        "errors": errors,
        "blocks": block_errors(out, block_facts()),
    }


def block_errors(release: Path, facts: pd.DataFrame) -> dict[str, float]:
    """The released blocks' totals against ``facts``, split by whether a block has dwellings."""
    estimates = read_delta(release / ESTIMATES)
    released = estimates[estimates["level"] == "block"].groupby("geocode")["count"].sum()
    total = released.reindex(facts["geocode"], fill_value=0).to_numpy()
    empty = facts["dwellings"].to_numpy() == 0
    error = total - facts["persons"].to_numpy()
    return {
        "blocks_without_dwellings": int(empty.sum()),
        "persons_without_dwellings": float(facts["persons"][empty].sum()),
        "mean_released_without_dwellings": float(total[empty].mean()),
        "share_given_anyone_without_dwellings": float((total[empty] > 0).mean()),
        "mae_total_with_dwellings": float(np.abs(error[~empty]).mean()),
        "mean_error_with_dwellings": float(error[~empty].mean()),
    }


def report(runs: list[dict], command: str) -> str:
    frame = pd.DataFrame(
        [{**e, "variant": r["variant"], "secret": r["secret"]} for r in runs for e in r["errors"]]
    )
    secrets = sorted({r["secret"] for r in runs})
    levels = list(dict.fromkeys(frame["level"]))
    lines = [
        "## The occupancy rule's effect on accuracy (Providence, 252 cells)",
        "",
        common.command_note(command, master="local[2]", extra=(f"{len(secrets)} secrets",))
        + ". `conf/pl94_e2e_providence.toml` as shipped (its"
        " `[[estimation.occupancy]]` rule: no persons where `H0010001 + P0050001` is 0) against"
        " the same config without the rule; each secret's two runs post-process the same noisy"
        " measurements. Errors are against the 2018 End-to-End file, used as if it were the"
        " truth (it is itself DAS output); means over the secrets.",
        "",
        "| level | metric | with the rule | without | with / without |",
        "|---|---|---|---|---|",
    ]
    for level in levels:
        for metric, label in (
            ("mae_total", "total-population MAE"),
            ("mean_l1", "sum of query L1"),
        ):
            here = frame[(frame["level"] == level) & (frame["metric"] == metric)]
            per = here.groupby(["variant", "secret"])["value"].sum()
            with_rule, without = per["with_rule"].mean(), per["without_rule"].mean()
            ratio = f"{with_rule / without:.2f}×" if without else "-"
            lines.append(f"| {level} | {label} | {with_rule:.2f} | {without:.2f} | {ratio} |")
    blocks = pd.DataFrame([{**r["blocks"], "variant": r["variant"]} for r in runs])
    means = blocks.groupby("variant").mean()
    first = runs[0]["blocks"]
    lines += [
        "",
        f"Blocks without dwellings: {first['blocks_without_dwellings']} of the file's, holding"
        f" {first['persons_without_dwellings']:.0f} persons in the file.",
        "",
        "| blocks | measure | with the rule | without |",
        "|---|---|---|---|",
    ]
    for key, group, label in (
        ("mean_released_without_dwellings", "without dwellings", "mean released persons"),
        ("share_given_anyone_without_dwellings", "without dwellings", "share given anyone"),
        ("mae_total_with_dwellings", "with dwellings", "total-population MAE"),
        ("mean_error_with_dwellings", "with dwellings", "mean error (released − file)"),
    ):
        lines.append(
            f"| {group} | {label} | {means.loc['with_rule', key]:.2f} |"
            f" {means.loc['without_rule', key]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--secrets", type=int, default=6)
    common.work_option(parser, "occupancy")
    common.results_option(parser, RESULTS)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    command = common.command_line("PYTHONPATH=$PWD .venv/bin/python")
    runs = []
    for secret_i in range(args.secrets):
        for variant in VARIANTS:
            runs.append(run_once(variant, secret_i, args.work))
            print(f"secret {secret_i} {variant}: {runs[-1]['wall_s']:.0f} s", flush=True)
        args.results.with_suffix(".json").write_text(json.dumps(runs, indent=1))
        common.write_report(args.results, report(runs, command))


if __name__ == "__main__":
    main()
