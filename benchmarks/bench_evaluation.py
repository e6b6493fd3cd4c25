"""What ``--evaluate`` costs: its share of a whole TopDown run, measured in the same run.

    .venv/bin/python benchmarks/bench_evaluation.py [--config conf/ri_2010_demo.toml]
        [--manifest OUT/manifest.json ...]

Runs ``censusdp topdown --evaluate`` on the config (or reads the manifests of runs already made,
e.g. one per code version) and writes ``benchmarks/results/evaluation.md``: per run, the
evaluation stage's seconds, the whole run's seconds and the evaluation's share of it. The run is
its own baseline (this machine's load varies; a share compares within one run).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import _common as common

RESULT = common.RESULTS_DIR / "evaluation.md"


def run_release(config: Path, out: Path) -> Path:
    secret = common.write_secret(out.parent / "secret.hex", os.urandom(32).hex())
    subprocess.run(
        [sys.executable, "-m", "censusdp_spark.cli", "topdown", "--config", str(config)]
        + ["--output", str(out), "--secret-file", str(secret), "--reuse-secret", "--evaluate"],
        check=True,
        cwd=common.ROOT,
    )
    return out / "manifest.json"


def row(label: str, manifest: Path | str) -> str:
    m = json.loads(Path(manifest).read_text())
    evaluate, total = m["timings_s"]["evaluate"], m["elapsed_s"]
    return f"| {label} | {evaluate:.1f} | {total:.1f} | {evaluate / total:.0%} |"


def command(args: argparse.Namespace) -> list[str]:
    """The arguments that made the figures (the note is printed as text, not repeated)."""
    given = ["--config", str(args.config.relative_to(common.ROOT))]
    return given + (["--manifest", *map(str, args.manifest)] if args.manifest else [])


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--config", type=Path, default=common.ROOT / "conf" / "ri_2010_demo.toml")
    parser.add_argument("--manifest", type=Path, nargs="*", help="label=path of runs made")
    parser.add_argument("--note", default="", help="a line on how the runs were made")
    args = parser.parse_args()
    if args.manifest:
        rows = [row(*str(m).split("=", 1)) for m in args.manifest]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [row("this version", run_release(args.config, Path(tmp) / "out"))]
    text = common.write_report(
        RESULT,
        [
            "## What `--evaluate` costs (TopDown)",
            "",
            common.command_note(shlex.join(["benchmarks/bench_evaluation.py", *command(args)]))
            + f". Config `{args.config.relative_to(common.ROOT)}`."
            + (f" {args.note}" if args.note else ""),
            "",
            "| run | evaluate (s) | whole run (s) | evaluate's share |",
            "|---|---|---|---|",
            *rows,
            "",
        ],
    )
    print(text)


if __name__ == "__main__":
    main()
