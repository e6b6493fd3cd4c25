"""Keyed ChaCha20 random streams and the run secret they are keyed by.

Privacy claim
-------------
The samplers' guarantees assume noise bits that an adversary cannot predict. Every stream here is
ChaCha20 (20 rounds) keyed by HMAC-SHA256(secret, key tuple): without the 32-byte run secret the
streams are computationally indistinguishable from uniform, provided HMAC-SHA256 is a PRF and
ChaCha20 a secure stream cipher. With it, every stream is reproducible, so a resumed run redraws
exactly the noise it drew before and never draws fresh noise for a measurement already released
(which would spend budget again).

Distinct key tuples give streams that no efficient test can tell from independent ones: distinct
encodings give unrelated ChaCha20 keys, and the encoding is injective, because every part is
tagged with its type and prefixed with its length, so ("a", "bc") ≠ ("ab", "c") and 1 ≠ "1".

The secret is the whole of the protection. It is never logged or printed; a file holding it must
not be readable by group or others; :func:`secret_fingerprint` identifies it in manifests without
revealing it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import string
import tempfile
from pathlib import Path

import numpy as np
import randomgen

SECRET_BYTES = 32
SECRET_FILE_NAME = "run_secret"

_KEY_DOMAIN = b"censusdp-spark/keyed-rng/v1\x00"
_FINGERPRINT_DOMAIN = b"censusdp-spark/secret-fingerprint/v1\x00"
_CHACHA_ROUNDS = 20


def keyed_rng(secret: bytes, *key: str | int) -> np.random.Generator:
    """A ChaCha20 generator whose stream is determined by ``secret`` and the ``key`` tuple."""
    _check_secret(secret)
    digest = hmac.new(secret, _encode_key(key), hashlib.sha256).digest()
    chacha = randomgen.ChaCha(key=int.from_bytes(digest, "little"), rounds=_CHACHA_ROUNDS)
    return np.random.Generator(chacha)


def secret_fingerprint(secret: bytes) -> str:
    """First 16 hex digits of SHA-256 over a domain-separated copy of the secret."""
    _check_secret(secret)
    return hashlib.sha256(_FINGERPRINT_DOMAIN + secret).hexdigest()[:16]


def load_or_create_secret(path: Path | None, env_var: str | None, private_dir: Path) -> bytes:
    """The run secret: from ``env_var`` if set, else from ``path``, else ``private_dir/run_secret``.

    The last is created (32 bytes from ``secrets.token_bytes``, hex-encoded, mode 0o600, in a
    directory created with mode 0o700) unless it already exists, in which case a resumed run
    reuses it. A secret file readable by group or others is refused.
    """
    if env_var is not None and env_var in os.environ:
        return _parse_hex(os.environ[env_var], f"environment variable {env_var}")
    if path is not None:
        return _read_secret_file(path)
    return _read_or_create_private_secret(private_dir / SECRET_FILE_NAME)


def _check_secret(secret: object) -> None:
    if not isinstance(secret, bytes):
        raise TypeError(f"the run secret must be bytes, got {type(secret).__name__}")
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"the run secret must be {SECRET_BYTES} bytes, got {len(secret)}")


def _encode_key(key: tuple[str | int, ...]) -> bytes:
    """An injective encoding of the key tuple: count, then per part a type tag, length and bytes."""
    encoded = [_KEY_DOMAIN, len(key).to_bytes(8, "big")]
    for part in key:
        if isinstance(part, str):
            tag, body = b"s", part.encode("utf-8")
        elif isinstance(part, int | np.integer) and not isinstance(part, bool | np.bool_):
            tag, body = b"i", str(int(part)).encode("ascii")
        else:
            raise TypeError(f"key parts must be str or int, got {type(part).__name__} {part!r}")
        encoded += [tag, len(body).to_bytes(8, "big"), body]
    return b"".join(encoded)


def _parse_hex(text: str, source: str) -> bytes:
    """Decode 64 hex characters (one trailing newline allowed); the message never echoes them."""
    body = text.removesuffix("\n")
    if len(body) != 2 * SECRET_BYTES:
        raise ValueError(
            f"{source} must hold {2 * SECRET_BYTES} hex characters, found {len(body)} characters"
        )
    if not all(character in string.hexdigits for character in body):
        raise ValueError(f"{source} must hold hex characters only")
    return bytes.fromhex(body)


def _read_secret_file(path: Path) -> bytes:
    status = path.stat()
    if stat.S_ISDIR(status.st_mode):
        raise ValueError(f"secret file {path} is a directory, not a file")
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(f"secret file {path} is not a regular file")
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        raise PermissionError(
            f"refusing to read the run secret {path}: its mode {mode:#o} lets group or others "
            f"read it; run `chmod 600 {path}`"
        )
    text = path.read_bytes().decode("ascii", errors="replace")
    return _parse_hex(text, f"secret file {path}")


def _read_or_create_private_secret(secret_path: Path) -> bytes:
    """Reuse ``secret_path`` if present, else write a fresh secret there with mode 0o600.

    The secret is written to a private temporary file and linked into place, so the file appears
    complete or not at all, and a concurrent creator's secret wins over ours rather than mixing.
    """
    if secret_path.exists():
        return _read_secret_file(secret_path)
    secret_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = secrets.token_bytes(SECRET_BYTES)
    fd, temporary = tempfile.mkstemp(dir=secret_path.parent, prefix=f".{SECRET_FILE_NAME}.")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:  # mkstemp made it mode 0o600
            handle.write(secret.hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(temporary, secret_path)
    except FileExistsError:
        return _read_secret_file(secret_path)
    finally:
        os.unlink(temporary)
    return secret
