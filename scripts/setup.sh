#!/usr/bin/env bash
# Idempotent environment setup: a project virtualenv with pinned packages, and the Delta Lake
# jars from Maven Central (copied into ./jars by Maven, so Spark never downloads at run time).
# `scripts/setup.sh jars` fetches the jars only (the project image's Dockerfile runs that).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
DELTA_VERSION=4.0.0
SCALA=2.13
if [ "${1:-}" != "jars" ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e ".[dev]"
    touch "$stamp"
  fi
fi
mkdir -p jars
for artifact in "io.delta:delta-spark_${SCALA}:${DELTA_VERSION}" "io.delta:delta-storage:${DELTA_VERSION}"; do
  name="$(echo "$artifact" | cut -d: -f2)-${DELTA_VERSION}.jar"
  if [ ! -f "jars/$name" ]; then
    if ! command -v mvn >/dev/null 2>&1; then
      echo "setup: Maven (mvn) is needed to fetch $artifact; installing it with apt-get" >&2
      apt-get update -qq && apt-get install -y -qq maven >/dev/null
    fi
    mvn -q dependency:copy -Dartifact="$artifact" -DoutputDirectory="$root/jars"
  fi
done
# A class-data-sharing archive of the JVM classes a release loads, beside the jars: every local
# session then starts faster (censusdp_spark/engine/class_archive.py). Recorded again after the
# packages change; a failure to record it is reported, not fatal (sessions start without it).
if [ "${1:-}" != "jars" ] && { [ ! -f jars/jvm-classes.jsa ] || [ "$stamp" -nt jars/jvm-classes.jsa ]; }; then
  echo "setup: recording the JVM class archive (once; a minute or two)" >&2
  .venv/bin/python -c "from pathlib import Path; from censusdp_spark.engine.class_archive import build_class_archive; build_class_archive(Path('jars'))" \
    || echo "setup: no class archive (sessions start without it)" >&2
fi
