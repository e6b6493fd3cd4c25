#!/usr/bin/env bash
# Idempotent setup of a separate Airflow environment, .venv-airflow, for jobs/airflow/ (the DAG
# that schedules a release). Airflow's own dependency pins clash with the project's, so it never
# goes into .venv: its tasks call the project's `.venv/bin/spark-submit` and `.venv/bin/censusdp`,
# and the Airflow venv needs neither pyspark nor the project.
#
# Airflow's constraint files cannot be fetched here, so the versions that matter are pinned below
# (Airflow 3.3.2 and the packages its task runner and metadata DB lean on); pip resolves the same
# set (checked), uv does it in seconds rather than minutes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh   # the project venv and the Delta jars, which the tasks run with

UV_VERSION=0.13.9
PINS=(
  "apache-airflow==3.3.2"
  "apache-airflow-core==3.3.2"
  "apache-airflow-task-sdk==1.3.2"
  "apache-airflow-providers-apache-spark==6.3.4"
  "apache-airflow-providers-standard==1.21.0"
  "apache-airflow-providers-common-compat==1.23.0"
  "apache-airflow-providers-common-io==1.11.0"
  "apache-airflow-providers-common-sql==2.4.0"
  "apache-airflow-providers-smtp==3.2.0"
  "sqlalchemy==2.1.9"
  "alembic==1.20.1"
  "fastapi==0.136.3"
  "starlette==1.10.0"
  "pydantic==2.14.4"
  "cadwyn==7.0.0"
  "pendulum==3.3.0"
  "structlog==26.1.0"
  "msgspec==0.23.0"
)

if [ ! -x .venv-airflow/bin/python ]; then
  python3 -m venv .venv-airflow
fi
stamp=".venv-airflow/.installed-$(sha256sum scripts/setup_airflow.sh | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  started=$SECONDS
  .venv-airflow/bin/pip install -q --disable-pip-version-check "uv==${UV_VERSION}"
  .venv-airflow/bin/uv pip install -q --python .venv-airflow/bin/python "${PINS[@]}"
  rm -f .venv-airflow/.installed-*
  touch "$stamp"
  echo "setup_airflow: installed Airflow into .venv-airflow in $((SECONDS - started)) s" >&2
fi
