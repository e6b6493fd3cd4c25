"""What a release's tests compare: the manifests' guarantee counts when every guarantee holds,
a shipped config with another estimation method, two releases' tables row for row, and a
release's tables against the digests main recorded."""

from __future__ import annotations

import hashlib
import json
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


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "release_digests.json"
"""Per release of the tests' fixed secrets, a digest of each of its tables, as main made them."""


def table_digest(spark, table: Path) -> str:
    """The SHA-256 of a Delta table's rows, independent of file and row order: each row as
    JSON (columns by name, arrays as lists, floats by ``repr``, so a last-bit change shows),
    the lines sorted."""
    frame = spark.read.format("delta").load(str(table)).toPandas()
    frame = frame[sorted(frame.columns)]

    def plain(value: object) -> object:
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in sorted(value.items())}
        if isinstance(value, float):
            return repr(value)
        return value

    lines = sorted(
        json.dumps([plain(v) for v in row], default=str) for row in frame.itertuples(index=False)
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def assert_release_unchanged(spark, output: Path, name: str) -> None:
    """Every table the manifest at ``output`` lists has the digest recorded for ``name`` in
    ``tests/golden/release_digests.json``: a refactor makes every release bit for bit again.
    A change meant to alter releases records the new digests there (the message prints them)."""
    tables = json.loads((output / "manifest.json").read_text())["tables"]
    found = {table: table_digest(spark, output / table) for table in tables}
    recorded = json.loads(GOLDEN.read_text()).get(name)
    assert found == recorded, f"{name}: the release changed; its digests now: {json.dumps(found)}"
