"""The secret rule of the one release runner, for TopDown, group sizes and synth alike: a fresh
run without a secret draws new noise; a user secret makes one release of its stream family; the
run lock, resume and overwrite guards; the secret is made only after the input validated."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from censusdp_spark.cli import main
from tests.helpers.cli import error_lines
from tests.helpers.group_sizes import calm_one_tract
from tests.helpers.pl94 import copy_of_sample
from tests.helpers.release import with_method

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tract_csv(quick_tract) -> Path:
    """A real RI tract's blocks, with the quick TopDown config of these tests beside them and
    one tract of CALM, the group-size input of these tests (``calm_one_tract``)."""
    calm_one_tract(quick_tract[0].parent)
    return quick_tract[0]


def topdown_config(tract_csv: Path) -> Path:
    """The demo over three levels (``quick_demo_config``): every rule here is the runner's, not
    the hierarchy's, and each release costs half the demo's Spark jobs."""
    return tract_csv.parent / "quick_demo.toml"


def changed_copy(source: Path, folder: Path) -> Path:
    """``source`` with one count of its first data row raised by one (a neighbouring input)."""
    lines = source.read_text().splitlines()
    header = lines[0].split(",")
    column = next(i for i, name in enumerate(header) if name in ("pop_white", "HHSIZE1"))
    fields = lines[1].split(",")
    fields[column] = str(int(fields[column]) + 1)
    if "pop_white" in header:  # keep the block file's own totals consistent
        for name in ("pop", "vap_white", "vap"):
            i = header.index(name)
            fields[i] = str(int(fields[i]) + 1)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    target.write_text("\n".join([lines[0], ",".join(fields), *lines[2:]]) + "\n")
    return target


def release_args(kind: str, tract_csv: Path) -> list[str]:
    """The command of a quick release of each kind (input and output added by the caller)."""
    if kind == "topdown":
        return ["topdown", "--config", str(topdown_config(tract_csv))]
    if kind == "pgsr":
        return ["pgsr", "--config", str(ROOT / "conf" / "pgsr_calm.toml"), "--mechanism", "dp"]
    return [
        "synth",
        *("--config", str(ROOT / "conf" / "synth_pums_reduced.toml")),
        *("--method", "independent", "--rho", "1/2"),
    ]


def default_input(kind: str, tract_csv: Path) -> Path:
    """The quick tract for TopDown; for group sizes one tract of CALM (20 TAZs, every level):
    every rule here is the runner's, not the tree's size."""
    if kind == "topdown":
        return tract_csv
    return tract_csv.parent / "calm_one_tract.csv"


def run(kind: str, tract_csv: Path, out: Path, *extra: str, input: Path | None = None) -> int:
    args = [*release_args(kind, tract_csv), "--output", str(out), *extra]
    if kind != "synth":
        args += ["--input", str(input or default_input(kind, tract_csv))]
    return main(args)


def noisy_rows(spark, out: Path) -> set:
    """Every noisy measurement vector with its key (synth stores one row per cell: regrouped)."""
    frame = spark.read.format("delta").load(str(out / "noisy_measurements")).toPandas()
    if "cell" in frame.columns:
        frame = frame.sort_values("cell").groupby(["round", "workload"], as_index=False)
        frame = frame["noisy"].agg(tuple)
    return {tuple(str(v) for v in row) for row in frame.itertuples(index=False)}


def fingerprint(out: Path) -> str:
    return json.loads((out / "manifest.json").read_text())["secret_fingerprint"]


def make_secret(folder: Path, byte: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "secret.hex"
    path.write_text(byte * 32 + "\n")
    path.chmod(0o600)
    return path


def first_release_with_a_user_secret(
    kind: str, tract_csv: Path, folder: Path, request: pytest.FixtureRequest
) -> Path:
    """A secret that has made one release of ``kind`` on its default input: TopDown's is
    ``quick_secret``, bound by ``quick_reference`` (the same tract and config), so no release
    runs here; group sizes make theirs at ``folder/first``."""
    if kind == "topdown":
        request.getfixturevalue("quick_reference")
        return request.getfixturevalue("quick_secret")
    secret = make_secret(folder / "s", "7b")
    assert run(kind, tract_csv, folder / "first", "--secret-file", str(secret)) == 0
    return secret


KINDS = ["topdown", "pgsr", "synth"]


@dataclass(frozen=True)
class FreshPair:
    """Two fresh runs of one release kind without a secret; the first with ``--evaluate``."""

    evaluated: Path
    plain: Path
    evaluated_stdout: str


@pytest.fixture(scope="module")
def fresh_pairs(spark, tract_csv, tmp_path_factory) -> Callable[[str], FreshPair]:
    """Each kind's pair, made once for the module's tests of fresh runs (noise, overwrite,
    evaluation)."""
    made: dict[str, FreshPair] = {}

    def pair(kind: str) -> FreshPair:
        if kind not in made:
            folder = tmp_path_factory.mktemp(f"fresh_{kind}")
            evaluated, plain, stdout = folder / "a", folder / "b", io.StringIO()
            with contextlib.redirect_stdout(stdout):
                assert run(kind, tract_csv, evaluated, "--evaluate") == 0
            assert run(kind, tract_csv, plain) == 0
            made[kind] = FreshPair(evaluated, plain, stdout.getvalue())
        return made[kind]

    return pair


@pytest.mark.parametrize("kind", KINDS)
def test_two_fresh_runs_without_a_secret_never_share_noise(spark, kind, fresh_pairs):
    first, second = fresh_pairs(kind).evaluated, fresh_pairs(kind).plain
    assert fingerprint(first) != fingerprint(second)
    shared = noisy_rows(spark, first) & noisy_rows(spark, second)
    assert len(shared) < 0.5 * len(noisy_rows(spark, first)), kind  # only chance equalities


@pytest.mark.parametrize("kind", KINDS)
def test_overwriting_without_a_secret_draws_new_noise(kind, tract_csv, fresh_pairs, tmp_path):
    """A copy of a fresh release, overwritten by a fresh run at its new place."""
    out = tmp_path / "out"
    shutil.copytree(fresh_pairs(kind).plain, out)
    before = fingerprint(out)
    assert run(kind, tract_csv, out, "--overwrite") == 0
    assert fingerprint(out) != before


@pytest.mark.parametrize("kind", ["topdown", "pgsr"])
def test_a_user_secret_is_refused_for_a_second_release_on_changed_data(
    spark, kind, tract_csv, tmp_path, capsys, request
):
    secret = first_release_with_a_user_secret(kind, tract_csv, tmp_path, request)
    changed = changed_copy(default_input(kind, tract_csv), tmp_path / "changed")
    capsys.readouterr()
    second = tmp_path / "second"
    code = run(kind, tract_csv, second, "--secret-file", str(secret), input=changed)
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert len(err) == 1 and "already made" in err[0] and "new secret" in err[0], err
    assert not second.exists() or not any(second.iterdir())


def test_a_user_secret_is_refused_for_synth_at_another_budget(spark, tract_csv, tmp_path, capsys):
    secret = make_secret(tmp_path / "s", "7c")
    assert run("synth", tract_csv, tmp_path / "first", "--secret-file", str(secret)) == 0
    capsys.readouterr()
    args = [*release_args("synth", tract_csv), "--output", str(tmp_path / "second")]
    args[args.index("1/2")] = "1/3"
    assert main([*args, "--secret-file", str(secret)]) == 2
    assert "already made a synth/independent release" in capsys.readouterr().err
    assert not (tmp_path / "second").exists()


def test_the_same_measurement_again_and_another_estimation_reuse_a_user_secret(
    spark, tract_csv, quick_reference, quick_secret, tmp_path
):
    """Same data, same noise: a second identical release (or another estimation of the same
    noisy measurements) reveals nothing new and is allowed."""
    first, again = quick_reference, tmp_path / "again"
    assert run("topdown", tract_csv, again, "--secret-file", str(quick_secret)) == 0
    assert noisy_rows(spark, first) == noisy_rows(spark, again)


def test_reuse_secret_is_an_experiment_marked_not_for_release(
    spark, tract_csv, quick_reference, quick_secret, tmp_path, capsys
):
    """``quick_secret`` made ``quick_reference`` of the unchanged tract."""
    changed = changed_copy(tract_csv, tmp_path / "changed")
    out = tmp_path / "experiment"
    reuse = ["--secret-file", str(quick_secret), "--reuse-secret"]
    assert run("topdown", tract_csv, out, *reuse, input=changed) == 0
    assert json.loads((out / "manifest.json").read_text())["for_release"] is False
    assert "NOT FOR RELEASE" in capsys.readouterr().out


def test_resume_refuses_an_input_changed_at_the_same_path(spark, tract_csv, tmp_path, capsys):
    data = tmp_path / "data" / "tract.csv"
    data.parent.mkdir()
    data.write_text(tract_csv.read_text())
    out = tmp_path / "out"
    assert run("topdown", tract_csv, out, input=data) == 0
    data.write_text(changed_copy(tract_csv, tmp_path / "changed").read_text())
    capsys.readouterr()
    assert run("topdown", tract_csv, out, "--resume", input=data) == 2
    assert "input or config changed" in capsys.readouterr().err


def test_a_run_holding_the_lock_keeps_a_second_run_out(spark, tract_csv, tmp_path, capsys):
    out = tmp_path / "out"
    private = tmp_path / "out.private"
    private.mkdir(mode=0o700)
    with open(private / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert run("topdown", tract_csv, out) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "holds this run's lock" in err[0]
    assert not out.exists()
    assert sorted(p.name for p in private.iterdir()) == ["lock"]  # no secret, no state


def test_overwrite_replaces_only_a_folder_this_system_wrote(spark, tract_csv, tmp_path, capsys):
    out = tmp_path / "somebody_elses"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    assert run("topdown", tract_csv, out, "--overwrite") == 2
    assert "written by censusdp" in capsys.readouterr().err
    assert (out / "thesis.tex").read_text() == "keep me"


@pytest.mark.parametrize("kind", ["topdown", "pgsr"])
def test_bad_input_leaves_no_secret_behind(spark, kind, tract_csv, tmp_path):
    bad = tmp_path / "bad" / "input.csv"
    bad.parent.mkdir()
    source = default_input(kind, tract_csv).read_text().splitlines()
    bad.write_text("\n".join([source[0], source[1].replace(",", ",-", 5)]) + "\n")
    out = tmp_path / "out"
    assert run(kind, tract_csv, out, input=bad) == 2
    private = tmp_path / "out.private"
    assert not (private / "run_secret").exists() and not (private / "state.json").exists()
    assert not out.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_an_output_that_is_a_file_is_refused_in_one_line(spark, kind, tract_csv, tmp_path, capsys):
    out = tmp_path / "a_file"
    out.write_text("not a folder")
    assert run(kind, tract_csv, out) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "is a file" in err[0], err
    assert out.read_text() == "not a folder"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("problem", ["missing", "group_readable", "a_directory"])
def test_an_unusable_secret_file_is_one_line_and_writes_nothing(
    spark, kind, problem, tract_csv, tmp_path, capsys
):
    secret = make_secret(tmp_path / "s", "6f")
    if problem == "missing":
        secret.unlink()
    elif problem == "group_readable":
        secret.chmod(0o640)
    else:
        secret.unlink()
        secret.mkdir(mode=0o700)
    out = tmp_path / "out"
    assert run(kind, tract_csv, out, "--secret-file", str(secret)) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and str(secret) in err[0], err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("kind", KINDS)
def test_evaluation_is_written_beside_the_release_never_inside_it(kind, fresh_pairs):
    fresh = fresh_pairs(kind)
    out = fresh.evaluated
    evaluation = out.parent / "a.evaluation"
    assert (evaluation / "table" / "_delta_log").is_dir() and (evaluation / "errors.csv").exists()
    marker = json.loads((evaluation / ".censusdp-evaluation").read_text())
    assert marker["evaluates"] == str(out) and "never for release" in marker["note"]
    assert str(evaluation) in fresh.evaluated_stdout  # the summary says where it went
    manifest = json.loads((out / "manifest.json").read_text())
    assert not any("evaluation" in name for name in [*manifest, *manifest["tables"]]), manifest
    assert not any("evaluation" in p.name or p.name == "errors.csv" for p in out.rglob("*"))


def test_overwrite_replaces_the_evaluation_of_the_release_it_replaces(spark, tract_csv, tmp_path):
    out, evaluation = tmp_path / "out", tmp_path / "out.evaluation"
    assert run("topdown", tract_csv, out, "--evaluate") == 0
    stale = evaluation / "errors.csv"
    stale.write_text("stale")
    assert run("topdown", tract_csv, out, "--evaluate") == 2  # a fresh run needs --overwrite
    assert run("topdown", tract_csv, out, "--evaluate", "--overwrite") == 0
    assert stale.read_text() != "stale"
    # A new release at this output without --evaluate leaves no evaluation of the old one.
    assert run("topdown", tract_csv, out, "--overwrite") == 0
    assert not evaluation.exists()


def test_an_evaluation_folder_censusdp_did_not_write_is_never_touched(
    spark, tract_csv, tmp_path, capsys
):
    out, theirs = tmp_path / "out", tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me")
    inside = ["--evaluate", "--evaluation-output", str(out / "eval")]
    assert run("topdown", tract_csv, out, *inside) == 2
    assert "must not be inside the release folder" in capsys.readouterr().err
    code = run(
        "topdown", tract_csv, out, "--evaluate", "--overwrite", "--evaluation-output", str(theirs)
    )
    err = error_lines(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and "did not write" in err[0], err
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"] and not out.exists()


def listing(folder: Path) -> dict[str, list[str]]:
    """Every entry under ``folder`` (symbolic links not followed), with its contents' names."""
    return {
        str(p.relative_to(folder)): sorted(c.name for c in p.iterdir())
        if p.is_dir() and not p.is_symlink()
        else []
        for p in [folder, *folder.rglob("*")]
    }


def test_resume_refuses_another_estimation_method_naming_the_key(
    spark, tract_csv, tmp_path, capsys
):
    """The estimation method is post-processing (a user secret may estimate the same noisy
    measurements again), but a resumed run is one release: it must not finish another's."""
    out = tmp_path / "out"
    assert run("topdown", tract_csv, out, "--variances") == 0
    config = tmp_path / "topdown.toml"
    config.write_text(with_method(topdown_config(tract_csv).read_text(), "topdown"))
    before = listing(tmp_path)
    capsys.readouterr()
    args = ["topdown", "--config", str(config), "--input", str(tract_csv), "--output", str(out)]
    assert main([*args, "--resume"]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "estimation.method" in err[0] and "tables" in err[0], err
    assert "fresh run" in err[0]
    assert listing(tmp_path) == before


@pytest.mark.parametrize("kind", KINDS)
def test_a_symlinked_output_is_refused_before_anything_is_written(
    spark, kind, tract_csv, tmp_path, capsys
):
    release = tmp_path / "release"
    release.mkdir()
    (release / ".censusdp-release").write_text(f"{kind}\n")
    (tmp_path / "release.private").mkdir(mode=0o700)
    (tmp_path / "release.private" / "run_secret").write_text("cd" * 32 + "\n")
    link = tmp_path / "link"
    link.symlink_to(release)
    before = listing(tmp_path)
    assert run(kind, tract_csv, link, "--overwrite") == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and str(link) in err[0] and "symbolic link" in err[0], err
    assert listing(tmp_path) == before
    assert (tmp_path / "release.private" / "run_secret").read_text() == "cd" * 32 + "\n"


@pytest.mark.parametrize("kind", ["topdown", "pgsr"])
@pytest.mark.parametrize("problem", ["not_written_by_censusdp", "output_holds_the_input"])
def test_a_refused_overwrite_leaves_the_parent_folder_as_it_was(
    spark, kind, problem, tract_csv, tmp_path, capsys
):
    out = tmp_path / "out"
    out.mkdir()
    if problem == "output_holds_the_input":  # an earlier release's folder, the input put in it
        (out / ".censusdp-release").write_text(f"{kind}\n")
        data = out / "input.csv"
    else:
        (out / "thesis.tex").write_text("keep me")
        data = tmp_path / "input.csv"
    data.write_text(default_input(kind, tract_csv).read_text())
    before = listing(tmp_path)
    assert run(kind, tract_csv, out, "--overwrite", input=data) == 2
    err = error_lines(capsys.readouterr().err)
    rule = "written by censusdp" if problem == "not_written_by_censusdp" else "the input"
    assert len(err) == 1 and str(out) in err[0] and rule in err[0], err
    assert listing(tmp_path) == before


def test_an_output_inside_the_input_folder_is_refused_in_one_line(spark, tmp_path, capsys):
    folder = tmp_path / "pl94"
    folder.mkdir()
    copy_of_sample(folder)
    before = listing(tmp_path)
    for out in (folder / "release", tmp_path):  # the output inside the input, the input in it
        args = ["topdown", "--config", str(ROOT / "conf" / "pl94_e2e_providence.toml")]
        code = main([*args, "--input", str(folder), "--output", str(out), "--overwrite"])
        err = error_lines(capsys.readouterr().err)
        assert code == 2 and len(err) == 1 and "inside" in err[0] and str(folder) in err[0], err
        assert listing(tmp_path) == before
