"""What can be checked of the project image without a container engine: the compose file parses,
every service runs the project image, the Dockerfile's Python meets ``requires-python``, the
services run the commands the standalone-cluster test runs, and a container without the Delta
jars says how to build the image."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml  # PyYAML, in the dev extras

from censusdp_spark.engine import session
from censusdp_spark.model.errors import SetupError
from tests.helpers.cluster import master_command, submit_command, worker_command

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
IMAGE = f"censusdp-spark:{PROJECT['version']}"


@pytest.fixture(scope="module")
def services() -> dict:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose["services"]


def dockerfile_stages() -> list[str]:
    """The base image of each ``FROM`` line, in order."""
    text = (ROOT / "Dockerfile").read_text()
    return re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_every_service_builds_and_runs_the_project_image(services):
    assert set(services) == {"spark-master", "spark-worker-1", "spark-worker-2", "submit-topdown"}
    for name, service in services.items():
        assert service["image"] == IMAGE, name
        assert service["build"] == ".", name


def test_the_image_is_on_a_python_the_project_supports():
    minimum = re.fullmatch(r">=\s*([0-9.]+)", PROJECT["requires-python"])
    assert minimum is not None, PROJECT["requires-python"]
    for base in dockerfile_stages():
        name, _, tag = base.partition(":")
        assert name == "python", base  # an official Python image
        found = re.match(r"([0-9]+\.[0-9]+)", tag)
        assert found is not None, f"{base}: the tag names no Python version"
        assert version_tuple(found.group(1)) >= version_tuple(minimum.group(1)), base


def test_the_image_has_java_17_and_the_jars_from_the_setup_script():
    text = (ROOT / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in text
    assert "scripts/setup.sh jars" in text  # the developer's Maven step, not a copy of it
    assert re.search(r"^RUN pip install --no-cache-dir \.$", text, flags=re.MULTILINE)


def test_the_services_run_the_cluster_tests_commands(services):
    master = "spark://spark-master:7077"
    assert services["spark-master"]["command"] == master_command("spark-master", 7077, 8080)
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert services[worker]["command"] == worker_command(master, worker, 2, "4g", 8081)
    jars = [f"jars/{j.name}" for j in session.delta_jars()]
    assert services["submit-topdown"]["command"] == submit_command(
        master, jars, "jobs/topdown.py", "--config", "conf/ri_2010_demo.toml", "--overwrite"
    )


def test_no_delta_jars_is_one_line_saying_how_to_build_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("CENSUSDP_JARS", str(tmp_path))
    with pytest.raises(SetupError) as err:
        session.delta_jars()
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path) in message and "docker compose build" in message


@pytest.mark.parametrize("launch", ["local", "spark-submit"])
def test_the_cli_without_delta_jars_prints_that_line_and_starts_no_spark(tmp_path, launch):
    """As the image's services run it: ``CENSUSDP_JARS`` names the image's jar folder, which is
    empty; under spark-submit (its gateway variable set) the job stops before using Spark."""
    env = {**os.environ, "CENSUSDP_JARS": str(tmp_path / "none")}
    env.pop("SPARK_REMOTE", None)
    if launch == "spark-submit":
        env["PYSPARK_GATEWAY_PORT"] = "1"  # nothing listens: Spark must not be reached
    run = subprocess.run(
        [sys.executable, "-m", "censusdp_spark.cli", "topdown", "--config"]
        + [str(ROOT / "conf" / "ri_2010_demo.toml"), "--output", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "docker compose build" in lines[0], run.stderr
    assert not (tmp_path / "out").exists()
