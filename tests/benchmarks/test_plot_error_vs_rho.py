"""benchmarks/plot_error_vs_rho.py: the means it plots are the per-secret errors' means, and the
docs' figure is the one those recorded runs give (regenerated, byte for byte)."""

from __future__ import annotations

import json
from pathlib import Path

import plot_error_vs_rho as plot

ROOT = Path(__file__).resolve().parents[2]


def _case(state: str, rho: str, l1: float) -> dict:
    errors = {level: {plot.METHOD: {"l1_detailed": l1}} for level in plot.LEVELS}
    return {"state": state, "rho": rho, "errors": errors}


def test_each_point_is_the_mean_over_secrets_of_its_state_level_and_rho():
    cases = [_case("ri", "1/2", 4.0), _case("ri", "1/2", 6.0), _case("ri", "10", 1.0)]
    means = plot.mean_errors([*cases, _case("hi", "1/2", 9.0)])
    assert means[("ri", "block")] == {0.5: 5.0, 10.0: 1.0}
    assert means[("hi", "county")] == {0.5: 9.0}


def test_the_docs_figure_is_what_the_recorded_runs_draw(tmp_path: Path):
    results = ROOT / "benchmarks" / "results" / "topdown_methods.json"
    drawn = tmp_path / "error_vs_rho.svg"
    plot.plot(plot.mean_errors(json.loads(results.read_text())["cases"]), drawn)
    assert drawn.read_bytes() == (ROOT / "docs" / "img" / "error_vs_rho.svg").read_bytes()
