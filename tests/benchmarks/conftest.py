"""The benchmark scripts, importable by the tests as the scripts import each other: Python puts a
script's own folder first on ``sys.path`` when it runs, so ``benchmarks/`` goes there once, for
every test of this folder (``import bench_production`` then finds the script and its sibling
``_common``)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
