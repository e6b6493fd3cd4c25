#!/usr/bin/env bash
# Quick start, step 2: set up (idempotent), lint, type-check and run every test suite
# (fast ones, statistical power tests, the standalone-cluster and Spark Connect suites). Pass
# pytest options through, e.g. `scripts/test.sh -m "not slow and not cluster and not connect"`
# for the fast suites only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
.venv/bin/ruff check censusdp_spark tests jobs benchmarks
.venv/bin/ruff format --check censusdp_spark tests jobs benchmarks
.venv/bin/mypy censusdp_spark
.venv/bin/lint-imports  # the layering contracts in pyproject.toml
exec .venv/bin/pytest --durations=25 "$@"
