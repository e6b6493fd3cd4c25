"""benchmarks/bench_national_production.py's reports: the per-stage linear fit that projects the
nation, and the resume check's verdict line."""

from __future__ import annotations

import bench_national_production as bench
import pytest


def test_the_stage_fit_recovers_a_line_through_the_measured_fractions():
    rows = [{"blocks": b, "stages": {"measure": 30.0 + 0.002 * b}} for b in (1e4, 1e5, 4e5)]
    a, b = bench.linear_fit(rows, "measure")
    assert a == pytest.approx(30.0) and b == pytest.approx(0.002)


def _check(differing: list[str]) -> dict:
    return {
        "fraction": 0.03, "blocks": 456_945, "reference_run_s": 1300.0, "killed_run_s": 900.0,
        "resumed_run_s": 520.0, "rows": {"estimates": 10, "microdata": 7},
        "differing": differing, "master": "local[2]",
    }  # fmt: skip


def test_the_resume_report_says_identical_only_when_no_table_differs():
    same = bench.resume_markdown(_check([]), "bench")
    row = same.splitlines()[-1]
    assert row.startswith("| 1300 | 900 | 520 | 1.09× | identical:")
    assert "`estimates` (10 rows)" in row
    check = {**_check(["estimates"]), "differing_rows_by_level": {"estimates": {"tract": 260}}}
    lines = bench.resume_markdown(check, "bench").splitlines()
    (row,) = [ln for ln in lines if ln.startswith("| 1300")]
    assert "DIFFERENT: ['estimates']" in row and "identical" not in row
    assert (
        "Rows of the uninterrupted `estimates` the resumed one lacks, by level: tract 260." in lines
    )
    assert lines[-1].startswith("Rows of the tract level or above were written before the kill")
