"""The shipped P.L. 94-171 sample (the 2018 End-to-End files of Providence County, RI) and
edits of a copy of it, line by line and field by field."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from censusdp_spark.io.pl94_layout import GEOHEADER_FIELDS, RECORD_KEY, SEGMENTS, LegacyFiles

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = LegacyFiles(ROOT / "data" / "pl94_2018_e2e_providence_ri", "ri", "2018_2020Style")

Edit = Callable[[LegacyFiles, Path], None]
"""An edit of the copy of the sample in a folder."""


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def field(n: int, name: str) -> int:
    """Where field ``name`` is on a line of file ``n`` (0 the geoheader, 1-3 the segments)."""
    return (GEOHEADER_FIELDS if n == 0 else (*RECORD_KEY, *SEGMENTS[n - 1])).index(name)


def edit_line(n: int, line: int, changes: dict[str, Callable[[str], str]]) -> Edit:
    """Change fields of ``line`` (1-based) of file ``n``."""

    def edit(files: LegacyFiles, folder: Path) -> None:
        path = files.file(n)
        text = lines(path)
        fields = text[line - 1].split("|")
        for name, change in changes.items():
            fields[field(n, name)] = change(fields[field(n, name)])
        text[line - 1] = "|".join(fields)
        path.write_text("\n".join(text) + "\n")

    return edit


def plus(k: int) -> Callable[[str], str]:
    return lambda v: str(int(v) + k)


def to(value: str) -> Callable[[str], str]:
    return lambda _: value


def copy_of_sample(folder: Path) -> LegacyFiles:
    """The sample's files copied into ``folder`` (writable), as a file set there."""
    for path in SAMPLE.paths:
        shutil.copy(path, folder / path.name)
        (folder / path.name).chmod(0o644)
    return LegacyFiles(folder, SAMPLE.state, SAMPLE.vintage)
