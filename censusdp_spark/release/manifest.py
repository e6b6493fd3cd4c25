"""The run manifest: what was run, with which budget, versions and timings; written last.

It carries no secret (only a fingerprint that cannot reveal it) and no true count.
"""

from __future__ import annotations

import json
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in (
        "censusdp-spark",
        "pyspark",
        "delta-spark",
        "numpy",
        "scipy",
        "pandas",
        "pyarrow",
        "randomgen",
    ):
        out[pkg] = version(pkg)
    return out


def write_manifest(path: Path, content: dict[str, Any]) -> None:
    """Atomic write: a reader sees either no manifest or the whole one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content, indent=2, sort_keys=False, default=str))
    os.replace(tmp, path)
