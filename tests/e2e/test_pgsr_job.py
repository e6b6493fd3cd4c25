"""The group-size release end to end on the real CALM household sizes, with real Spark and Delta;
and its config validated at the door."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp_spark.cli import main
from censusdp_spark.group_sizes.config import GroupInputSpec, GroupSizes, load_group_sizes_config
from censusdp_spark.group_sizes.readers import read_leaf_histograms
from censusdp_spark.model.errors import ConfigError, InputError
from censusdp_spark.release.runner import evaluation_dir_for
from tests.helpers.group_sizes import calm_one_tract
from tests.helpers.release import assert_release_unchanged

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "conf" / "pgsr_calm.toml"
LEVELS = {"region": 1, "county": 3, "tract": 35, "block_group": 114, "taz": 930}
HOUSEHOLDS = 62041


def pgsr(*args: str) -> int:
    return main(["pgsr", *args])


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret.hex"
    path.write_text("3c" * 32 + "\n")
    path.chmod(0o600)
    return path


def release(spark, tmp_path_factory, secret: Path, mechanism: str, *extra: str) -> Path:
    out = tmp_path_factory.mktemp(mechanism) / "out"
    code = pgsr(
        "--config",
        str(CONFIG),
        "--mechanism",
        mechanism,
        "--output",
        str(out),
        "--secret-file",
        str(secret),
        *extra,
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def dp(spark, tmp_path_factory, secret) -> Path:
    return release(spark, tmp_path_factory, secret, "dp", "--evaluate")


@pytest.fixture(scope="module")
def relaxed(spark, tmp_path_factory, secret) -> Path:
    return release(spark, tmp_path_factory, secret, "relaxed")


@pytest.fixture(scope="module")
def large_counts(tmp_path_factory) -> Path:
    """The CALM input with every count x 10,000 (620 M households): the noise is 1e-7 of it."""
    frame = pd.read_csv(ROOT / "data" / "calm" / "calm_taz_household_sizes.csv", dtype=str)
    for j in range(1, 5):
        frame[f"HHSIZE{j}"] = frame[f"HHSIZE{j}"].astype(np.int64) * 10_000
    path = tmp_path_factory.mktemp("large") / "calm_x10000.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def cumulative(spark, tmp_path_factory, secret) -> Path:
    return release(spark, tmp_path_factory, secret, "cumulative")


def table(spark, out: Path, name: str):
    return spark.read.format("delta").load(str(out / name))


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


HELD = {"negative_counts": 0, "children_not_summing_to_parent": 0, "unfaithful": 0}


def test_dp_release_holds_every_guarantee_and_its_manifest_no_secret(spark, dp, secret):
    m = manifest(dp)
    assert m["mechanism"] == "dp" and m["guarantee_checks"] == HELD
    assert m["nodes"] == LEVELS and m["tables"][:2] == ["noisy_measurements", "group_sizes"]
    assert m["privacy"]["epsilon"] == "1" and {
        lv["geometric_scale"] for lv in m["privacy"]["levels"]
    } == {"10"}
    assert m["faithfulness"] == "level"
    assert m["optimality"]["lower_bound"] == m["optimality"]["objective"]  # exact
    assert m["privacy"]["unit"]["neighbours"].startswith(
        "neighbouring inputs differ in one individual joining or leaving an existing group"
    )
    assert (
        "G, the number of groups (every level sums to it exactly)" in m["privacy"]["unit"]["public"]
    )
    assert m["optimality"]["gap"] == 0
    assert secret.read_text().strip() not in (dp / "manifest.json").read_text()


def test_narrow_windows_are_widened_cell_by_cell_to_the_same_exact_optimum(
    spark, tmp_path_factory, secret, dp, monkeypatch
):
    """With one-unit first windows (all widened while G is out of the root tables' reach) the
    certificate finds cells on their bounds, widens only those, and the engine still ends at the
    exact optimum of the default run (same noise)."""
    from censusdp_spark.group_sizes import exact

    monkeypatch.setattr(exact, "first_window", lambda scale: 1)
    narrow = manifest(release(spark, tmp_path_factory, secret, "dp"))["optimality"]
    default = manifest(dp)["optimality"]
    assert narrow["window_tract"] < default["window_tract"] and narrow["rounds"] >= 2
    assert narrow["widened_cells"] > 0
    assert narrow["objective"] == narrow["lower_bound"] == default["objective"]


def test_the_spark_engine_and_the_in_process_driver_give_the_same_exact_release(spark, dp):
    """One dp algorithm, two engines: on the release's own noisy measurements the in-process
    driver (``tree.dp_release``: whole-tree batch kernels, least-squares window centres) gives
    the Spark engine's release (level by level, windows at the noisy values) cell for cell."""
    from censusdp_spark.group_sizes.solvers.tree import GroupTree, dp_release

    depth = {name: d for d, name in enumerate(LEVELS)}
    digits = dict(zip(LEVELS, (0, 3, 9, 12, 16), strict=True))
    noisy = table(spark, dp, "noisy_measurements").toPandas()
    noisy = noisy.assign(depth=noisy["level"].map(depth)).sort_values(["depth", "geocode"])
    released = table(spark, dp, "group_sizes").toPandas()
    counts = released.pivot_table(index=["level", "geocode"], columns="size", values="count")
    nodes = zip(noisy["level"], noisy["geocode"], strict=True)
    index = {node: i for i, node in enumerate(nodes)}
    names = list(LEVELS)
    parent = [-1] + [
        index[(names[d - 1], g[: digits[names[d - 1]]])]
        for d, g in zip(noisy["depth"].iloc[1:], noisy["geocode"].iloc[1:], strict=True)
    ]
    spark_counts = counts.loc[list(index)].to_numpy(dtype=np.int64)
    tree = GroupTree(
        np.array(parent),
        np.stack(noisy["noisy"].to_numpy()).astype(np.int64),
        spark_counts.sum(axis=1),  # level faithfulness reads only the root's G
    )
    in_process = dp_release(tree, "l2", "level")
    assert in_process.objective == manifest(dp)["optimality"]["objective"]
    assert (in_process.counts == spark_counts).all()


def test_group_sizes_give_every_size_of_every_node_summing_to_the_households(spark, dp):
    sizes = table(spark, dp, "group_sizes")
    assert sizes.columns == ["geocode", "level", "size", "count"]
    per_level = {
        r["level"]: (r["rows"], r["total"])
        for r in sizes.groupBy("level")
        .agg({"*": "count", "count": "sum"})
        .withColumnsRenamed({"count(1)": "rows", "sum(count)": "total"})
        .collect()
    }
    assert per_level == {lv: (4 * n, HOUSEHOLDS) for lv, n in LEVELS.items()}


def test_noisy_measurements_cover_every_node_once_and_publish_only_the_root_groups(spark, dp):
    noisy = table(spark, dp, "noisy_measurements")
    assert noisy.columns == ["level", "geocode", "measurement", "groups", "noisy"]
    counts = {r["level"]: r["count"] for r in noisy.groupBy("level").count().collect()}
    assert counts == LEVELS
    assert noisy.filter("level != 'region' and groups is not null").count() == 0
    root = noisy.filter("level = 'region'").collect()[0]
    assert (
        root["groups"] == HOUSEHOLDS
        and root["measurement"] == "histogram"
        and len(root["noisy"]) == 4
    )


def test_the_same_secret_gives_dp_and_relaxed_the_same_noisy_measurements(spark, dp, relaxed):
    a = table(spark, dp, "noisy_measurements")
    b = table(spark, relaxed, "noisy_measurements")
    assert a.count() == b.count() and a.exceptAll(b).count() == 0


def test_relaxed_baseline_reports_the_violations_rounding_leaves(spark, relaxed):
    m = manifest(relaxed)
    checks = m["guarantee_checks"]
    assert checks["negative_counts"] == 0
    assert checks["children_not_summing_to_parent"] + checks["unfaithful"] > 0
    assert "clarabel" in m["versions"]
    assert m["mechanism"] == "relaxed" and m["relaxed"]["reliable"] is True
    assert m["relaxed"]["relative_gap"] < 1e-6


@pytest.mark.parametrize("mechanism", ["relaxed", "relaxed_families"])
def test_relaxed_baselines_at_counts_times_10000_do_not_crash(
    spark, tmp_path_factory, secret, large_counts, mechanism
):
    """At these counts the per-family QP must not stop with "infeasible" and a traceback."""
    out = release(
        spark, tmp_path_factory, secret, mechanism, "--input", str(large_counts), "--reuse-secret"
    )
    m = manifest(out)
    assert m["mechanism"] == mechanism and m["guarantee_checks"]["negative_counts"] == 0
    if mechanism == "relaxed":
        assert m["relaxed"]["reliable"] is True
    root = table(spark, out, "group_sizes").filter("level = 'region'").collect()
    assert abs(sum(r["count"] for r in root) - HOUSEHOLDS * 10_000) <= 2  # rounding of 4 sizes


def test_cumulative_release_holds_every_guarantee_with_scale_l_over_epsilon(spark, cumulative):
    m = manifest(cumulative)
    assert m["guarantee_checks"] == HELD
    assert m["privacy"]["measurement"] == "cumulative" and {
        lv["geometric_scale"] for lv in m["privacy"]["levels"]
    } == {"5"}
    noisy = table(spark, cumulative, "noisy_measurements").filter("level = 'region'").collect()[0]
    assert len(noisy["noisy"]) == 4  # H_1..H_4: under level faithfulness G^r is not public


def test_evaluation_is_a_delta_table_with_emd_and_l1_per_level(spark, dp):
    rows = {r["level"]: r for r in table(spark, evaluation_dir_for(dp), "table").collect()}
    assert set(rows) == set(LEVELS) and all(
        r["emd_mean"] >= 0 and r["l1_mean"] >= 0 and r["nodes"] == LEVELS[lv]
        for lv, r in rows.items()
    )
    assert "evaluation" not in manifest(dp)["tables"]  # internal, beside the release


def test_evaluation_l1_and_emd_are_the_mean_distances_per_node(spark, dp):
    """``l1_mean`` is the mean over a level's nodes of ``sum_j |x_j - n_j|`` (what
    ``docs/how-it-works.md`` and ``bench_pgsr.py`` call L1), ``emd_mean`` that of the cumulative differences."""
    truth = true_histograms()
    released: dict[tuple[str, str], list[int]] = {}
    for r in table(spark, dp, "group_sizes").collect():
        released.setdefault((r["level"], r["geocode"]), [0] * 4)[r["size"] - 1] = r["count"]
    rows = {r["level"]: r for r in table(spark, evaluation_dir_for(dp), "table").collect()}
    for level in LEVELS:
        diffs = [
            np.array(x) - np.array(truth[node]) for node, x in released.items() if node[0] == level
        ]
        assert rows[level]["l1_mean"] == pytest.approx(np.mean([np.abs(d).sum() for d in diffs]))
        emd = [np.abs(np.cumsum(d)).sum() for d in diffs]
        assert rows[level]["emd_mean"] == pytest.approx(np.mean(emd))
        assert rows[level]["emd_max"] == max(emd)


def test_existing_output_is_refused_without_overwrite(spark, dp, secret):
    assert pgsr("--config", str(CONFIG), "--output", str(dp), "--secret-file", str(secret)) == 2


def test_relaxed_beyond_its_cell_limit_is_refused_in_one_line_before_any_noise(
    spark, tmp_path, secret, capsys, monkeypatch
):
    from censusdp_spark.group_sizes.solvers import relaxed

    monkeypatch.setattr(relaxed, "RELAXED_MAX_CELLS", 100)  # CALM has 1,083 nodes x 4 sizes
    out = tmp_path / "out"
    args = ["--config", str(CONFIG), "--mechanism", "relaxed", "--output", str(out)]
    assert pgsr(*args, "--secret-file", str(secret), "--reuse-secret") == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress lines
    assert message.startswith("censusdp: error:") and "RELAXED_MAX_CELLS = 100" in message
    assert not (out / "noisy_measurements").exists()


def test_unknown_config_key_exits_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text().replace("topcode = true", "topcode = true\nmin_size = 0"))
    assert pgsr("--config", str(bad), "--output", str(tmp_path / "out")) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('epsilon = "1"', "epsilon = 0.5", "budget.epsilon"),
        ('taz = "1/5" }', 'taz = "1/4" }', "budget"),
        ('name = "pgsr_calm"', 'name = "pgsr_calm"\ndelta = 1e-10', "run.delta"),
        ('"HHSIZE4"]', '"HHSIZE4", "HHBASE"]', "input.size_columns"),
        ('layout = "size_counts"', 'layout = "households"', "input.size_columns"),
        ('norm = "l2"', 'norm = "l3"', "mechanism.norm"),
    ],
)
def test_config_is_validated_at_the_door(tmp_path, old, new, key):
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text().replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_group_sizes_config(bad, ROOT)
    assert err.value.key == key


def test_budget_defaults_to_an_even_split_over_the_levels(tmp_path):
    text = "\n".join(
        ln for ln in CONFIG.read_text().splitlines() if not ln.startswith("levels = { region")
    )
    path = tmp_path / "even.toml"
    path.write_text(text)
    assert set(load_group_sizes_config(path, ROOT).budget.level_epsilon.values()) == {
        Fraction(1, 5)
    }


def households_spec(path: Path, **kw) -> GroupInputSpec:
    return GroupInputSpec(
        path=path,
        format="csv",
        layout="households",
        geocode_columns=("block",),
        household_column="hh",
        **kw,
    )


def test_member_quantities_are_summed_per_household_and_top_coded(spark, tmp_path):
    csv = tmp_path / "people.csv"
    csv.write_text(
        "block,hh,person\n01,a,1\n01,a,1\n01,b,1\n02,c,1\n02,c,1\n02,c,1\n02,c,1\n02,c,0\n"
    )
    leaves = read_leaf_histograms(
        spark, households_spec(csv, member_column="person"), GroupSizes(3, True), 2, None
    )
    assert {r["geocode"]: (list(r["cells"]), list(r["counts"])) for r in leaves.collect()} == {
        "01": ([0, 1], [1, 1]),
        "02": ([2], [1]),
    }


def test_member_rows_without_a_quantity_column_count_one_person_each(spark, tmp_path):
    csv = tmp_path / "people.csv"
    csv.write_text("block,hh\n01,a\n01,a\n01,b\n02,c\n02,c\n02,c\n02,c\n")
    leaves = read_leaf_histograms(spark, households_spec(csv), GroupSizes(3, True), 2, None)
    assert {r["geocode"]: (list(r["cells"]), list(r["counts"])) for r in leaves.collect()} == {
        "01": ([0, 1], [1, 1]),
        "02": ([2], [1]),
    }


def test_size_columns_can_be_named_by_one_pattern(tmp_path):
    text = CONFIG.read_text().replace(
        'size_columns = ["HHSIZE1", "HHSIZE2", "HHSIZE3", "HHSIZE4"]',
        'size_columns = "HHSIZE{size}"',
    )
    assert "HHSIZE{size}" in text
    path = tmp_path / "pattern.toml"
    path.write_text(text)
    config = load_group_sizes_config(path, ROOT)
    assert config.input is not None and config.input == load_group_sizes_config(CONFIG, ROOT).input


def test_a_size_above_max_without_topcode_names_its_row(spark, tmp_path):
    csv = tmp_path / "households.csv"
    csv.write_text("block,hh,np\n01,a,2\n01,b,5\n")
    with pytest.raises(InputError, match="row 2, column np"):
        read_leaf_histograms(
            spark, households_spec(csv, size_column="np"), GroupSizes(4, False), 2, None
        )


def test_every_missing_and_unused_column_is_named_in_one_refusal(spark, tmp_path):
    csv = tmp_path / "households.csv"
    csv.write_text("block,hh,note,extra\n01,a,x,y\n")
    with pytest.raises(InputError) as refused:
        read_leaf_histograms(
            spark, households_spec(csv, size_column="np"), GroupSizes(4, True), 2, None
        )
    assert str(refused.value) == (
        f"{csv}: column np: missing (named in the config's [input]); columns note, extra: not"
        " used by the config; list them in input.ignore if intended"
    )
    csv.write_text("block,hh,np,note\n01,a,1,x\n")
    with pytest.raises(InputError, match="column note: not used by the config; list it in"):
        read_leaf_histograms(
            spark, households_spec(csv, size_column="np"), GroupSizes(4, True), 2, None
        )


@pytest.mark.parametrize(
    ("state", "county", "shown"),
    [
        ("44", "7", "built '447' (3 characters) from state+county joined as written"),
        ("4", "007", "built '4007' (4 characters) from state+county joined as written"),
        ("44", "", "a column of state+county is empty"),
    ],
)
def test_a_geocode_built_from_columns_is_shown_with_the_digits_expected(
    spark, tmp_path, state, county, shown
):
    """The geocode's columns are joined as they are, never padded: the refusal shows what was
    built, so a county written 7 for 007 is plain to see."""
    csv = tmp_path / "households.csv"
    csv.write_text(f"state,county,hh,np\n44,007,a,2\n{state},{county},b,1\n")
    spec = GroupInputSpec(
        path=csv,
        format="csv",
        layout="households",
        geocode_columns=("state", "county"),
        household_column="hh",
        size_column="np",
    )
    with pytest.raises(InputError) as refused:
        read_leaf_histograms(spark, spec, GroupSizes(4, True), 5, None)
    message = str(refused.value)
    assert message.startswith(
        f"{csv}: row 2, column state+county: geocode must be exactly 5 digits; {shown}"
    ), message


BAD_CONFIG = """
[run]
name = "bad"
output = "{out}"
private_dir = "{private}"
[geography]
levels = [{{ name = "all", digits = 0 }}, {{ name = "block", digits = 2 }}]
spine = {{ path = "{spine}", geocode = "block" }}
[groups]
max_size = 3
topcode = {topcode}
[input]
path = "{csv}"
layout = "households"
geocode = "block"
household = "hh"
{quantity} = "n"
[budget]
epsilon = "1"
"""


@pytest.mark.parametrize(
    ("rows", "quantity", "topcode", "where", "rule"),
    [
        ("01,a,2\n01,b,-1\n", "size", "true", "row 2, column n", "size must be a non-negative"),
        ("01,a,2.5\n", "size", "true", "row 1, column n", "size must be a non-negative integer"),
        ("01,a,0\n", "size", "true", "row 1, column n", "a group must have size >= 1"),
        ("01,a,2\n02,b,1\n03,a,1\n", "size", "true", "row 1, column hh", "household a in two"),
        ("01,a,1\n02,a,1\n", "member_quantity", "true", "row 1, column hh", "different leaves"),
        ("01,a,2\n01,b,4\n", "size", "false", "row 2, column n", "above max_size = 3"),
        ("01,a,2\n1,b,1\n", "size", "true", "row 2, column block", "exactly 2 digits"),
        ("01,a,2\nXY,b,1\n", "size", "true", "row 2, column block", "exactly 2 digits"),
        ("01,a,2\n01,b,1,1\n", "size", "true", "row 2", "more fields than the header's 3"),
        ("01,a,99999999999999999999\n", "size", "true", "row 1, column n", "above MAX_COUNT"),
    ],
    ids=[
        "negative",
        "fractional",
        "zero",
        "two-blocks",
        "members-split",
        "over-N",
        "short",
        "alpha",
        "more-fields-than-the-header",
        "size-past-int64",
    ],
)
def test_bad_input_names_file_row_and_rule_and_writes_nothing(
    tmp_path, capsys, rows, quantity, topcode, where, rule
):
    csv = tmp_path / "households.csv"
    csv.write_text("block,hh,n\n" + rows)
    spine = tmp_path / "spine.csv"
    spine.write_text("block\n01\n02\n03\n")
    out, private = tmp_path / "out", tmp_path / "private"
    conf = tmp_path / "bad.toml"
    conf.write_text(
        BAD_CONFIG.format(
            out=out, private=private, topcode=topcode, csv=csv, quantity=quantity, spine=spine
        )
    )
    assert pgsr("--config", str(conf)) == 2
    message = capsys.readouterr().err
    assert str(csv) in message and where in message and rule in message, message
    assert not out.exists()


def true_histograms() -> dict[tuple[str, str], list[int]]:
    """Every node's true size histogram, from the CALM input file."""
    import csv

    digits = {"region": 0, "county": 3, "tract": 9, "block_group": 12, "taz": 16}
    out: dict[tuple[str, str], list[int]] = {}
    with (ROOT / "data" / "calm" / "calm_taz_household_sizes.csv").open() as f:
        for row in csv.DictReader(f):
            leaf = row["county"] + row["tract"] + row["block_group"] + row["taz"]
            sizes = [int(row[f"HHSIZE{j}"]) for j in range(1, 5)]
            for level, d in digits.items():
                node = out.setdefault((level, leaf[:d]), [0, 0, 0, 0])
                out[(level, leaf[:d])] = [a + b for a, b in zip(node, sizes, strict=True)]
    return out


def noise_variance(spark, out: Path, cumulative: bool) -> tuple[float, int]:
    import numpy as np

    truth = true_histograms()
    draws = []
    for r in table(spark, out, "noisy_measurements").collect():
        exact = np.array(truth[(r["level"], r["geocode"])])
        draws.append(np.array(r["noisy"]) - (np.cumsum(exact) if cumulative else exact))
    noise = np.concatenate(draws).astype(np.float64)
    return float(noise.var()), noise.size


def geometric_variance(scale: float) -> float:
    import math

    alpha = math.exp(-1 / scale)
    return 2 * alpha / (1 - alpha) ** 2


@pytest.mark.parametrize(("mechanism", "scale"), [("dp", 10.0), ("cumulative", 5.0)])
def test_noise_added_to_the_written_measurements_has_scale_sensitivity_times_l_over_epsilon(
    spark, dp, cumulative, mechanism, scale
):
    """2L/eps = 10 for histograms, L/eps = 5 for cumulative counts (L = 5, eps = 1), measured
    on the noise actually in ``noisy_measurements``: 4,332 draws give the variance to about
    4% (one standard error), so the test fails if the scale is 30% off (variance x 1.7)."""
    variance, n = noise_variance(spark, dp if mechanism == "dp" else cumulative, mechanism != "dp")
    assert n == 4 * sum(LEVELS.values())
    assert abs(variance / geometric_variance(scale) - 1) < 0.16
    assert abs(variance / geometric_variance(1.3 * scale) - 1) > 0.25
    assert abs(variance / geometric_variance(scale / 1.3) - 1) > 0.25


def test_epsilon_on_the_command_line_rescales_every_level_exactly(spark, tmp_path, secret):
    """The option's wiring into the release and its manifest: the levels and their shares are
    the config's whatever the input, so one tract of CALM (every level of the hierarchy)."""
    out = tmp_path / "half"
    code = pgsr(
        "--config", str(CONFIG), "--epsilon", "1/2", "--output", str(out),
        "--input", str(calm_one_tract(tmp_path)), "--secret-file", str(secret), "--reuse-secret",
    )  # fmt: skip
    assert code == 0
    privacy = manifest(out)["privacy"]
    assert privacy["epsilon"] == "1/2"
    assert {lv["geometric_scale"] for lv in privacy["levels"]} == {"20"}  # 2 / (1/10)


@pytest.mark.parametrize(("epsilon", "rule"), [("0", "must be positive"), ("x", "exact fraction")])
def test_a_bad_command_line_epsilon_is_one_line_and_writes_nothing(tmp_path, capsys, epsilon, rule):
    out = tmp_path / "out"
    assert pgsr("--config", str(CONFIG), "--epsilon", epsilon, "--output", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "budget.epsilon" in err and rule in err, err
    assert not out.exists()


def test_the_dp_release_is_the_recorded_one_bit_for_bit(spark, dp):
    """The shipped CALM config, exact mechanism, the module's fixed secret: every table as
    recorded (a refactor changes no release)."""
    assert_release_unchanged(spark, dp, "group_sizes_calm_dp")
