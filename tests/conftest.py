"""Shared fixtures: one real local Spark session with Delta for the whole test run; the markers
``e2e`` and ``statistical``, given by folder, and ``spark``, given to every test that uses the
session (``-m "not spark"``: the tests that need no JVM)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
FOLDER_MARKERS = {"e2e": pytest.mark.e2e, "statistical": pytest.mark.statistical}
"""The marker every test under ``tests/<folder>/`` carries, so ``-m`` can select by folder."""


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by ``-m``
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.resolve()
        for folder, marker in FOLDER_MARKERS.items():
            if path.is_relative_to(TESTS / folder):
                item.add_marker(marker)
        if "spark" in getattr(item, "fixturenames", ()):  # directly or through a fixture
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session", autouse=True)
def secret_registry(tmp_path_factory) -> Path:
    """The tests' own secret-binding registry (subprocesses inherit it), never the user's."""
    from censusdp_spark.release.runner import REGISTRY_ENV

    path = tmp_path_factory.mktemp("secret_registry")
    os.environ[REGISTRY_ENV] = str(path)
    return path


CHILD_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
"""The JIT of the driver JVMs the tests' child processes start (``spark-submit`` reads
``$SPARK_SUBMIT_OPTS``: a command line, a cluster's or Spark Connect's driver, an Airflow task):
the quick compiler only. Each such JVM lives for one small release, where the optimising
compiler's work costs more CPU than it saves (a quick release from the command line: 55 s of
CPU -> 33 s, 30.5 s -> 26.3 s wall), and the suite is CPU-bound on two cores. The tests'
own session lives for the whole run and keeps both compilers."""


@pytest.fixture(scope="session", autouse=True)
def quick_child_jvms() -> Iterator[None]:
    """``CHILD_JVM_OPTIONS`` in ``$SPARK_SUBMIT_OPTS`` for every child process of the run."""
    before = os.environ.get("SPARK_SUBMIT_OPTS")
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [before, CHILD_JVM_OPTIONS]))
    yield
    if before is None:
        os.environ.pop("SPARK_SUBMIT_OPTS", None)
    else:
        os.environ["SPARK_SUBMIT_OPTS"] = before


@pytest.fixture(scope="session")
def spark(quick_child_jvms):
    from censusdp_spark.engine.session import spark_session

    children = os.environ["SPARK_SUBMIT_OPTS"]
    own = children.removesuffix(CHILD_JVM_OPTIONS).strip()  # not for this process's own JVM
    os.environ["SPARK_SUBMIT_OPTS"] = own
    try:
        session = spark_session("censusdp-tests", "local[2]")
    finally:
        os.environ["SPARK_SUBMIT_OPTS"] = children
    session.conf.set("spark.sql.shuffle.partitions", "4")
    # The tests' inputs are small and their queries many and different: Spark evaluates them
    # interpreted instead of compiling Java for each (a fifth of a small release's time). The
    # releases' own sessions keep code generation; the tests that run a release in a process
    # of its own (the command line, a cluster, Spark Connect, faults) run it so.
    session.conf.set("spark.sql.codegen.wholeStage", "false")
    session.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret.hex"
    path.write_text("ab" * 32)
    path.chmod(0o600)
    return path


def ri_blocks_under(prefix: str, path: Path) -> Path:
    """The real RI 2010 blocks whose geocode starts with ``prefix``, with the header, at
    ``path``."""
    lines = (ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()
    path.write_text(
        "\n".join([lines[0], *[ln for ln in lines[1:] if ln.startswith(prefix)]]) + "\n"
    )
    return path


def owner_only_secret(folder: Path, byte: str) -> Path:
    """A run secret of 32 ``byte`` bytes in ``folder/secret.hex``, mode 0600."""
    path = folder / "secret.hex"
    path.write_text(byte * 32 + "\n")
    path.chmod(0o600)
    return path


COUNTY = "44001"  # Bristol County, RI: 1,092 blocks of the real 2010 file


@pytest.fixture(scope="session")
def county_csv(tmp_path_factory) -> Path:
    """The real RI 2010 blocks of one county, as a small TopDown input."""
    return ri_blocks_under(COUNTY, tmp_path_factory.mktemp("input") / "bristol.csv")


@pytest.fixture(scope="session")
def fixed_secret(tmp_path_factory) -> Path:
    return owner_only_secret(tmp_path_factory.mktemp("secret"), "5e")


@pytest.fixture(scope="session")
def reference_release(spark, county_csv, fixed_secret, tmp_path_factory) -> Path:
    """An undisturbed TopDown run (with --evaluate and --variances) on the county, through the
    CLI."""
    from censusdp_spark.cli import main

    out = tmp_path_factory.mktemp("release") / "out"
    code = main(
        [
            "topdown",
            "--config",
            str(ROOT / "conf" / "ri_2010_demo.toml"),
            "--input",
            str(county_csv),
            "--output",
            str(out),
            "--secret-file",
            str(fixed_secret),
            "--evaluate",
            "--variances",
        ]
    )
    assert code == 0
    return out


TRACT = "44001030100"  # one real RI 2010 tract of that county: 125 blocks


@pytest.fixture(scope="session")
def quick_tract(tmp_path_factory) -> tuple[Path, Path]:
    """The tract's blocks and, beside them, the demo config over three levels
    (``quick_demo_config``): the input of tests about processes and wiring (a cluster, a
    server, a killed worker), where the hierarchy's depth is not what is tested."""
    from tests.helpers.blocks import quick_demo_config

    path = ri_blocks_under(TRACT, tmp_path_factory.mktemp("quick") / "tract.csv")
    return path, quick_demo_config(path.parent)


@pytest.fixture(scope="session")
def quick_secret(tmp_path_factory) -> Path:
    """The secret of ``quick_tract``'s releases (a secret makes one release of one input:
    ``fixed_secret`` is the county's)."""
    return owner_only_secret(tmp_path_factory.mktemp("quick_secret"), "5f")


@pytest.fixture(scope="session")
def quick_reference(spark, quick_tract, quick_secret, tmp_path_factory) -> Path:
    """An undisturbed release of ``quick_tract`` with ``quick_secret``, in this process."""
    from censusdp_spark.cli import main

    csv, config = quick_tract
    out = tmp_path_factory.mktemp("quick_release") / "out"
    args = ["topdown", "--config", str(config), "--input", str(csv), "--output", str(out)]
    assert main([*args, "--secret-file", str(quick_secret)]) == 0
    return out
