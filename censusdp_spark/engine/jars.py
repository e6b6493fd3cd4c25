"""Delta Lake's jars: which a classic session loads, where it finds them, and how
``censusdp jars`` fetches them from Maven Central.

A local session loads them from the first of these places that holds them:

1. ``$CENSUSDP_JARS``, when set; a folder named on purpose (the project image names its own)
   that holds none is refused, not passed over;
2. the source tree's ``jars/`` (``scripts/setup.sh`` fills it), when the package runs from a
   checkout;
3. the per-user cache ``$XDG_CACHE_HOME/censusdp/jars`` (else ``~/.cache/censusdp/jars``),
   which ``censusdp jars`` fills: where an installed copy finds them. Only the pinned version's
   jars count there, as the cache outlives upgrades of the package.

``censusdp jars`` downloads the two artifacts of :data:`DELTA_VERSION` with ``urllib``, checks
each against the SHA-1 Maven Central publishes beside it, and moves it into place only then
(a temporary file renamed), so a folder never holds a partial or unverified jar. It records the
checked SHA-1 beside each jar, as Maven's own repository does, so a second run verifies what is
there offline and fetches nothing. This module imports no Spark: ``censusdp jars`` starts at once.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from censusdp_spark.model.errors import SetupError

DELTA_VERSION = "4.0.0"
"""The Delta Lake release, the one place it is pinned: Delta 4.0.x is built for Spark 4.0.x and
Scala 2.13 (``pyproject.toml`` pins pyspark 4.0.1 and the delta-spark 4.0.0 Python package;
``scripts/setup.sh`` fetches the same two artifacts with Maven)."""
SCALA_VERSION = "2.13"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MAVEN_URL_ENV = "CENSUSDP_MAVEN_URL"
"""A Maven repository to fetch from instead of Maven Central (a mirror, or a ``file://`` folder
laid out like one)."""
JARS_ENV = "CENSUSDP_JARS"
"""The folder a local session loads the jars from, when set."""
PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The source tree, when the package runs from a checkout; else whatever holds the package."""
FETCH_TIMEOUT_S = 60.0
CHUNK_BYTES = 1 << 20
SHA1 = re.compile(r"[0-9a-f]{40}")
NO_JARS_HINT = (
    "fetch them with `censusdp jars`, or name a folder holding them in $CENSUSDP_JARS"
    " (in a checkout scripts/setup.sh fetches them; in a container, build the project image,"
    " `docker compose build`, whose Dockerfile fetches them)"
)
"""What a user with no jars must run; the image's Dockerfile runs ``scripts/setup.sh``."""


@dataclass(frozen=True)
class Artifact:
    """One jar of Maven Central, by its coordinates."""

    group: str
    name: str
    version: str

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}.jar"

    @property
    def repository_path(self) -> str:
        """Where a Maven repository keeps the jar, below its root (the ``.sha1`` beside it)."""
        return "/".join([*self.group.split("."), self.name, self.version, self.file_name])

    def url(self, repository: str) -> str:
        """The jar's URL in the Maven repository at ``repository``."""
        return f"{repository.rstrip('/')}/{self.repository_path}"


DELTA_ARTIFACTS = (
    Artifact("io.delta", f"delta-spark_{SCALA_VERSION}", DELTA_VERSION),
    Artifact("io.delta", "delta-storage", DELTA_VERSION),
)


def cache_dir() -> Path:
    """The per-user folder ``censusdp jars`` fills by default and sessions look in last."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "censusdp" / "jars"


def checkout_jars() -> Path | None:
    """The source tree's ``jars/`` when the package runs from a checkout of this project (not
    from an installed copy), else None."""
    try:
        project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("project", {}).get("name") != "censusdp-spark":
        return None
    return PROJECT_ROOT / "jars"


def _found_in(folder: Path) -> list[Path]:
    """The Delta jars in a folder filled by hand, Maven or the image (any version, as named)."""
    return sorted([*folder.glob("delta-spark_*.jar"), *folder.glob("delta-storage-*.jar")])


def _cached(folder: Path) -> list[Path]:
    """The pinned jars in the cache, all or none: the cache may keep another version's too."""
    jars = [folder / artifact.file_name for artifact in DELTA_ARTIFACTS]
    return jars if all(jar.is_file() for jar in jars) else []


def delta_jars() -> list[Path]:
    """The jars a classic session needs for Delta (delta-spark and delta-storage), from the first
    place of the module's list that holds them; a :class:`SetupError` naming every place looked
    in when none does."""
    named = os.environ.get(JARS_ENV)
    if named:
        jars = _found_in(Path(named))
        if not jars:
            raise SetupError(f"no Delta Lake jars in {named} (${JARS_ENV}): {NO_JARS_HINT}")
        return jars
    looked: list[Path] = []
    checkout = checkout_jars()
    if checkout is not None:
        jars = _found_in(checkout)
        if jars:
            return jars
        looked.append(checkout)
    cache = cache_dir()
    jars = _cached(cache)
    if jars:
        return jars
    looked.append(cache)
    places = " or ".join(str(place) for place in looked)
    raise SetupError(f"no Delta Lake {DELTA_VERSION} jars in {places}: {NO_JARS_HINT}")


@dataclass(frozen=True)
class Fetched:
    """One jar ``censusdp jars`` saw to: where it is, its SHA-1, whether it was downloaded now."""

    path: Path
    sha1: str
    url: str
    downloaded: bool


def repository_url() -> str:
    """The Maven repository fetched from: ``$CENSUSDP_MAVEN_URL``, else Maven Central."""
    return os.environ.get(MAVEN_URL_ENV) or MAVEN_CENTRAL


def fetch_delta_jars(folder: Path, repository: str | None = None) -> list[Fetched]:
    """Put the pinned Delta jars in ``folder``, each checked against its published SHA-1; jars
    already there and matching are kept (no download). Raises :class:`SetupError` in one line
    naming the URL when a download fails or a checksum differs; nothing unverified is left."""
    repository = repository or repository_url()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return [_fetch(artifact, folder, repository) for artifact in DELTA_ARTIFACTS]
    except OSError as err:  # the folder's: the network's are reported by _chunks
        raise SetupError(f"cannot write the jars into {folder}: {err}") from None


def _fetch(artifact: Artifact, folder: Path, repository: str) -> Fetched:
    url = artifact.url(repository)
    jar = folder / artifact.file_name
    recorded = jar.with_name(jar.name + ".sha1")
    if jar.is_file() and recorded.is_file():
        known = _parse_sha1(recorded.read_text(), str(recorded))
        if _sha1_of(jar) == known:
            return Fetched(jar, known, url, downloaded=False)
    published = b"".join(_chunks(url + ".sha1")).decode("ascii", "replace")
    expected = _parse_sha1(published, url + ".sha1")
    # A jar already there that matches (scripts/setup.sh's, say) is kept as it is.
    downloaded = not (jar.is_file() and _sha1_of(jar) == expected)
    if downloaded:
        with _replacing(jar) as out:
            digest = hashlib.sha1(usedforsecurity=False)
            for chunk in _chunks(url):
                digest.update(chunk)
                out.write(chunk)
            if digest.hexdigest() != expected:
                raise SetupError(
                    f"{url}: SHA-1 {digest.hexdigest()} differs from the published {expected}"
                    f" ({url}.sha1); not kept"
                )
    with _replacing(recorded) as out:
        out.write(f"{expected}\n".encode())
    return Fetched(jar, expected, url, downloaded)


def _parse_sha1(text: str, source: str) -> str:
    """The checksum of a ``.sha1`` file (Maven's hold the hex digest, some a file name after)."""
    words = text.split()
    digest = words[0].lower() if words else ""
    if not SHA1.fullmatch(digest):
        raise SetupError(f"{source}: not a SHA-1 checksum ({text.strip()[:60]!r})")
    return digest


def _chunks(url: str) -> Iterator[bytes]:
    """The body of ``url``, a chunk at a time; failing to open or read it is one line naming
    it."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            while chunk := response.read(CHUNK_BYTES):
                yield chunk
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        raise SetupError(f"cannot fetch {url}: {_reason(err)}") from None


def _reason(err: Exception) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return str(err.reason)
    return str(err) or type(err).__name__


@contextmanager
def _replacing(target: Path) -> Iterator[BinaryIO]:
    """A file beside ``target`` that replaces it (a rename) when the block ends, and is removed
    instead when the block raises: ``target`` is never partial."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.part")
    # Created as open() would (mode 0666 less the umask): a shared --dir stays readable.
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with os.fdopen(handle, "wb") as out:
            yield out
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _sha1_of(path: Path) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
