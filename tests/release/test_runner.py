"""What a release is made of, part by part: the secret binding reads the measured parts, a
resumed run must match every part and names each key that changed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from censusdp_spark.release.runner import (
    ReleaseContents,
    ReleaseRun,
    ResumeError,
    RunState,
    SecretSource,
)
from censusdp_spark.topdown.config import load_config
from censusdp_spark.topdown.job import topdown_contents
from tests.conftest import with_method

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"


def demo_contents(method: str = "full_information", variances: bool = False) -> ReleaseContents:
    doc = tomllib.loads(with_method(DEMO.read_text(), method))
    return topdown_contents(load_config(doc, ROOT), variances)


def resume(tmp_path: Path, started: ReleaseContents, now: ReleaseContents) -> None:
    """Enter a ``--resume`` of a run started with ``started``'s contents, with ``now``'s."""
    output, private = tmp_path / "out", tmp_path / "out.private"
    private.mkdir(mode=0o700, exist_ok=True)
    RunState("topdown", str(output), started.fingerprints(), "f").save(private)
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
    other = topdown_contents(load_config(doc, ROOT), False)
    with pytest.raises(ResumeError, match=r"the input or config changed .*\(budget\)"):
        resume(tmp_path, demo_contents(), other)
