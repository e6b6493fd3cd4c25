"""The JVM class archive beside Delta's jars: which options a session's JVM gets, that a JVM
started with them maps Delta's classes from the archive ``scripts/setup.sh`` recorded, and that
a failed recording leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from censusdp_spark.engine import class_archive
from censusdp_spark.engine.class_archive import (
    ARCHIVE_ENV,
    ARCHIVE_NAME,
    archive_file,
    build_class_archive,
    java_options,
)
from censusdp_spark.engine.jars import delta_jars
from censusdp_spark.model.errors import SetupError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def jars(tmp_path: Path, monkeypatch) -> list[Path]:
    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    monkeypatch.delenv(class_archive._DUMP_ENV, raising=False)
    monkeypatch.delenv(class_archive._RECORDED_ENV, raising=False)
    folder = tmp_path / "jars"
    folder.mkdir()
    for name in ("delta-spark.jar", "delta-storage.jar"):
        (folder / name).write_bytes(b"")
    return sorted(folder.iterdir())


def test_no_archive_beside_the_jars_no_option(jars):
    assert archive_file(jars) is None
    assert java_options(jars) is None
    assert java_options([]) is None


def test_the_archive_beside_the_jars_is_mapped_quietly(jars):
    archive = jars[0].parent / ARCHIVE_NAME
    archive.write_bytes(b"x")
    options = java_options(jars)
    assert options is not None
    assert f"-XX:SharedArchiveFile={archive}" in options.split()
    # A JVM that cannot use it (another Java, other jars) starts without it, and says nothing.
    assert {"-Xshare:auto", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"} <= set(options.split())


def test_off_turns_it_off_and_another_value_is_refused(jars, monkeypatch):
    (jars[0].parent / ARCHIVE_NAME).write_bytes(b"x")
    monkeypatch.setenv(ARCHIVE_ENV, "OFF")
    assert java_options(jars) is None
    monkeypatch.setenv(ARCHIVE_ENV, "")
    assert java_options(jars) is not None
    for value in ("of", "/some/other.jsa"):  # a typo is not "on"; no archive but the checked one
        monkeypatch.setenv(ARCHIVE_ENV, value)
        with pytest.raises(SetupError, match=f"CENSUSDP_CLASS_ARCHIVE={value!r}: the value is off"):
            java_options(jars)


def test_the_recording_child_writes_the_archive_at_exit(jars, tmp_path, monkeypatch):
    (jars[0].parent / ARCHIVE_NAME).write_bytes(b"x")  # an old one is not mapped while recording
    monkeypatch.setenv(class_archive._DUMP_ENV, str(tmp_path / "new.jsa"))
    options = (java_options(jars) or "").split()
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'}" in options
    assert not any(o.startswith("-XX:SharedArchiveFile") for o in options)


def test_a_failed_recording_is_refused_and_leaves_nothing(tmp_path):
    """No jars in the folder: the recording child's session is refused; no archive, no scratch
    folder is left."""
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(SetupError, match="class archive: the record step failed"):
        build_class_archive(folder)
    assert list(folder.iterdir()) == []


FIRST_TABLE = textwrap.dedent(
    """
    import sys
    from censusdp_spark.engine.session import spark_session

    spark = spark_session("class-archive-test", "local[1]")
    spark.range(3).write.format("delta").save(sys.argv[1])
    spark.stop()
    """
)


@pytest.mark.slow
def test_a_session_maps_delta_and_spark_classes_from_the_recorded_archive(tmp_path):
    """The archive ``scripts/setup.sh`` recorded beside the jars: the JVM of a session
    ``spark_session`` starts loads Spark's and Delta's classes from it (the JVM's class-load
    log names the archive as their source) and writes a Delta table; the user's own
    ``spark.driver.extraJavaOptions`` (here, that log) still apply."""
    jars = delta_jars()
    assert archive_file(jars) is not None, (
        f"no {ARCHIVE_NAME} beside {jars[0].parent}: run scripts/setup.sh"
    )
    log = tmp_path / "classes.log"
    done = subprocess.run(
        [sys.executable, "-c", FIRST_TABLE, str(tmp_path / "table")],
        cwd=ROOT,
        env={
            **os.environ,
            "PYSPARK_SUBMIT_ARGS": "--conf spark.driver.extraJavaOptions="
            f"-Xlog:class+load=info:file={log} pyspark-shell",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = log.read_text().splitlines()

    def shared(name: str) -> bool:
        return any(f" {name} source: shared objects file (top)" in line for line in lines)

    assert shared("org.apache.spark.sql.SparkSession")
    assert shared("org.apache.spark.sql.delta.DeltaLog")
    assert (tmp_path / "table" / "_delta_log").is_dir()
