"""What a release's tests compare: the manifests' guarantee counts when every guarantee holds,
a shipped config with another estimation method, and two releases' tables row for row."""

from __future__ import annotations

import re
from pathlib import Path

TOPDOWN_GUARANTEES_HELD = {
    "negative_counts": 0,
    "children_not_summing_to_parent": 0,
    "invariants_broken": 0,
    "noise_variances_not_from_budget": 0,
    "paths_not_spending_rho": 0,
}
"""A TopDown manifest's ``guarantee_checks`` when every guarantee holds."""
OCCUPANCY_GUARANTEES_HELD = {
    **TOPDOWN_GUARANTEES_HELD,
    "persons_outside_occupancy": 0,
    "group_sums_outside_bounds": 0,
}
"""The same with ``[[estimation.occupancy]]``."""
SHIPPED_METHOD = re.compile(r'(?m)^method = "full_information" .*\n')
"""The ``[estimation] method`` line of every shipped TopDown config (their default)."""


def with_method(text: str, method: str) -> str:
    """A shipped TopDown config's text with its estimation method set to ``method``."""
    assert len(SHIPPED_METHOD.findall(text)) == 1, "not a shipped TopDown config"
    return SHIPPED_METHOD.sub(f'method = "{method}"\n', text)


def assert_same_tables(
    spark, a: Path, b: Path, tables=("noisy_measurements", "estimates", "microdata")
) -> None:
    for table in tables:
        left = spark.read.format("delta").load(str(a / table))
        right = spark.read.format("delta").load(str(b / table))
        assert left.count() > 0, table
        assert left.exceptAll(right).count() == 0 and right.exceptAll(left).count() == 0, table
