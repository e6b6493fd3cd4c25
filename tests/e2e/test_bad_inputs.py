"""The bad-input catalogue: every refusal the command line makes at the door keeps the same
promise. Exit code 2; on stderr exactly
one line of its own, naming the file and the rule (Spark's start-up log lines aside), no
traceback; nothing under ``--output`` and no private folder (``<output>.private``) left behind.

Every case runs through the command line's ``main`` in this process's Spark session; two of
them also through the installed ``censusdp`` in a JVM subprocess of its own (``slow``: about
a minute each here). The per-rule tests beside each reader (``tests/topdown/
test_readers.py``, ``test_pgsr_job.py``, ``test_synth_job.py``) check the rules in process."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.io.pl94_layout import LegacyFiles
from tests.e2e.test_faults import censusdp
from tests.e2e.test_secret_policy import error_lines
from tests.e2e.test_synth_job import _duplicate_person, real_tables
from tests.io.test_pl94 import copy_of_sample, edit_line, plus, to
from tests.topdown.test_readers import GOOD, HEADER, bad_row

ROOT = Path(__file__).resolve().parents[2]
CALM = ROOT / "data" / "calm" / "calm_taz_household_sizes.csv"
SYNTH = ROOT / "conf" / "synth_pums_reduced.toml"

SPARK_LOG = re.compile(
    r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO) "  # log4j lines below ERROR
    r"|WARNING: Using incubator modules"
    r"|Using Spark's default log4j profile"
    r"|Setting default log level"
    r"|To adjust logging level"
    r"|Setting Spark log level)"
)


@dataclass(frozen=True)
class Case:
    """A bad input: ``make(folder, output)`` writes its files and returns the command's
    arguments; the error line must name ``file(folder)`` and contain ``rule``."""

    make: Callable[[Path, Path], list[str]]
    file: Callable[[Path], Path]
    rule: str


def blocks(folder: Path, rows: list[str], header: str = HEADER) -> Path:
    path = folder / "blocks.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def topdown(rows: list[str], header: str = HEADER) -> Callable[[Path, Path], list[str]]:
    def make(folder: Path, output: Path) -> list[str]:
        return [
            *("topdown", "--config", str(ROOT / "conf" / "ri_2010_demo.toml")),
            *("--input", str(blocks(folder, rows, header)), "--output", str(output)),
            *("--secret-file", str(secret(folder)), "--master", "local[1]"),
        ]

    return make


def secret(folder: Path) -> Path:
    path = folder / "secret.hex"
    if not path.exists():
        path.write_text("7a" * 32 + "\n")
        path.chmod(0o600)
    return path


def shifted_vtd() -> list[str]:
    """Block ...001 with vtd ``07,B`` unquoted: its 17 people would be read as 34."""
    parts = GOOD[1].split(",")
    return [GOOD[0], ",".join([*parts[:3], "07,B", *parts[4:]]), GOOD[2]]


def without_secret(folder: Path, output: Path) -> list[str]:
    args = topdown(GOOD)(folder, output)
    secret(folder).unlink()
    return args


def onto_a_file(folder: Path, output: Path) -> list[str]:
    output.write_text("not a folder")
    return topdown(GOOD)(folder, output)


def pgsr(edit: Callable[[list[str]], list[str]]) -> Callable[[Path, Path], list[str]]:
    def make(folder: Path, output: Path) -> list[str]:
        path = folder / "sizes.csv"
        path.write_text("\n".join(edit(CALM.read_text().splitlines()[:6])) + "\n")
        return [
            *("pgsr", "--config", str(ROOT / "conf" / "pgsr_calm.toml"), "--mechanism", "dp"),
            *("--input", str(path), "--output", str(output), "--master", "local[1]"),
            *("--secret-file", str(secret(folder))),
        ]

    return make


HUGE_N = """[run]
name = "huge_n"
private_dir = "{private}"
[geography]
levels = [{{ name = "all", digits = 0 }}, {{ name = "block", digits = 2 }}]
spine = {{ path = "{spine}", geocode = "block" }}
[groups]
max_size = 100_000_000
topcode = true
[input]
path = "{households}"
layout = "households"
geocode = "block"
household = "hh"
size = "n"
[budget]
epsilon = "1"
"""


def huge_n_config(folder: Path) -> Path:
    """A valid group-size config and input whose N = 10^8 sizes no worker could hold."""
    (folder / "households.csv").write_text("block,hh,n\n01,a,2\n02,b,5\n")
    (folder / "spine.csv").write_text("block\n01\n02\n03\n")
    config = folder / "huge_n.toml"
    config.write_text(
        HUGE_N.format(
            private=folder / "private",
            spine=folder / "spine.csv",
            households=folder / "households.csv",
        )
    )
    return config


def pgsr_huge_n(folder: Path, output: Path) -> list[str]:
    return [
        *("pgsr", "--config", str(huge_n_config(folder)), "--output", str(output)),
        *("--secret-file", str(secret(folder)), "--master", "local[1]"),
    ]


def synth_duplicate_person(folder: Path, output: Path) -> list[str]:
    households, persons = _duplicate_person(*real_tables(40))
    households.to_csv(folder / "households.csv", index=False)
    persons.to_csv(folder / "persons.csv", index=False)
    config = folder / "synth.toml"
    config.write_text(
        SYNTH.read_text()
        .replace('"data/pums/persons.csv"', f'"{folder / "persons.csv"}"')
        .replace('"data/pums/households.csv"', f'"{folder / "households.csv"}"')
    )
    return [
        *("synth", "--config", str(config), "--method", "independent", "--rho", "1/2"),
        *("--output", str(output), "--secret-file", str(secret(folder))),
        *("--master", "local[1]"),
    ]


def in_folder(name: str) -> Callable[[Path], Path]:
    return lambda folder: folder / name


def one_more_field(lines: list[str]) -> list[str]:
    return [*lines[:3], lines[3] + ",7", *lines[4:]]


def past_int64(lines: list[str]) -> list[str]:
    fields = lines[2].split(",")
    fields[4] = "99999999999999999999"  # HHSIZE1
    return [*lines[:2], ",".join(fields), *lines[3:]]


def pl94(edit: Callable[[LegacyFiles], None]) -> Callable[[Path, Path], list[str]]:
    """TopDown on an edited copy of the shipped P.L. 94-171 legacy files."""

    def make(folder: Path, output: Path) -> list[str]:
        files = copy_of_sample(folder)
        edit(files)
        return [
            *("topdown", "--config", str(ROOT / "conf" / "pl94_e2e_providence.toml")),
            *("--input", str(folder), "--output", str(output)),
            *("--secret-file", str(secret(folder)), "--master", "local[1]"),
        ]

    return make


def legacy_edit(
    n: int, line: int, changes: dict[str, Callable[[str], str]]
) -> Callable[[LegacyFiles], None]:
    return lambda files: edit_line(n, line, changes)(files, files.folder)


BLOCKS = in_folder("blocks.csv")
CASES = {
    # issue #18: silently accepted (wrong numbers released) or a traceback on main before
    "more-fields-than-the-header": Case(
        topdown([GOOD[0], GOOD[1] + ",0", GOOD[2]]),
        BLOCKS,
        "row 2: has more fields than the header's 22",
    ),
    "unquoted-comma-in-vtd": Case(
        topdown(shifted_vtd()), BLOCKS, "row 2: has more fields than the header's 22"
    ),
    "count-above-max-count": Case(
        topdown(bad_row(5, "1000000000017")),
        BLOCKS,
        "row 2, column pop_white: count above MAX_COUNT = 1_000_000_000",
    ),
    "count-past-int64": Case(
        topdown(bad_row(5, "99999999999999999999")),
        BLOCKS,
        "row 2, column pop_white: count above MAX_COUNT",
    ),
    "pgsr-more-fields-than-the-header": Case(
        pgsr(one_more_field), in_folder("sizes.csv"), "row 3: has more fields than the header's 8"
    ),
    "pgsr-count-past-int64": Case(
        pgsr(past_int64), in_folder("sizes.csv"), "row 2, column HHSIZE1: count above MAX_COUNT"
    ),
    # issue #17: a config whose N would make a mechanism exceed memory
    "pgsr-max-size-beyond-worker-memory": Case(
        pgsr_huge_n,
        in_folder("huge_n.toml"),
        "[groups] max_size = 100,000,000: the dp mechanism would need",
    ),
    "synth-person-listed-twice": Case(
        synth_duplicate_person, in_folder("persons.csv"), "column SERIALNO+SPORDER: person '2'"
    ),
    # refusals that already held: the catalogue keeps them holding
    "missing-column": Case(
        topdown([r.rsplit(",", 1)[0] for r in GOOD], HEADER.rsplit(",", 1)[0]),
        BLOCKS,
        "column vap_two: missing",
    ),
    "non-integer-count": Case(
        topdown(bad_row(5, "1.5")),
        BLOCKS,
        "row 2, column pop_white: count must be a non-negative integer",
    ),
    "bad-geocode": Case(
        topdown(bad_row(0, "4400103010010A1")),
        BLOCKS,
        "row 2, column GEOID: geocode must be exactly 15 digits",
    ),
    "pl94-p2-total-disagrees-with-p1": Case(
        pl94(
            legacy_edit(
                1, 3, dict.fromkeys(("P0020001", "P0020003", "P0020004", "P0020005"), plus(1))
            )
        ),
        in_folder("ri000012018_2020Style.pl"),
        "line 3, column P0020001: the total of P2 must equal that of P1 (P0010001)",
    ),
    "pl94-segment-record-not-in-the-geoheader": Case(
        pl94(legacy_edit(3, 10, {"LOGRECNO": to("100")})),
        in_folder("ri000032018_2020Style.pl"),
        "line 10, column LOGRECNO: logical record 100 is not in the geoheader",
    ),
    "missing-secret-file": Case(without_secret, in_folder("secret.hex"), "secret file not found"),
    "output-is-a-file": Case(onto_a_file, in_folder("out"), "is a file"),
}


def check_refusal(name: str, folder: Path, code: int, stderr: str) -> None:
    """Exit 2, one line of its own naming the case's file and rule, no traceback, nothing
    written."""
    case, output = CASES[name], folder / "out"
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in error_lines(stderr) if not SPARK_LOG.match(ln)]
    assert len(lines) == 1, lines
    assert str(case.file(folder)) in lines[0] and case.rule in lines[0], lines[0]
    if name == "output-is-a-file":
        assert output.read_text() == "not a folder"
    else:
        assert not output.exists() or not any(output.iterdir())
    assert not (folder / "out.private").exists()


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_line_naming_file_and_rule_and_writes_nothing(
    name, spark, tmp_path, capsys
):
    """Every case through the command line's own ``main``, in this process's Spark session."""
    code = main(CASES[name].make(tmp_path, tmp_path / "out"))
    check_refusal(name, tmp_path, code, capsys.readouterr().err)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["unquoted-comma-in-vtd", "synth-person-listed-twice"])
def test_the_installed_command_refuses_it_the_same_way(name, tmp_path):
    """The same promise from the installed ``censusdp`` entry point, in its own process."""
    run = censusdp(*CASES[name].make(tmp_path, tmp_path / "out"))
    check_refusal(name, tmp_path, run.returncode, run.stderr)
