#!/usr/bin/env bash
# Quick start, step 1: set up (idempotent) and run the TopDown demo on the real RI 2010 blocks.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/censusdp topdown --config conf/ri_2010_demo.toml --overwrite --evaluate "$@"
