# The project image: Python 3.11 on Debian bookworm, Java 17 from Debian's packages, the project
# with its pinned dependencies (pyspark's wheel carries Spark's jars and spark-class), and the Delta
# jars fetched at build time by scripts/setup.sh, the same Maven step as a developer's setup.
# docker-compose.yml builds it for the master, the workers and the submit job.
# Not built in the project's own environment (it has no container engine); what can be checked
# without one, tests/e2e/test_container.py checks.

# Maven and its JDK stay in this stage; only the jars go on.
FROM python:3.11-slim-bookworm AS delta-jars
WORKDIR /opt/censusdp
COPY scripts/setup.sh scripts/setup.sh
RUN bash scripts/setup.sh jars

FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/censusdp
COPY pyproject.toml README.md ./
COPY censusdp_spark censusdp_spark
RUN pip install --no-cache-dir .
COPY jobs jobs
COPY conf conf
COPY --from=delta-jars /opt/censusdp/jars jars
# Executors run the project's numpy/scipy code in Python workers: this interpreter has it.
ENV PYSPARK_PYTHON=python3 \
    CENSUSDP_JARS=/opt/censusdp/jars \
    SPARK_NO_DAEMONIZE=true
CMD ["censusdp", "--help"]
