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
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "evaluation.md"


def run_release(config: Path, out: Path) -> Path:
    secret = out.parent / "secret.hex"
    secret.write_text(os.urandom(32).hex())
    secret.chmod(0o600)
    subprocess.run(
        [sys.executable, "-m", "censusdp_spark.cli", "topdown", "--config", str(config)]
        + ["--output", str(out), "--secret-file", str(secret), "--reuse-secret", "--evaluate"],
        check=True,
        cwd=ROOT,
    )
    return out / "manifest.json"


def row(label: str, manifest: Path | str) -> str:
    m = json.loads(Path(manifest).read_text())
    evaluate, total = m["timings_s"]["evaluate"], m["elapsed_s"]
    return f"| {label} | {evaluate:.1f} | {total:.1f} | {evaluate / total:.0%} |"


def command(args: argparse.Namespace) -> list[str]:
    """The arguments that made the figures (the note is printed as text, not repeated)."""
    given = ["--config", str(args.config.relative_to(ROOT))]
    return given + (["--manifest", *map(str, args.manifest)] if args.manifest else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "conf" / "ri_2010_demo.toml")
    parser.add_argument("--manifest", type=Path, nargs="*", help="label=path of runs made")
    parser.add_argument("--note", default="", help="a line on how the runs were made")
    args = parser.parse_args()
    if args.manifest:
        rows = [row(*str(m).split("=", 1)) for m in args.manifest]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [row("this version", run_release(args.config, Path(tmp) / "out"))]
    RESULT.write_text(
        "\n".join(
            [
                "## What `--evaluate` costs (TopDown)",
                "",
                f"`{shlex.join(['benchmarks/bench_evaluation.py', *command(args)])}`,"
                f" {datetime.date.today()}; config `{args.config.relative_to(ROOT)}`."
                + (f" {args.note}" if args.note else ""),
                "",
                "| run | evaluate (s) | whole run (s) | evaluate's share |",
                "|---|---|---|---|",
                *rows,
                "",
            ]
        )
    )
    print(RESULT.read_text())


if __name__ == "__main__":
    main()
