"""Rows of the block-level TopDown input (``conf/ri_2010_demo.toml``'s CSV layout): three good
real RI 2010 blocks, and rows broken or changed one field at a time."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEADER = "GEOID,state,county,vtd,pop,pop_white,pop_black,pop_hisp,pop_aian,pop_asian,pop_nhpi,pop_other,pop_two,vap,vap_white,vap_black,vap_hisp,vap_aian,vap_asian,vap_nhpi,vap_other,vap_two"
GOOD = [
    "440010301001000,44,001,,23,19,0,4,0,0,0,0,0,12,8,0,4,0,0,0,0,0",
    "440010301001001,44,001,,17,17,0,0,0,0,0,0,0,14,14,0,0,0,0,0,0,0",
    "440010301001002,44,001,,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0",
]


def bad_row(field: int, value: str) -> list[str]:
    """``GOOD`` with field ``field`` of its second row set to ``value``."""
    parts = GOOD[1].split(",")
    parts[field] = value
    return [GOOD[0], ",".join(parts), GOOD[2]]


def adults(row: str, n: int) -> str:
    """``row`` with ``n`` more white adults (its file totals kept consistent)."""
    parts = row.split(",")
    for field in (4, 5, 13, 14):  # pop, pop_white, vap, vap_white
        parts[field] = str(int(parts[field]) + n)
    return ",".join(parts)


QUICK_LEVELS = """levels = [
  { name = "nation", digits = 0 },
  { name = "tract", digits = 11 },
  { name = "block", digits = 15 },
]"""
QUICK_BUDGET = """[budget]
rho = "1"
[budget.levels.nation]
share = "1/5"
queries = { "total" = "1/2", "detailed" = "1/2" }
[budget.levels.tract]
share = "2/5"
queries = { "total" = "2/5", "hisprace" = "1/5", "votingage" = "1/10", "detailed" = "3/10" }
[budget.levels.block]
share = "2/5"
queries = { "total" = "1/10", "detailed" = "9/10" }
"""


def quick_demo_config(folder: Path) -> Path:
    """``conf/ri_2010_demo.toml`` over three levels (nation > tract > block), its state
    invariant dropped: the same schema, input columns and estimation method, every stage of a
    TopDown release, in half the demo's Spark jobs. For tests of the runner (secrets, outputs,
    resume guards), not of the hierarchy's depth. Written as ``folder/quick_demo.toml``."""
    text = (ROOT / "conf" / "ri_2010_demo.toml").read_text()
    text = re.sub(r"(?s)levels = \[\n  \{ name = \"nation\".*?\n\]", QUICK_LEVELS, text, count=1)
    text = text.split("[budget]", 1)[0] + QUICK_BUDGET
    text = re.sub(r'invariants = \["state"\].*', "invariants = []", text, count=1)
    text = text.replace('"data/', f'"{ROOT}/data/')
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "quick_demo.toml"
    path.write_text(text)
    return path
