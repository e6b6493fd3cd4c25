"""What a release is made of, part by part: the secret binding reads the measured parts, a
resumed run must match every part and names each key that changed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from censusdp_spark.model.config import RunOptions
from censusdp_spark.release.runner import (
    ReleaseContents,
    ReleaseRun,
    ResumeError,
    RunState,
    SecretError,
    SecretSource,
    check_secret,
)
from censusdp_spark.topdown.config import load_topdown_config
from censusdp_spark.topdown.job import topdown_contents
from tests.helpers.release import with_method

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"


def demo_contents(method: str = "full_information", variances: bool = False) -> ReleaseContents:
    doc = tomllib.loads(with_method(DEMO.read_text(), method))
    return topdown_contents(load_topdown_config(doc, ROOT), variances)


def resume(tmp_path: Path, started: ReleaseContents, now: ReleaseContents) -> None:
    """Enter a ``--resume`` of a run started with ``started``'s contents, with ``now``'s."""
    output, private = tmp_path / "out", tmp_path / "out.private"
    private.mkdir(mode=0o700, exist_ok=True)
    RunState(
        release="topdown", output=str(output), parts=started.fingerprints(), secret_fingerprint="f"
    ).save(private)
    run = ReleaseRun("topdown", output, private, SecretSource(None, None), now, resume=True)
    with run:
        pass


def test_the_binding_reads_the_measurement_and_a_resume_every_part(tmp_path):
    started = demo_contents()
    resume(tmp_path, started, demo_contents())  # the same release: resumed
    for now, keys in [
        (demo_contents("topdown"), "estimation.method, tables"),
        (demo_contents(variances=True), "tables"),
    ]:
        assert now.measurement_sha256 == started.measurement_sha256  # one secret may serve
        with pytest.raises(ResumeError) as refused:
            resume(tmp_path, started, now)
        message = str(refused.value)
        assert f"the release changed since the run started ({keys})" in message, message
        assert "fresh run" in message and "\n" not in message


def test_a_resume_with_other_noise_names_the_measured_key(tmp_path):
    doc = tomllib.loads(DEMO.read_text())
    doc["budget"]["rho"] = "1"
    other = topdown_contents(load_topdown_config(doc, ROOT), False)
    with pytest.raises(ResumeError, match=r"the input or config changed .*\(budget\)"):
        resume(tmp_path, demo_contents(), other)


ENV = "CENSUSDP_TEST_SECRET"
NAMED, EXPORTED = bytes(range(32)), bytes(range(1, 33))


def secret_file(tmp_path: Path, secret: bytes, name: str = "secret.hex") -> Path:
    path = tmp_path / name
    path.write_text(secret.hex() + "\n")
    path.chmod(0o600)
    return path


def test_a_named_secret_file_and_a_different_variable_are_refused_in_one_line(
    tmp_path, monkeypatch
):
    """A variable left set in the shell must not silently replace the file the command names."""
    named = secret_file(tmp_path, NAMED)
    monkeypatch.setenv(ENV, EXPORTED.hex())
    with pytest.raises(SecretError) as refused:
        SecretSource(named, ENV, named=True).read(tmp_path / "private")
    message = str(refused.value)
    assert message.count("\n") == 0 and f"--secret-file {named} (secret " in message
    assert f"environment variable {ENV} of [run] secret_env" in message
    assert "hold different secrets" in message
    assert NAMED.hex() not in message and EXPORTED.hex() not in message
    with pytest.raises(ValueError, match="hold different secrets"):  # censusdp validate
        check_secret(
            RunOptions(
                name="r",
                output=tmp_path,
                private_dir=tmp_path / "p",
                secret_file=None,
                secret_env=ENV,
                delta=1e-9,
            ),
            named,
        )
    assert not (tmp_path / "private").exists()


def test_a_named_secret_file_is_used_when_the_variable_agrees_or_is_unset(tmp_path, monkeypatch):
    named = secret_file(tmp_path, NAMED)
    source = SecretSource(named, ENV, named=True)
    monkeypatch.setenv(ENV, NAMED.hex())
    assert source.read(tmp_path) == NAMED
    monkeypatch.delenv(ENV)
    assert source.read(tmp_path) == NAMED
    missing = SecretSource(tmp_path / "absent.hex", ENV, named=True)
    monkeypatch.setenv(ENV, NAMED.hex())
    with pytest.raises(SecretError, match="absent.hex: secret file not found"):
        missing.read(tmp_path)  # the variable does not stand in for a file the command names


def test_the_config_s_variable_is_read_before_the_config_s_own_file(tmp_path, monkeypatch):
    """Both come from the config, which so declares the variable its override."""
    configured = secret_file(tmp_path, NAMED)
    monkeypatch.setenv(ENV, EXPORTED.hex())
    assert SecretSource(configured, ENV).read(tmp_path) == EXPORTED
    assert SecretSource(tmp_path / "absent.hex", ENV).read(tmp_path) == EXPORTED
    run = RunOptions(
        name="r",
        output=tmp_path,
        private_dir=tmp_path / "p",
        secret_file=configured,
        secret_env=ENV,
        delta=1e-9,
    )
    assert check_secret(run) == f"from environment variable {ENV}: well formed"
    monkeypatch.delenv(ENV)
    assert SecretSource(configured, ENV).read(tmp_path) == NAMED
