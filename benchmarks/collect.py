"""Assemble BENCHMARKS.md from the sections the benchmark scripts wrote to benchmarks/results/.

    .venv/bin/python benchmarks/collect.py

One current section per benchmark, each naming its command, date and baseline; a rerun replaces
its section, and what it replaced goes to CHANGELOG.md in a line or two. Every figure comes from
a script run recorded in its section; ratios are against a baseline measured in the same run,
because this machine's load varies.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The contents, in order: (group, the results files of its sections).
GROUPS = [
    ("Privacy core and solvers", ["samplers", "solvers", "rounding"]),
    ("Sessions", ["session_start"]),
    (
        "TopDown",
        [
            "topdown_methods",
            "topdown_passes",
            "topdown_bypass",
            "topdown_production",
            "budget_optimizer",
            "post_processing",
            "pl94_legacy",
            "occupancy",
            "gq_bounds",
            "group_bounds_solvers",
            "evaluation",
        ],
    ),
    (
        "National scale",
        [
            "generate",
            "national",
            "national_methods",
            "national_production",
            "national_production_resume",
            "national_production_cluster",
            "topdown_memory",
        ],
    ),
    (
        "Group sizes",
        [
            "pgsr",
            "pgsr_speed",
            "pgsr_national",
            "cumulative_scaling",
            "pgsr_large_n",
            "mechanism_memory",
            "mechanism_memory_spark",
        ],
    ),
    ("Synthetic data", ["synth"]),
]
ORDER = [name for _, names in GROUPS for name in names]

HEADER = """# Benchmarks

Measured on the project's 2-core, 24 GiB machine (local mode). The machine was shared with other
work while most of these ran (load average 5-10 on 2 cores), so absolute times are pessimistic;
the ratios compare against a baseline measured in the same run. Each section is the current
measurement of one benchmark and names its command, its date and its baseline; rerun the command
and `benchmarks/collect.py` to refresh this file. Earlier measurements are summarised in
`CHANGELOG.md`.
"""


def section(text: str) -> str:
    """A results file as a ``##`` section: a file whose title is ``#`` has every heading moved
    one level down (some scripts write their file as a document of its own)."""
    text = text.strip()
    if text.startswith("# "):
        text = re.sub(r"^#", "##", text, flags=re.MULTILINE)
    return text


def title(text: str) -> str:
    return text.split("\n", 1)[0].removeprefix("## ").strip()


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = re.sub(r"[^\w\- ]", "", heading.lower())
    return kept.replace(" ", "-")


def contents(sections: dict[str, str]) -> str:
    """The table of contents: each group, then a link to each of its sections."""
    others = [n for n in sorted(sections) if n not in ORDER]
    lines = ["## Contents", ""]
    for group, names in [*GROUPS, ("Other", others)]:
        present = [sections[n] for n in names if n in sections]
        if present:
            lines.append(f"- {group}")
            lines += [f"  - [{title(s)}](#{anchor(title(s))})" for s in present]
    return "\n".join(lines)


def main() -> None:
    sections = {
        p.stem: section(p.read_text()) for p in (ROOT / "benchmarks" / "results").glob("*.md")
    }
    ordered = [sections[name] for name in ORDER if name in sections] + [
        sections[k] for k in sorted(sections) if k not in ORDER
    ]
    body = "\n\n".join([HEADER.strip(), contents(sections), *ordered])
    (ROOT / "BENCHMARKS.md").write_text(body + "\n")


if __name__ == "__main__":
    main()
