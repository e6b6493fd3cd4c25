"""Time the SYNTHETIC national input generator and write benchmarks/results/generate.md.

    .venv/bin/python benchmarks/bench_generate.py [--seed 2020] [--fraction 1] [--output DIR]

Runs ``generate_national`` in this process (pure numpy/pandas/pyarrow, no Spark), so the peak
RSS from ``resource.getrusage`` is the generator's (plus the interpreter and imports). Without
``--output`` it writes to a temporary directory and deletes it afterwards; with ``--output`` it
replaces the blocks there (e.g. ``data/national``, never committed).
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import _common as common

from censusdp_spark.generate.national import (
    generate_national,
    households_table,
    tallies_table,
    validation_table,
)


def _directory_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def run(seed: int, fraction: float, output: Path) -> dict:
    started = time.perf_counter()
    report = generate_national(seed, output, fraction, overwrite=True)
    return {
        "report": report,
        "wall_s": time.perf_counter() - started,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB
        "output_mb": _directory_mb(output / "blocks"),
    }


def markdown(result: dict, command: str) -> str:
    report = result["report"]
    generated = report["validation"]["generated"]
    return "\n".join(
        [
            "## Synthetic national input generation (SYNTHETIC blocks on the real 2020 tracts)",
            "",
            common.command_note(command, packages=("numpy",)) + ".",
            "",
            "| seed | states | blocks | wall (s) | peak RSS (GiB) | Parquet output (MB) |",
            "|---|---|---|---|---|---|",
            f"| {report['seed']} | {len(report['states'])} | {generated['blocks']:,} | "
            f"{result['wall_s']:.1f} | {result['peak_rss_gib']:.2f} | {result['output_mb']:.0f} |",
            "",
            "Tallies:",
            "",
            tallies_table(report),
            "",
            "Validation: generated blocks against the real 2010 P.L. 94-171 blocks of Rhode Island",
            "and Hawaii (quantiles are observed values; block pop = people per block):",
            "",
            validation_table(report),
            "",
            f"Households: {generated['households']:,}; people in households, counting 7+ as 7: "
            f"{generated['household_people_share_min']:.1%} of the population.",
            "",
            households_table(report),
            "",
        ]
    )


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--output", type=Path, help="keep the output here (default: temporary)")
    args = parser.parse_args()
    command = common.command_line(".venv/bin/python")
    if args.output is not None:
        result = run(args.seed, args.fraction, args.output)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(args.seed, args.fraction, Path(tmp))
    print(common.write_report(common.RESULTS_DIR / "generate.md", markdown(result, command)))


if __name__ == "__main__":
    main()
