"""Assemble BENCHMARKS.md from the sections the benchmark scripts wrote to benchmarks/results/.

    .venv/bin/python benchmarks/collect.py

Every figure comes from a script run recorded in its section (command and date); ratios are
against a baseline measured in the same run, because this machine's load varies.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = [
    "samplers",
    "solvers",
    "topdown_methods",
    "topdown",
    "topdown_fi",
    "topdown_passes",
    "topdown_bypass",
    "topdown_pl94",
    "occupancy",
    "gq_bounds",
    "group_bounds_solvers",
    "topdown_production",
    "evaluation",
    "generate",
    "national",
    "national_methods",
    "pgsr",
    "pgsr_speed",
    "pgsr_national",
    "cumulative_scaling",
    "pgsr_large_n",
    "mechanism_memory",
    "mechanism_memory_spark",
    "synth",
]

HEADER = """# Benchmarks

Measured on the project's 2-core, 24 GiB machine (local mode). The machine was shared with other
work while these ran (load average 5-10 on 2 cores), so absolute times are pessimistic; the
ratios compare against a baseline measured in the same run. Each section names the command that
produced it; rerun it and `benchmarks/collect.py` to refresh this file.
"""


def main() -> None:
    sections = {
        p.stem: p.read_text().strip() for p in (ROOT / "benchmarks" / "results").glob("*.md")
    }
    ordered = [sections.pop(name) for name in ORDER if name in sections] + [
        sections[k] for k in sorted(sections)
    ]
    (ROOT / "BENCHMARKS.md").write_text(HEADER + "\n" + "\n\n".join(ordered) + "\n")


if __name__ == "__main__":
    main()
