"""Sizes of memory and disk: Spark-style settings read, sizes written, the machine's memory."""

from __future__ import annotations

import os
import re
from pathlib import Path

_SUFFIXES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")


def parse_memory(text: str, setting: str) -> int:
    """Bytes of a memory setting like Spark's (``512m``, ``4g``; ``4GiB`` and ``4gb`` too);
    ``ValueError`` naming ``setting`` otherwise."""
    found = _MEMORY.match(text)
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"{setting}={text!r}: a memory size like 512m or 4g is expected")
    return int(float(found.group(1)) * _SUFFIXES[found.group(2).lower()])


def size_text(size: float) -> str:
    """``1.5 GiB``, or ``80 MiB`` below a tenth of a GiB."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 / 10 else f"{size / 2**20:.0f} MiB"


def physical_memory() -> int:
    """Bytes of memory this machine (or its cgroup's limit, when lower) gives its processes."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = _CGROUP_LIMIT.read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total
