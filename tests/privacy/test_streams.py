"""Keyed streams are reproducible and independent; the run secret is guarded and never echoed."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest
import randomgen

from censusdp_spark.privacy import (
    discrete_gaussian,
    keyed_rng,
    load_or_create_secret,
    secret_fingerprint,
)

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))
ENV_VAR = "CENSUSDP_TEST_RUN_SECRET"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- keyed streams -----------------------------------------------------------------------------


def test_same_secret_and_key_give_identical_streams():
    first, again = (
        keyed_rng(SECRET, "persons", "block", 7),
        keyed_rng(SECRET, "persons", "block", 7),
    )
    assert np.array_equal(first.integers(0, 2**63, 1000), again.integers(0, 2**63, 1000))
    assert np.array_equal(
        discrete_gaussian(5, 1000, keyed_rng(SECRET, "noise")),
        discrete_gaussian(5, 1000, keyed_rng(SECRET, "noise")),
    )


def test_stream_is_chacha20_and_pinned_to_its_key_derivation():
    """A silent change of the derivation would make a resumed run draw fresh noise."""
    rng = keyed_rng(SECRET, "persons", 3)
    assert isinstance(rng.bit_generator, randomgen.ChaCha)
    assert rng.bit_generator.state["state"]["rounds"] == 20
    assert rng.integers(0, 2**64, 2, dtype=np.uint64).tolist() == [
        9341884006865931693,
        16281029845929120811,
    ]


@pytest.mark.parametrize(
    "key, other",
    [
        (("a", "bc"), ("ab", "c")),
        ((1,), ("1",)),
        (("a",), ("a", "")),
        ((12, 3), (1, 23)),
        (("persons",), ("units",)),
    ],
)
def test_different_keys_give_different_streams(key, other):
    first = keyed_rng(SECRET, *key).integers(0, 2**63, 64)
    second = keyed_rng(SECRET, *other).integers(0, 2**63, 64)
    assert not np.array_equal(first, second)


def test_different_secrets_give_different_streams():
    first = keyed_rng(SECRET, "persons").integers(0, 2**63, 64)
    second = keyed_rng(OTHER_SECRET, "persons").integers(0, 2**63, 64)
    assert not np.array_equal(first, second)


def test_streams_for_neighbouring_keys_are_uncorrelated():
    size = 200_000
    base = keyed_rng(SECRET, "county", 1).random(size)
    for other in (keyed_rng(SECRET, "county", 2), keyed_rng(SECRET, "county", 10)):
        correlation = np.corrcoef(base, other.random(size))[0, 1]
        assert abs(correlation) < 5 / np.sqrt(size)
    lagged = np.corrcoef(base[:-1], keyed_rng(SECRET, "county", 2).random(size)[1:])[0, 1]
    assert abs(lagged) < 5 / np.sqrt(size)


@pytest.mark.parametrize("part", [True, 1.0, b"a", None])
def test_key_parts_other_than_str_and_int_are_refused(part):
    with pytest.raises(TypeError, match="key parts must be str or int"):
        keyed_rng(SECRET, "persons", part)


def test_secret_of_wrong_length_or_type_is_refused():
    with pytest.raises(ValueError, match="must be 32 bytes, got 31"):
        keyed_rng(SECRET[:31], "persons")
    with pytest.raises(TypeError, match="must be bytes"):
        keyed_rng(SECRET.hex(), "persons")  # type: ignore[arg-type]


def test_fingerprint_identifies_the_secret_without_revealing_it():
    fingerprint = secret_fingerprint(SECRET)
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert fingerprint == secret_fingerprint(bytes(SECRET))
    assert fingerprint != secret_fingerprint(OTHER_SECRET)
    assert fingerprint not in SECRET.hex()


# --- the run secret ----------------------------------------------------------------------------


def test_secret_file_readable_by_others_is_refused_naming_path_and_mode(tmp_path):
    path = tmp_path / "secret.hex"
    path.write_text(SECRET.hex() + "\n")
    path.chmod(0o644)
    with pytest.raises(PermissionError, match=rf"{path}.*0o644") as refused:
        load_or_create_secret(path, None, tmp_path / "private")
    assert SECRET.hex() not in str(refused.value)


def test_private_secret_file_is_read(tmp_path):
    path = tmp_path / "secret.hex"
    path.write_text(SECRET.hex() + "\n")
    path.chmod(0o600)
    assert load_or_create_secret(path, None, tmp_path / "private") == SECRET
    path.write_text(SECRET.hex())
    assert load_or_create_secret(path, None, tmp_path / "private") == SECRET


def test_generated_secret_is_private_and_reused_by_a_resumed_run(tmp_path):
    private_dir = tmp_path / "run" / "private"
    secret = load_or_create_secret(None, None, private_dir)
    secret_path = private_dir / "run_secret"
    assert len(secret) == 32
    assert mode_of(secret_path) == 0o600
    assert mode_of(private_dir) == 0o700
    assert secret_path.read_text() == secret.hex() + "\n"
    assert load_or_create_secret(None, None, private_dir) == secret
    assert list(private_dir.iterdir()) == [secret_path]


def test_resumed_run_refuses_a_secret_file_made_readable(tmp_path):
    load_or_create_secret(None, None, tmp_path)
    (tmp_path / "run_secret").chmod(0o640)
    with pytest.raises(PermissionError, match="0o640"):
        load_or_create_secret(None, None, tmp_path)


def test_environment_variable_wins_over_file(tmp_path, monkeypatch):
    path = tmp_path / "secret.hex"
    path.write_text(OTHER_SECRET.hex())
    path.chmod(0o600)
    monkeypatch.setenv(ENV_VAR, SECRET.hex())
    assert load_or_create_secret(path, ENV_VAR, tmp_path / "private") == SECRET
    assert not (tmp_path / "private").exists()


def test_unset_environment_variable_falls_back_to_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    path = tmp_path / "secret.hex"
    path.write_text(OTHER_SECRET.hex())
    path.chmod(0o600)
    assert load_or_create_secret(path, ENV_VAR, tmp_path / "private") == OTHER_SECRET


@pytest.mark.parametrize(
    "text", [SECRET.hex()[:-2], SECRET.hex() + "00", "zz" * 32, "ab " * 21 + "a"]
)
def test_malformed_secret_is_refused_without_echoing_it(tmp_path, monkeypatch, text):
    monkeypatch.setenv(ENV_VAR, text)
    with pytest.raises(ValueError, match=ENV_VAR) as refused:
        load_or_create_secret(None, ENV_VAR, tmp_path)
    assert text not in str(refused.value)
    path = tmp_path / "secret.hex"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ValueError, match="secret file"):
        load_or_create_secret(path, None, tmp_path)
