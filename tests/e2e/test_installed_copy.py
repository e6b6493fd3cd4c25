"""An installed copy works outside a checkout: built from the source as pip builds it and run from
a folder with no checkout around it, the package generates the synthetic inputs from the data it
ships, ``censusdp jars`` fetches the Delta jars into the user's cache, and a release then runs
with them.

The copy is built with the project environment's own setuptools: ``egg_info`` and ``build_py``
write the files and the metadata a wheel of the package holds (the package data included), into
a folder then put first on ``PYTHONPATH``, as ``pip install --target`` would lay them out. Not
``pip wheel``: the setuptools ``python -m venv`` bundles has no ``bdist_wheel`` without the
``wheel`` package, and a build in an isolated environment needs the network. The jars come from
a ``file://`` folder laid out like Maven Central, filled from the checkout's ``jars/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from censusdp_spark.engine.jars import DELTA_ARTIFACTS, DELTA_VERSION, MAVEN_URL_ENV
from tests.helpers.release import TOPDOWN_GUARANTEES_HELD

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "censusdp_spark")
"""What a build reads (the project image's Dockerfile copies the same to ``pip install .``)."""
SEED = 1
SMALLEST_FRACTION = "0.001"  # one small state (DC with this seed): seconds to generate


@dataclass(frozen=True)
class Installed:
    site: Path  # the installed package and its metadata
    home: Path  # the user's working folder: no checkout, no data/, no jars/
    cache: Path  # $XDG_CACHE_HOME
    maven: str  # a Maven repository holding the Delta jars


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("installed")
    source, site, home = base / "source", base / "site", base / "home"
    for folder in (source, site, home):
        folder.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(ROOT / name, source / name)
    build = [sys.executable, "-W", "ignore", "-c", "import setuptools; setuptools.setup()", "-q"]
    subprocess.run(
        [*build, "egg_info", "--egg-base", str(site), "build_py", "--build-lib", str(site)],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    maven = base / "maven"
    for artifact in DELTA_ARTIFACTS:
        jar = maven / artifact.repository_path
        jar.parent.mkdir(parents=True)
        shutil.copy(ROOT / "jars" / artifact.file_name, jar)
        jar.with_name(jar.name + ".sha1").write_text(f"{sha1(jar)}\n")
    return Installed(site, home, base / "cache", maven.as_uri())


def run(installed: Installed, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m ARGS`` with the installed copy first on the path, in the user's folder."""
    env = {
        **os.environ,
        "PYTHONPATH": str(installed.site),
        "XDG_CACHE_HOME": str(installed.cache),
        MAVEN_URL_ENV: installed.maven,
        "CENSUSDP_MASTER": "local[2]",
        "CENSUSDP_DRIVER_MEMORY": "2g",
    }
    for name in ("CENSUSDP_JARS", "SPARK_REMOTE", "PYSPARK_GATEWAY_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, *args],
        cwd=installed.home,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def generated(installed: Installed) -> Path:
    """``censusdp generate national --schema production`` into the user's ``data/national``,
    the path ``conf/national_demo.toml`` reads: every shipped file the generators read."""
    run(
        installed,
        *("-m", "censusdp_spark.cli", "generate", "national", "--seed", str(SEED)),
        *("--fraction", SMALLEST_FRACTION, "--schema", "production", "--output", "data/national"),
    )
    return installed.home / "data" / "national"


@pytest.fixture(scope="module")
def fetched(installed: Installed) -> subprocess.CompletedProcess:
    return run(installed, "-m", "censusdp_spark.cli", "jars")


def test_the_installed_copy_is_the_one_imported_and_knows_it_is_no_checkout(installed):
    probe = (
        "import json, censusdp_spark\n"
        "from censusdp_spark.engine.jars import checkout_jars\n"
        "print(json.dumps([censusdp_spark.__file__, censusdp_spark.__version__,"
        " checkout_jars() is None]))"
    )
    where, version, no_checkout = json.loads(run(installed, "-c", probe).stdout)
    assert Path(where) == installed.site / "censusdp_spark" / "__init__.py"
    assert version != "unknown" and no_checkout


def test_the_generator_reads_the_data_the_package_ships(installed, generated):
    shipped = installed.site / "censusdp_spark" / "generate" / "data"
    assert (shipped / "README.md").is_file()  # provenance and licences travel with the files
    for folder in ("blocks", "persons", "spine"):
        assert sorted(p.name for p in (generated / folder).iterdir()) == ["state_11.parquet"]
    report = json.loads((generated / "metadata.json").read_text())
    assert report["synthetic"] and report["states"] == ["11"]
    assert {"RI 2010", "HI 2010"} <= set(report["validation"])  # the shipped block files
    real = set(report["production"]["validation"]) - {"generated"}
    assert real == {
        "Perry County AL PPMF (2010 demo, real)",
        "Providence County RI 2018 E2E P.L. (real)",
    }


def test_jars_fetches_the_delta_jars_into_the_user_cache_verified(installed, fetched):
    cache = installed.cache / "censusdp" / "jars"
    assert fetched.stdout.splitlines()[-1] == f"Delta Lake {DELTA_VERSION} jars in {cache}"
    for artifact in DELTA_ARTIFACTS:
        jar = cache / artifact.file_name
        assert sha1(jar) == sha1(ROOT / "jars" / artifact.file_name)
        assert (cache / f"{artifact.file_name}.sha1").read_text().strip() == sha1(jar)
    lookup = "from censusdp_spark.engine.jars import delta_jars; print(*delta_jars(), sep='\\n')"
    found = run(installed, "-c", lookup).stdout.split()
    assert found == sorted(str(cache / a.file_name) for a in DELTA_ARTIFACTS)


@pytest.mark.slow
def test_a_release_runs_from_the_installed_copy_with_the_fetched_jars(
    installed, generated, fetched
):
    """The getting-started steps of an installed copy, in the user's folder: generate, fetch the
    jars, run the national demo TopDown on the generated state (about a minute and more)."""
    run(
        installed,
        *(
            "-m",
            "censusdp_spark.cli",
            "topdown",
            "--config",
            str(ROOT / "conf" / "national_demo.toml"),
        ),
        timeout=900,
    )
    output = installed.home / "output" / "national_demo"
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["guarantee_checks"] == TOPDOWN_GUARANTEES_HELD
    assert manifest["nodes"]["state"] == 1 and manifest["nodes"]["block"] > 1000
    for table in manifest["tables"]:
        assert (output / table / "_delta_log").is_dir(), table
