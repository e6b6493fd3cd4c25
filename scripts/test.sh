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
# The docs site, strict: a broken link, anchor or API reference, or a page missing from nav,
# fails (mkdocs.yml); built into a scratch folder, so nothing is left in the tree. Not --quiet:
# mkdocs 1.6 then drops the warnings before strict mode counts them, and passes anything. The
# variable silences Material's end-of-life banner, which is not a build warning.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$(mktemp -d)"
exec .venv/bin/pytest --durations=25 "$@"
