"""``censusdp generate``: write synthetic inputs. ``censusdp_spark.cli`` adds the parser with
:func:`add_generate_parser`, which dispatches ``generate national`` to :func:`run_generate`.

Bad arguments raise ``ValueError`` (an existing output without ``--overwrite`` included), which
the main CLI prints as one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_generate_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``generate national --seed S --output PATH [--fraction F] [--overwrite]``."""
    generate = subparsers.add_parser("generate", help="write synthetic inputs (SYNTHETIC data)")
    kinds = generate.add_subparsers(dest="generator", required=True)
    national = kinds.add_parser(
        "national",
        help="block-level inputs for the 2020 US on the real tract spine",
        description="Write OUTPUT/blocks/state_XX.parquet, OUTPUT/metadata.json and "
        "OUTPUT/README.txt: synthetic blocks, block groups, race/age and household counts "
        "under the real 2020 tracts and their populations, deterministic by seed.",
    )
    national.add_argument("--seed", type=int, required=True, help="non-negative integer")
    national.add_argument("--output", type=Path, required=True, help="output directory")
    national.add_argument(
        "--fraction",
        type=float,
        default=1.0,
        help="keep whole states, chosen by seed, holding about this share of the blocks "
        "(default 1: the whole nation)",
    )
    national.add_argument("--overwrite", action="store_true", help="replace existing blocks")
    national.add_argument(
        "--schema",
        choices=["demo", "production"],
        default="demo",
        help="demo: 16-cell block counts only; production: also persons in the PPMF layout "
        "(OUTPUT/persons, the 2,016-cell schema of conf/national_production.toml) and the block "
        "spine (OUTPUT/spine)",
    )
    national.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    """Run the chosen generator and print its report; 0 on success."""
    if args.schema == "production":
        from censusdp_spark.generate.production import generate_production, production_report_text

        report = generate_production(
            args.seed, args.output, args.fraction, overwrite=args.overwrite
        )
        print(production_report_text(report))
    else:
        from censusdp_spark.generate.national import generate_national, report_text

        report = generate_national(args.seed, args.output, args.fraction, overwrite=args.overwrite)
        print(report_text(report))
    print(f"wrote {args.output} in {report['elapsed_s']} s")
    return 0
