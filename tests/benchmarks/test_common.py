"""benchmarks/_common.py, the plumbing every benchmark script shares: the note a report opens
with, the report writer, the fixed secrets, the rows an earlier invocation printed, and work run
in a fresh process."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import _common as common
import pytest


def test_the_note_gives_the_commands_then_date_machine_extra_load_and_versions():
    note = common.command_note(
        ["a.py --x 1", "a.py --append"],
        master="local[2]",
        extra=("3 secrets",),
        load=True,
        packages=("numpy",),
    )
    pattern = (
        r"Command: `a\.py --x 1`; then `a\.py --append` \(\d{4}-\d\d-\d\d \d\d:\d\d UTC, "
        r"local\[2\] on \d+ CPUs, 3 secrets, load average \d+\.\d at the end, "
        r"Python 3\.\d+\.\d+, numpy \d[\w.]*\)"
    )
    assert re.fullmatch(pattern, note), note
    assert re.fullmatch(r"Command: `b` \(.* UTC, \d+ CPUs\)", common.command_note("b"))


def test_a_report_ends_with_one_newline_in_a_folder_made_for_it(tmp_path: Path):
    path = tmp_path / "results" / "r.md"
    assert common.write_report(path, ["# R", "", "| a |"]) == "# R\n\n| a |\n"
    assert common.write_report(path, "text\n\n") == "text\n\n"  # never trimmed
    assert path.read_text() == "text\n\n"


def test_a_secret_is_fixed_by_its_label_and_readable_by_its_owner_alone(tmp_path: Path):
    assert common.secret_hex("bench 1") == common.secret_hex("bench 1") != common.secret_hex("2")
    path = common.write_secret(tmp_path / "s.hex", common.secret_hex("bench 1"))
    assert len(bytes.fromhex(path.read_text())) == 32
    assert path.stat().st_mode & 0o777 == 0o600


def test_earlier_rows_are_the_json_lines_of_what_was_printed(tmp_path: Path):
    printed = tmp_path / "rows.jsonl"
    printed.write_text('progress 10 s\n{"fraction": 0.01}\n\n{"fraction": 0.1}\n')
    assert common.previous_rows(printed) == [{"fraction": 0.01}, {"fraction": 0.1}]
    assert common.previous_rows(None) == []


def test_work_in_a_fresh_process_returns_raises_or_times_out():
    assert common.in_fresh_process(os.getpid) != os.getpid()
    with pytest.raises(ValueError, match="inside"):
        common.in_fresh_process(lambda: int("inside"))
    started = time.perf_counter()
    assert common.in_fresh_process(lambda: time.sleep(30), timeout=0.5) is None
    assert time.perf_counter() - started < 10
