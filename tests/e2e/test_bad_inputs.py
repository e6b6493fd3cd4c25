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
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from censusdp_spark.io.pl94_layout import SEGMENTS, LegacyFiles
from tests.helpers.blocks import GOOD, HEADER, adults, bad_row
from tests.helpers.cli import censusdp, error_lines
from tests.helpers.group_sizes import huge_n_config
from tests.helpers.pl94 import SAMPLE, copy_of_sample, edit_line, field, lines, plus, to
from tests.helpers.pums import duplicate_person, real_tables

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
        path.write_text("e4" * 32 + "\n")
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


def pgsr_huge_n(folder: Path, output: Path) -> list[str]:
    return [
        *("pgsr", "--config", str(huge_n_config(folder)), "--output", str(output)),
        *("--secret-file", str(secret(folder)), "--master", "local[1]"),
    ]


def synth_duplicate_person(folder: Path, output: Path) -> list[str]:
    households, persons = duplicate_person(*real_tables(40))
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


LEGACY = "pl94"  # the folder of a case's legacy files


def pl94(edit: Callable[[LegacyFiles], None]) -> Callable[[Path, Path], list[str]]:
    """TopDown on an edited copy of the shipped P.L. 94-171 legacy files."""

    def make(folder: Path, output: Path) -> list[str]:
        (folder / LEGACY).mkdir()  # beside the output: never inside an input folder
        files = copy_of_sample(folder / LEGACY)
        edit(files)
        return [
            *("topdown", "--config", str(ROOT / "conf" / "pl94_e2e_providence.toml")),
            *("--input", str(folder / LEGACY), "--output", str(output)),
            *("--secret-file", str(secret(folder)), "--master", "local[1]"),
        ]

    return make


def legacy_edit(
    n: int, line: int, changes: dict[str, Callable[[str], str]]
) -> Callable[[LegacyFiles], None]:
    return lambda files: edit_line(n, line, changes)(files, files.folder)


WHITE_ADULT = (
    *("P0010001", "P0010002", "P0010003", "P0020001", "P0020003", "P0020004", "P0020005"),
    *("P0030001", "P0030002", "P0030003", "P0040001", "P0040003", "P0040004", "P0040005"),
)
"""The cells of P1-P4 that count a white, non-Hispanic adult."""


def block_lines(files: LegacyFiles) -> list[int]:
    """The lines (1-based) of the blocks with housing units and no group quarters."""
    header = [ln.split("|") for ln in lines(files.geoheader)]
    units = [ln.split("|")[field(2, "H0010001")] for ln in lines(files.file(2))]
    gq = [ln.split("|")[field(3, "P0050001")] for ln in lines(files.file(3))]
    return [
        i + 1
        for i, fields in enumerate(header)
        if fields[field(0, "SUMLEV")] == "750" and int(units[i]) > 0 and int(gq[i]) == 0
    ]


def add_white_adults(files: LegacyFiles, line: int, n: int) -> None:
    """``n`` more white non-Hispanic adults in the block on ``line``, every table kept whole."""
    edit_line(0, line, {"POP100": plus(n)})(files, files.folder)
    for segment in (1, 2):
        cells = {c: plus(n) for c in WHITE_ADULT if c in SEGMENTS[segment - 1]}
        edit_line(segment, line, cells)(files, files.folder)


def pl94_total_above_max_count(files: LegacyFiles) -> None:
    for line in block_lines(files)[:2]:
        add_white_adults(files, line, 600_000_000)


BLOCKS = in_folder("blocks.csv")
CASES = {
    # rows that would otherwise be silently accepted (wrong numbers released) or end in a traceback
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
    # a config whose N would make a mechanism exceed memory
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
        in_folder(f"{LEGACY}/ri000012018_2020Style.pl"),
        "line 3, column P0020001: the total of P2 must equal that of P1 (P0010001)",
    ),
    "pl94-segment-record-not-in-the-geoheader": Case(
        pl94(legacy_edit(3, 10, {"LOGRECNO": to("100")})),
        in_folder(f"{LEGACY}/ri000032018_2020Style.pl"),
        "line 10, column LOGRECNO: logical record 100 is not in the geoheader",
    ),
    "input-total-above-max-count": Case(
        topdown([adults(GOOD[0], 600_000_000), adults(GOOD[1], 600_000_000), GOOD[2]]),
        BLOCKS,
        "rows: the counts total above MAX_COUNT = 1_000_000_000",
    ),
    "pl94-blocks-total-above-max-count": Case(
        pl94(pl94_total_above_max_count),
        in_folder(f"{LEGACY}/ri000012018_2020Style.pl"),
        "column P0010001: the blocks' total above MAX_COUNT = 1_000_000_000",
    ),
    "missing-secret-file": Case(without_secret, in_folder("secret.hex"), "secret file not found"),
    "output-is-a-file": Case(onto_a_file, in_folder("out"), "is a file"),
}


def refusal_lines(stderr: str) -> list[str]:
    """The refusal's own lines: stderr without the stage lines and Spark's start-up log."""
    return [ln for ln in error_lines(stderr) if not SPARK_LOG.match(ln)]


def check_refusal(name: str, folder: Path, code: int, stderr: str) -> None:
    """Exit 2, one line of its own naming the case's file and rule, no traceback, nothing
    written."""
    case, output = CASES[name], folder / "out"
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = refusal_lines(stderr)
    assert len(lines) == 1, lines
    assert str(case.file(folder)) in lines[0] and case.rule in lines[0], lines[0]
    if name == "output-is-a-file":
        assert output.read_text() == "not a folder"
    else:
        assert not output.exists() or not any(output.iterdir())
    assert not (folder / "out.private").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["unquoted-comma-in-vtd", "synth-person-listed-twice"])
def test_the_installed_command_refuses_it_the_same_way(name, tmp_path):
    """The same promise from the installed ``censusdp`` entry point, in its own process."""
    run = censusdp(*CASES[name].make(tmp_path, tmp_path / "out"))
    check_refusal(name, tmp_path, run.returncode, run.stderr)


def confidential_twin(folder: Path) -> None:
    """The case's input with other confidential counts: the same blocks, housing units and
    facilities (and for group sizes the same households), one person more in a block (or a
    household of one grown to two, or a person of the other sex)."""
    if (folder / "blocks.csv").exists():
        path = folder / "blocks.csv"
        rows = lines(path)
        if len(rows) > 1 and all(f.isdigit() for f in rows[-1].split(",")[4:]):
            rows[-1] = adults(rows[-1], 1)
        path.write_text("\n".join(rows) + "\n")
    elif (folder / "sizes.csv").exists():
        path = folder / "sizes.csv"
        rows = lines(path)
        fields = rows[1].split(",")
        fields[4], fields[5] = str(int(fields[4]) - 1), str(int(fields[5]) + 1)
        path.write_text("\n".join([rows[0], ",".join(fields), *rows[2:]]) + "\n")
    elif (folder / "households.csv").exists():
        path = folder / "households.csv"
        path.write_text(path.read_text().replace("01,a,2", "01,a,3"))
    elif (folder / "persons.csv").exists():
        path = folder / "persons.csv"
        rows = lines(path)
        header = rows[0].split(",")
        fields = rows[-1].split(",")
        sex = header.index("SEX")
        fields[sex] = "1" if fields[sex] == "2" else "2"
        path.write_text("\n".join([*rows[:-1], ",".join(fields)]) + "\n")
    elif (folder / LEGACY).is_dir():
        files = LegacyFiles(folder / LEGACY, SAMPLE.state, SAMPLE.vintage)
        add_white_adults(files, block_lines(files)[-1], 1)


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_line_naming_file_and_rule_and_writes_nothing_nor_any_count(
    name, spark, tmp_path, capsys
):
    """Every case through the command line's own ``main``, in this process's Spark session;
    then on a twin of its input with other confidential counts (same geography, housing units
    and facilities), in the same folder: refused in the same words, so every message is a
    function of the public facts alone and no refusal can carry a count of people."""
    folder = tmp_path / "case"
    folder.mkdir()
    code = main(CASES[name].make(folder, folder / "out"))
    said = capsys.readouterr().err
    check_refusal(name, folder, code, said)
    shutil.rmtree(folder)
    folder.mkdir()
    args = CASES[name].make(folder, folder / "out")
    confidential_twin(folder)
    main(args)
    assert refusal_lines(capsys.readouterr().err) == refusal_lines(said)
