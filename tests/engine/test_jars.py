"""The Delta jars: where a session looks for them, in order, and ``censusdp jars``, which fetches
them from a Maven repository, keeps only what matches the published SHA-1 and fetches nothing
twice."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.engine import jars
from censusdp_spark.engine.jars import DELTA_ARTIFACTS, DELTA_VERSION, SCALA_VERSION, Artifact
from censusdp_spark.model.errors import SetupError

ROOT = Path(__file__).resolve().parents[2]
NAMES = [artifact.file_name for artifact in DELTA_ARTIFACTS]


def fill(folder: Path, names: list[str] = NAMES) -> list[Path]:
    """``folder`` holding (empty) jars of these names."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return sorted(folder / name for name in names)


@pytest.fixture
def places(tmp_path, monkeypatch) -> dict[str, Path]:
    """A checkout (its pyproject names the project), an installed copy's folder and a user
    cache, all empty; the package runs from the checkout and ``$CENSUSDP_JARS`` is unset."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "censusdp-spark"\n')
    installed = tmp_path / "site-packages"
    installed.mkdir()
    monkeypatch.setattr(jars, "PROJECT_ROOT", checkout)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    return {
        "checkout": checkout,
        "installed": installed,
        "cache": tmp_path / "cache" / "censusdp" / "jars",
        "named": tmp_path / "named",
    }


def test_a_named_folder_comes_first(places, monkeypatch):
    fill(places["checkout"] / "jars")
    fill(places["cache"])
    named = fill(places["named"], ["delta-spark_2.13-9.9.9.jar", "delta-storage-9.9.9.jar"])
    monkeypatch.setenv(jars.JARS_ENV, str(places["named"]))
    assert jars.delta_jars() == named  # any version a folder named on purpose holds


def test_a_named_folder_without_jars_is_refused_not_passed_over(places, monkeypatch):
    fill(places["cache"])
    monkeypatch.setenv(jars.JARS_ENV, str(places["named"]))
    with pytest.raises(SetupError) as err:
        jars.delta_jars()
    message = str(err.value)
    assert "\n" not in message and f"{places['named']} ($CENSUSDP_JARS)" in message
    assert "`censusdp jars`" in message and "docker compose build" in message


def test_a_checkout_uses_its_own_jars_folder(places):
    fill(places["cache"])
    own = fill(places["checkout"] / "jars")
    assert jars.delta_jars() == own


def test_a_checkout_without_jars_uses_the_user_cache(places):
    cached = fill(places["cache"])
    assert jars.delta_jars() == cached


def test_an_installed_copy_uses_the_user_cache_not_a_jars_folder_beside_it(places, monkeypatch):
    monkeypatch.setattr(jars, "PROJECT_ROOT", places["installed"])
    fill(places["installed"] / "jars")
    cached = fill(places["cache"])
    assert jars.checkout_jars() is None
    assert jars.delta_jars() == cached


def test_another_projects_checkout_is_not_ours(places, monkeypatch):
    (places["installed"] / "pyproject.toml").write_text('[project]\nname = "other"\n')
    monkeypatch.setattr(jars, "PROJECT_ROOT", places["installed"])
    assert jars.checkout_jars() is None


def test_the_cache_counts_only_the_pinned_version(places):
    fill(places["cache"], ["delta-spark_2.13-3.2.0.jar", "delta-storage-3.2.0.jar", NAMES[0]])
    with pytest.raises(SetupError):
        jars.delta_jars()  # one pinned jar of two: none
    fill(places["cache"])
    assert jars.delta_jars() == sorted(places["cache"] / name for name in NAMES)


def test_no_jars_anywhere_is_one_line_naming_every_place_and_the_two_ways(places):
    with pytest.raises(SetupError) as err:
        jars.delta_jars()
    message = str(err.value)
    assert "\n" not in message
    assert f"{places['checkout'] / 'jars'} or {places['cache']}" in message
    assert "`censusdp jars`" in message and "$CENSUSDP_JARS" in message


def test_the_cache_follows_xdg_else_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jars.cache_dir() == tmp_path / "censusdp" / "jars"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert jars.cache_dir() == tmp_path / "home" / ".cache" / "censusdp" / "jars"


def test_the_pinned_version_is_what_setup_sh_fetches_and_the_installed_spark_expects():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(rf"^DELTA_VERSION={re.escape(DELTA_VERSION)}$", script, re.MULTILINE)
    assert re.search(rf"^SCALA={re.escape(SCALA_VERSION)}$", script, re.MULTILINE)
    assert importlib.metadata.version("delta-spark") == DELTA_VERSION  # its Python half
    # Delta x.y is built for Spark x.y and its Scala: the jars pyspark's wheel carries.
    spark = importlib.metadata.version("pyspark").split(".")[:2]
    assert spark == DELTA_VERSION.split(".")[:2]
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.submodule_search_locations
    spark_jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    assert list(spark_jars.glob(f"scala-library-{SCALA_VERSION}.*.jar"))


def test_artifacts_are_where_maven_keeps_them():
    artifact = Artifact("io.delta", "delta-storage", "4.0.0")
    assert artifact.url("https://repo1.maven.org/maven2/") == (
        "https://repo1.maven.org/maven2/io/delta/delta-storage/4.0.0/delta-storage-4.0.0.jar"
    )


# ``censusdp jars``, against a Maven repository in a folder.

CONTENT = {artifact: f"the {artifact.name} jar".encode() * 1000 for artifact in DELTA_ARTIFACTS}


def repository(root: Path, content: dict[Artifact, bytes] = CONTENT, sha1s: dict | None = None):
    """A ``file://`` Maven repository holding ``content``, each with its ``.sha1`` (as Maven
    Central writes it, or as ``sha1s`` says)."""
    for artifact, body in content.items():
        jar = root / artifact.repository_path
        jar.parent.mkdir(parents=True, exist_ok=True)
        jar.write_bytes(body)
        digest = (sha1s or {}).get(artifact, hashlib.sha1(body).hexdigest())
        jar.with_name(jar.name + ".sha1").write_text(digest)
    return root.as_uri()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_fetching_puts_each_jar_verified_and_its_checksum_beside_it(tmp_path):
    out = tmp_path / "jars"
    fetched = jars.fetch_delta_jars(out, repository(tmp_path / "m2"))
    assert [f.path for f in fetched] == [out / name for name in NAMES]
    for artifact, jar in zip(DELTA_ARTIFACTS, fetched, strict=True):
        assert jar.downloaded and jar.path.read_bytes() == CONTENT[artifact]
        assert jar.sha1 == hashlib.sha1(CONTENT[artifact]).hexdigest()
        assert (out / f"{artifact.file_name}.sha1").read_text().strip() == jar.sha1
        assert jar.url == f"{(tmp_path / 'm2').as_uri()}/{artifact.repository_path}"
    assert leftovers(out) == []


def test_fetching_again_downloads_nothing_even_offline(tmp_path):
    out = tmp_path / "jars"
    jars.fetch_delta_jars(out, repository(tmp_path / "m2"))
    before = {p.name: p.stat().st_ino for p in out.iterdir()}
    again = jars.fetch_delta_jars(out, (tmp_path / "nowhere").as_uri())
    assert not any(f.downloaded for f in again)
    assert {p.name: p.stat().st_ino for p in out.iterdir()} == before


def test_jars_fetched_by_maven_are_verified_and_kept(tmp_path):
    """``scripts/setup.sh`` leaves jars without a checksum file: checked against the published
    one, kept as they are."""
    out = tmp_path / "jars"
    out.mkdir()
    for artifact in DELTA_ARTIFACTS:
        (out / artifact.file_name).write_bytes(CONTENT[artifact])
    inodes = {name: (out / name).stat().st_ino for name in NAMES}
    fetched = jars.fetch_delta_jars(out, repository(tmp_path / "m2"))
    assert not any(f.downloaded for f in fetched)
    assert {name: (out / name).stat().st_ino for name in NAMES} == inodes
    assert all((out / f"{name}.sha1").is_file() for name in NAMES)


def test_a_damaged_jar_is_fetched_again(tmp_path):
    out = tmp_path / "jars"
    jars.fetch_delta_jars(out, repository(tmp_path / "m2"))
    damaged = out / NAMES[0]
    damaged.write_bytes(b"truncated")
    fetched = jars.fetch_delta_jars(out, (tmp_path / "m2").as_uri())
    assert [f.downloaded for f in fetched] == [True, False]
    assert damaged.read_bytes() == CONTENT[DELTA_ARTIFACTS[0]]


def test_a_jar_that_does_not_match_its_published_checksum_is_refused(tmp_path):
    first = DELTA_ARTIFACTS[0]
    url = repository(tmp_path / "m2", sha1s={first: "0" * 40})
    out = tmp_path / "jars"
    with pytest.raises(SetupError) as err:
        jars.fetch_delta_jars(out, url)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{first.url(url)}: SHA-1 {hashlib.sha1(CONTENT[first]).hexdigest()}")
    assert f"differs from the published {'0' * 40}" in message
    assert list(out.iterdir()) == []  # neither the jar nor a partial file


def test_a_refused_download_leaves_the_jar_there_untouched(tmp_path):
    out = tmp_path / "jars"
    jars.fetch_delta_jars(out, repository(tmp_path / "m2"))
    (out / NAMES[0]).write_bytes(b"damaged")
    (out / f"{NAMES[0]}.sha1").unlink()
    changed = {artifact: b"changed" for artifact in DELTA_ARTIFACTS}
    url = repository(tmp_path / "changed", changed, {a: "1" * 40 for a in DELTA_ARTIFACTS})
    with pytest.raises(SetupError, match="differs from the published"):
        jars.fetch_delta_jars(out, url)
    assert (out / NAMES[0]).read_bytes() == b"damaged"  # left as it was, not overwritten
    assert leftovers(out) == []


def test_a_checksum_file_that_is_not_one_is_refused(tmp_path):
    url = repository(tmp_path / "m2", sha1s={DELTA_ARTIFACTS[0]: "<html>moved</html>"})
    with pytest.raises(SetupError, match=r"\.jar\.sha1: not a SHA-1 checksum"):
        jars.fetch_delta_jars(tmp_path / "jars", url)


def test_a_missing_artifact_names_its_url(tmp_path):
    url = repository(tmp_path / "m2", {DELTA_ARTIFACTS[0]: b"jar"})
    with pytest.raises(SetupError) as err:
        jars.fetch_delta_jars(tmp_path / "jars", url)
    assert str(err.value).startswith(f"cannot fetch {DELTA_ARTIFACTS[1].url(url)}.sha1: ")


def test_the_command_fetches_into_the_cache_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(jars.MAVEN_URL_ENV, repository(tmp_path / "m2"))
    assert main(["jars"]) == 0
    cache = tmp_path / "cache" / "censusdp" / "jars"
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == NAMES
    assert all("verified, fetched from file://" in line for line in lines[:2])
    assert lines[2:] == [f"Delta Lake {DELTA_VERSION} jars in {cache}"]
    assert main(["jars", "--dir", str(tmp_path / "elsewhere")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"sessions load them when CENSUSDP_JARS={tmp_path / 'elsewhere'}"
    )


def test_the_command_reports_a_refused_jar_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(
        jars.MAVEN_URL_ENV, repository(tmp_path / "m2", sha1s={DELTA_ARTIFACTS[1]: "f" * 40})
    )
    assert main(["jars", "--dir", str(tmp_path / "jars")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("censusdp: error: file://")
    assert "differs from the published" in err[0]


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SetupError, match=r"^cannot write the jars into .*file/jars: "):
        jars.fetch_delta_jars(tmp_path / "file" / "jars", repository(tmp_path / "m2"))


@pytest.mark.slow
def test_a_class_archive_that_cannot_be_recorded_is_one_line_and_leaves_nothing(
    tmp_path, monkeypatch, capsys
):
    """``censusdp jars --class-archive`` records the archive after fetching; with jars a JVM
    cannot run a release from (the test repository's are empty files), the recording fails:
    one line, the jars kept, no archive and no scratch folder beside them."""
    monkeypatch.setenv(jars.MAVEN_URL_ENV, repository(tmp_path / "m2"))
    folder = tmp_path / "jars"
    assert main(["jars", "--dir", str(folder), "--class-archive"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "class archive: the record step failed" in err[0], err
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*NAMES, *(f"{n}.sha1" for n in NAMES)]
    )
