import re
import tomllib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from censusdp_spark.model.config import SpineSpec
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.topdown.config import load_topdown_config
from tests.helpers.release import SHIPPED_METHOD, with_method

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf" / "ri_2010_demo.toml"
SHIPPED_TOPDOWN = (
    "ri_2010_demo.toml",
    "hi_2010_demo.toml",
    "national_demo.toml",
    "pl94_2020_production.toml",
    "pl94_e2e_providence.toml",
    "pl94_e2e_providence_units.toml",
)


def edited(tmp_path: Path, old: str, new: str, source: Path = DEMO) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_demo_config_loads_into_typed_objects():
    config = load_topdown_config(DEMO, ROOT)
    assert config.schema.n_cells == 16
    assert config.hierarchy.names == ("nation", "state", "county", "tract", "block_group", "block")
    assert config.budget.total_rho == Fraction(293764, 114921)
    assert [q.name for q in config.queries["block"]] == ["total", "detailed"]
    assert config.input is not None and len(config.input.cells) == 16


def test_pl94_config_has_2016_cells_and_one_structural_zero_block_of_cells():
    config = load_topdown_config(ROOT / "conf" / "pl94_2020_production.toml", ROOT)
    assert config.schema.n_cells == 2016
    assert len(config.structural_zero_cells) == 2 * 63  # nursing x under 18 x hispanic x cenrace
    assert config.query("nation", "hhinstlevels").size == 3


def test_unknown_key_is_an_error_naming_it(tmp_path):
    path = edited(tmp_path, "[estimation]\n", "[estimation]\nsmoothing = true\n")
    with pytest.raises(ConfigError, match=r"\[estimation\] unknown key\(s\) \['smoothing'\]"):
        load_topdown_config(path, ROOT)


def test_query_shares_not_summing_to_one_name_the_level(tmp_path):
    path = edited(
        tmp_path, '"total" = "1/10", "detailed" = "9/10"', '"total" = "1/10", "detailed" = "8/10"'
    )
    with pytest.raises(
        ConfigError, match=r"budget.levels.block.queries: shares sum to 9/10, not 1"
    ):
        load_topdown_config(path, ROOT)


def test_level_shares_not_summing_to_one_are_refused(tmp_path):
    path = edited(tmp_path, 'share = "165/4099"', 'share = "166/4099"')
    with pytest.raises(ConfigError, match="level shares sum to 4100/4099"):
        load_topdown_config(path, ROOT)


@pytest.mark.parametrize(
    "value, message", [('"0"', "must be > 0"), ('"-1/2"', "must be > 0"), ("0.5", "is a float")]
)
def test_bad_rho_is_refused(tmp_path, value, message):
    path = edited(tmp_path, 'rho = "293764/114921"', f"rho = {value}")
    with pytest.raises(ConfigError, match=message):
        load_topdown_config(path, ROOT)


def test_a_level_without_query_shares_is_refused(tmp_path):
    path = edited(
        tmp_path, 'queries = { "total" = "1/10", "detailed" = "9/10" }\n', "queries = {}\n"
    )
    with pytest.raises(ConfigError, match="budget.levels.block.queries: missing query shares"):
        load_topdown_config(path, ROOT)


def per_query_rho(doc: dict) -> dict:
    """The demo's ``[budget]`` in ``mode = "per_query_rho"``: each query's rho given."""
    budget = doc["budget"]
    budget.update(mode="per_query_rho")
    budget.pop("rho")
    for level in budget["levels"].values():
        level.pop("share")
        level["queries"] = dict.fromkeys(level["queries"], "1/100")
    return doc


def test_per_query_rho_gives_each_query_its_rho_and_the_total_their_sum():
    config = load_topdown_config(per_query_rho(tomllib.loads(DEMO.read_text())), ROOT)
    entries = config.budget.entries
    assert {e.rho for e in entries} == {Fraction(1, 100)}
    assert config.budget.total_rho == Fraction(len(entries), 100)


@pytest.mark.parametrize(
    ("edit", "key", "rule"),
    [
        (lambda d: d["budget"].update(mode="split"), "budget.mode",
         "'split' must be one of ('shares', 'per_query_rho')"),
        (lambda d: d["budget"].pop("rho"), "budget", "missing required key 'rho' (mode = 'shares')"),
        (lambda d: d["budget"]["levels"]["county"].pop("share"), "budget.levels.county",
         "missing required key(s) ['share']"),
        (lambda d: per_query_rho(d)["budget"].update(rho="1"), "budget.rho",
         "not used with mode = 'per_query_rho' (the total is the sum)"),
        (lambda d: per_query_rho(d)["budget"]["levels"]["county"].update(share="1"),
         "budget.levels.county", "unknown key(s) ['share']; allowed: ['queries']"),
    ],
)  # fmt: skip
def test_each_budget_mode_takes_its_own_keys(edit, key, rule):
    doc = tomllib.loads(DEMO.read_text())
    edit(doc)
    with pytest.raises(ConfigError) as refused:
        load_topdown_config(doc, ROOT)
    assert (refused.value.key, refused.value.rule) == (key, rule)


def test_a_cell_level_outside_the_schema_is_refused(tmp_path):
    path = edited(
        tmp_path, 'hisprace = "nhpi", expr = "vap_nhpi"', 'hisprace = "pacific", expr = "vap_nhpi"'
    )
    with pytest.raises(ConfigError, match=r"input.cells\[\d+\].hisprace.*'pacific' is not a level"):
        load_topdown_config(path, ROOT)


def test_unknown_query_attribute_names_the_level(tmp_path):
    path = edited(tmp_path, '"total" = "1/10", "detailed"', '"total" = "1/10", "sex * detailed"')
    with pytest.raises(ConfigError, match="budget.levels.block.queries.*unknown attribute"):
        load_topdown_config(path, ROOT)


def test_shipped_configs_ask_full_information_and_an_omitted_method_is_topdown(tmp_path):
    for name in SHIPPED_TOPDOWN:
        assert (
            load_topdown_config(ROOT / "conf" / name, ROOT).estimation_method == "full_information"
        )
    omitted = tmp_path / "omitted.toml"
    omitted.write_text(SHIPPED_METHOD.sub("", DEMO.read_text()))
    assert load_topdown_config(omitted, ROOT).estimation_method == "topdown"
    topdown = edited(tmp_path, 'method = "full_information"', 'method = "topdown"')
    assert load_topdown_config(topdown, ROOT).estimation_method == "topdown"


def test_unknown_estimation_method_names_file_key_and_choices(tmp_path):
    path = edited(tmp_path, 'method = "full_information"', 'method = "bluedown"')
    with pytest.raises(
        ConfigError,
        match=r"edited\.toml: \[estimation\.method\] 'bluedown' must be one of"
        r" \['topdown', 'full_information'\]",
    ):
        load_topdown_config(path, ROOT)


@pytest.mark.parametrize("method", ["topdown", "full_information"])
def test_estimation_passes_default_to_one_and_accept_total_first(tmp_path, method):
    levels = load_topdown_config(DEMO, ROOT).hierarchy.names
    assert {lv: load_topdown_config(DEMO, ROOT).passes_at(lv) for lv in levels} == dict.fromkeys(
        levels, ("all",)
    )
    source = tmp_path / "source.toml"
    source.write_text(with_method(DEMO.read_text(), method))
    lines = '[estimation]\npasses = ["total", "all"]\n'
    config = load_topdown_config(edited(tmp_path, "[estimation]\n", lines, source), ROOT)
    # topdown fits a measured total first: the demo's nation measures none (one pass there).
    one_pass = {"nation"} if method == "topdown" else set()
    assert {lv: config.passes_at(lv) for lv in levels} == {
        lv: ("all",) if lv in one_pass else ("total", "all") for lv in levels
    }
    explicit = edited(tmp_path, "[estimation]\n", '[estimation]\npasses = ["all"]\n')
    assert load_topdown_config(explicit, ROOT).passes_at("county") == ("all",)


def test_estimation_passes_per_level_leave_the_other_levels_one_pass(tmp_path):
    table = '{ county = ["total", "all"], block_group = ["total", "all"], block = ["all"] }'
    path = edited(tmp_path, "[estimation]\n", f"[estimation]\npasses = {table}\n")
    config = load_topdown_config(path, ROOT)
    assert [lv for lv in config.hierarchy.names if config.passes_at(lv) == ("total", "all")] == [
        "county",
        "block_group",
    ]


@pytest.mark.parametrize(
    ("passes", "key", "rule"),
    [
        ('["votingage", "all"]', "", "a pass of 'votingage' is not supported: the passes are"),
        ('["bogus", "all"]', "", "'bogus' is not a pass; the passes are ['total', 'all']"),
        ('["all", "total"]', "", "\"all\" must be the last pass, got ['all', 'total']"),
        ('["total"]', "", '"all" must be the last pass'),
        ("[]", "", '"all" must be the last pass, got []'),
        ('["total", "total", "all"]', "", "a pass is given twice"),
        ('"total"', "", "must be a list of pass names or a table of them per level, got 'total'"),
        ('[1, "all"]', "", "must be a list of pass names or a table of them per level"),
        ('{ counti = ["total", "all"] }', ".counti", "unknown level 'counti'; levels are"),
        ('{ tract = ["all", "total"] }', ".tract", '"all" must be the last pass'),
        (
            '{ nation = ["total", "all"] }',
            ".nation",
            '"total" fits each child\'s measured total first, but'
            ' [budget.levels.nation.queries] has no "total"',
        ),
    ],
)
def test_bad_estimation_passes_name_the_key_and_rule_in_one_line(tmp_path, passes, key, rule):
    source = tmp_path / "topdown.toml"  # the nation's rule is topdown's (it fits measured totals)
    source.write_text(with_method(DEMO.read_text(), "topdown"))
    path = edited(tmp_path, "[estimation]\n", f"[estimation]\npasses = {passes}\n", source)
    with pytest.raises(ConfigError) as caught:
        load_topdown_config(path, ROOT)
    message = str(caught.value)
    assert f"[estimation.passes{key}] " in message and rule in message and "\n" not in message


def test_a_total_pass_needs_a_measured_total_with_topdown_only(tmp_path):
    text = re.sub(r"(?m)^queries = \{.*\}$", 'queries = { "detailed" = "1" }', DEMO.read_text())
    assert '"total"' not in text
    passes = '[estimation]\npasses = ["total", "all"]\n'
    path = tmp_path / "no_total.toml"
    path.write_text(with_method(text, "topdown").replace("[estimation]\n", passes))
    with pytest.raises(ConfigError, match=r"\[estimation\.passes\] \"total\" fits each child"):
        load_topdown_config(path, ROOT)
    # full_information fits the bottom-up totals, which every level has.
    path.write_text(text.replace("[estimation]\n", passes))
    assert load_topdown_config(path, ROOT).passes_at("nation") == ("total", "all")


def test_a_total_pass_with_bypassing_is_refused_with_topdown_only(tmp_path):
    text = DEMO.read_text().replace("[estimation]\n", '[estimation]\npasses = ["total", "all"]\n')
    text = text.replace("# bypass_single_child = true", "bypass_single_child = true")
    path = tmp_path / "bypass.toml"
    path.write_text(with_method(text, "topdown"))
    with pytest.raises(ConfigError, match=r"\[estimation\.passes\] \"total\" first is not"):
        load_topdown_config(path, ROOT)
    path.write_text(text)
    config = load_topdown_config(path, ROOT)
    assert config.bypass_single_child and config.passes_at("county") == ("total", "all")


def test_full_information_needs_leaf_queries_that_determine_every_cell(tmp_path):
    source = tmp_path / "source.toml"
    source.write_text(DEMO.read_text())
    path = edited(
        tmp_path,
        'queries = { "total" = "1/10", "detailed" = "9/10" }',
        'queries = { "total" = "1/10", "votingage" = "9/10" }',
        source=source,
    )
    with pytest.raises(
        ConfigError,
        match=r"\[estimation\.method\] \"full_information\" needs the leaf level's queries to"
        r" determine every cell; those of \[budget\.levels\.block\.queries\]",
    ):
        load_topdown_config(path, ROOT)
    # TopDown fits every level under its parent and has no such rule.
    source.write_text(with_method(DEMO.read_text(), "topdown"))
    load_topdown_config(
        edited(
            tmp_path,
            '"total" = "1/10", "detailed" = "9/10"',
            '"total" = "1/10", "votingage" = "9/10"',
            source=source,
        ),
        ROOT,
    )


def test_a_schema_cell_left_unmapped_is_refused_naming_it(tmp_path):
    """A schema cell left out of the mapping is refused: its people would silently count 0."""
    path = edited(
        tmp_path, '  { votingage = "18plus", hisprace = "nhpi", expr = "vap_nhpi" },\n', ""
    )
    with pytest.raises(
        ConfigError,
        match=r"edited\.toml: \[input\.cells\] cell \{votingage = '18plus', hisprace = 'nhpi'\}"
        r" is neither mapped nor in \[estimation\] structural_zeros",
    ):
        load_topdown_config(path, ROOT)


def test_every_unmapped_cell_is_named_in_one_refusal(tmp_path):
    source = tmp_path / "source.toml"
    source.write_text(
        DEMO.read_text().replace(
            '  { votingage = "18plus", hisprace = "nhpi", expr = "vap_nhpi" },\n', ""
        )
    )
    path = edited(
        tmp_path,
        '  { votingage = "under18", hisprace = "two_or_more", expr = "pop_two - vap_two" },\n',
        "",
        source=source,
    )
    with pytest.raises(ConfigError) as refused:
        load_topdown_config(path, ROOT)
    message = str(refused.value)
    assert message.count("\n") == 0 and "(2 cell(s) left out)" in message
    assert (
        "[input.cells] cells {votingage = 'under18', hisprace = 'two_or_more'},"
        " {votingage = '18plus', hisprace = 'nhpi'} are neither mapped nor in"
        " [estimation] structural_zeros"
    ) in message


def test_an_unmapped_cell_declared_structurally_zero_is_accepted(tmp_path):
    source = tmp_path / "source.toml"
    source.write_text(
        DEMO.read_text().replace(
            '  { votingage = "18plus", hisprace = "nhpi", expr = "vap_nhpi" },\n', ""
        )
    )
    zero = '[estimation]\nstructural_zeros = [{ votingage = ["18plus"], hisprace = ["nhpi"] }]\n'
    config = load_topdown_config(edited(tmp_path, "[estimation]\n", zero, source=source), ROOT)
    assert config.input is not None and len(config.input.cells) == 15
    assert config.structural_zero_cells == (8 + 5,)  # votingage 18plus (1) x 8 + nhpi (5)


def test_the_demo_declares_its_total_column_and_microdata_may_not(tmp_path):
    config = load_topdown_config(DEMO, ROOT)
    assert config.input is not None and config.input.total == "pop"
    assert "pop" in config.input.used_columns() and "pop" not in config.input.ignore
    path = edited(
        tmp_path,
        'layout = "microdata"\n',
        'layout = "microdata"\ntotal = "pop"\n',
        source=ROOT / "conf" / "pl94_2020_production.toml",
    )
    with pytest.raises(ConfigError, match=r"\[input\.total\] only for layout = 'block_counts'"):
        load_topdown_config(path, ROOT)


def test_full_information_on_the_production_schema_holds_two_attributes_symmetric(tmp_path):
    production = ROOT / "conf" / "pl94_2020_production.toml"
    assert load_topdown_config(production, ROOT).estimation_method == "full_information"
    # A structural zero that depends on hispanic and cenrace leaves only votingage symmetric:
    # blocks of 1,000 cells, refused in one line with the rule.
    zero = 'structural_zeros = [ { hispanic = ["hispanic"], cenrace = ["01"] } ]'
    text = production.read_text()
    path = tmp_path / "refused.toml"
    path.write_text(re.sub(r"^structural_zeros = .*$", zero, text, flags=re.M))
    with pytest.raises(
        ConfigError, match=r"\[estimation\.method\] \"full_information\" holds"
    ) as e:
        load_topdown_config(path, ROOT)
    assert "\n" not in str(e.value) and "DENSE_BLOCK_MAX_CELLS = 512" in str(e.value)


def test_full_information_falls_back_to_topdown_only_when_asked(tmp_path):
    production = ROOT / "conf" / "pl94_2020_production.toml"
    zero = 'structural_zeros = [ { hispanic = ["hispanic"], cenrace = ["01"] } ]'
    text = re.sub(r"^structural_zeros = .*$", zero, production.read_text(), flags=re.M)
    refused = tmp_path / "refused.toml"
    refused.write_text(text)
    with pytest.raises(ConfigError, match=r"\[estimation\.method\]"):
        load_topdown_config(refused, ROOT)
    asked = tmp_path / "asked.toml"
    asked.write_text(text.replace("[estimation]\n", '[estimation]\nfallback = "topdown"\n'))
    config = load_topdown_config(asked, ROOT)
    assert config.estimation_method == "topdown"
    assert "DENSE_BLOCK_MAX_CELLS = 512" in config.method_fallback
    # A config full_information supports ignores the fallback; other fallbacks are refused.
    fine = edited(tmp_path, "[estimation]\n", '[estimation]\nfallback = "topdown"\n')
    assert load_topdown_config(fine, ROOT).method_fallback == ""
    bad = edited(tmp_path, "[estimation]\n", '[estimation]\nfallback = "gls"\n')
    with pytest.raises(ConfigError, match=r"\[estimation\.fallback\]"):
        load_topdown_config(bad, ROOT)


E2E = ROOT / "conf" / "pl94_e2e_providence.toml"


def test_the_legacy_config_maps_every_derived_cell_into_the_252_cells():
    config = load_topdown_config(E2E, ROOT)
    spec = config.input
    assert config.schema.n_cells == 252 and spec is not None and len(spec.cells) == 252
    assert spec.legacy is not None and spec.legacy.table == "persons"
    assert spec.legacy.summary_levels == ("140", "150")
    assert [p.name for p in spec.files()] == [
        "rigeo2018_2020Style.pl",
        *[f"ri0000{n}2018_2020Style.pl" for n in (1, 2, 3)],
    ]
    # cell 0: under 18, not Hispanic, White alone = P2's - P4's not-Hispanic White alone
    assert (spec.cells[0].plus, spec.cells[0].minus) == (("P0020005",), ("P0040005",))
    # the last: 18 and over, Hispanic, all six races = P3's - P4's not-Hispanic six races
    assert (spec.cells[-1].plus, spec.cells[-1].minus) == (("P0030071",), ("P0040073",))
    queries = {lv: [q.name for q in config.queries[lv]] for lv in config.hierarchy.names}
    assert not any("hhgq" in q or "hhinstlevels" in q for qs in queries.values() for q in qs)
    assert config.budget.total_rho == Fraction(293764, 114921)


def test_a_coarser_cenrace_map_sums_the_derived_cells():
    doc = tomllib.loads(E2E.read_text())
    doc["schema"]["attributes"][2] = {"name": "cenrace", "levels": ["one", "more"]}
    groups = {f"{r:02d}": ("one" if r <= 6 else "more") for r in range(1, 64)}
    doc["input"]["attributes"]["cenrace"]["map"] = groups
    del doc["output"]  # P1-P4 need the 63 races apart (tests/topdown/test_census_tables.py)
    config = load_topdown_config(doc, ROOT)
    assert config.input is not None and len(config.input.cells) == 8
    # under 18, not Hispanic, one race: the six single races of P2 less those of P4
    first = config.input.cells[0]
    assert first.plus == tuple(f"P00200{c:02d}" for c in range(5, 11))
    assert first.minus == tuple(f"P00400{c:02d}" for c in range(5, 11))


@pytest.mark.parametrize(
    ("old", "new", "key", "rule"),
    [
        ('table = "persons"', 'table = "people"', "input.table", "must be one of ('persons',"),
        ('state = "ri"', 'state = "RI"', "input.state", ""),
        ('state = "ri"                                # rigeo<vintage>.pl, ri00001<vintage>.pl, ...\n', "",
         "input", "missing required key(s) ['state']"),
        ('summary_levels = ["140", "150"]', 'summary_levels = ["140", "155"]',
         "input.summary_levels", "['155'] are not among ('040', '050', '140', '150')"),
        ('column = "CENHISP"', 'column = "HISP"', "input.attributes.hispanic.column",
         "'HISP' is not a variable of table 'persons'"),
        ('column = "CENHISP"', 'column = "VOTING_AGE"', "input.attributes.hispanic.column",
         "'VOTING_AGE' is mapped twice"),
        ('map = { "1" = "not_hispanic", "2" = "hispanic" }', 'map = { "1" = "not_hispanic" }',
         "input.attributes.hispanic.map", "codes ['2'] of CENHISP are not mapped"),
        ('format = "pl94_legacy"\npath', 'layout = "block_counts"\nformat = "pl94_legacy"\npath',
         "input.layout", "not used with format = 'pl94_legacy'"),
        ('{ name = "block", digits = 15 }', '{ name = "block", digits = 16 }', "geography.levels",
         "format = 'pl94_legacy' reads 15-digit blocks"),
    ],
)  # fmt: skip
def test_a_bad_legacy_input_section_names_its_key(tmp_path, old, new, key, rule):
    with pytest.raises(ConfigError) as refused:
        load_topdown_config(edited(tmp_path, old, new, E2E), ROOT)
    assert f"[{key}]" in str(refused.value) and rule in str(refused.value), refused.value


def test_every_problem_of_a_legacy_map_is_named_in_one_refusal(tmp_path):
    """A code missing from the map and a level that is not one, together."""
    path = edited(
        tmp_path,
        'map = { "1" = "not_hispanic", "2" = "hispanic" }',
        'map = { "1" = "not_hispanic", "3" = "latino" }',
        E2E,
    )
    with pytest.raises(ConfigError) as refused:
        load_topdown_config(path, ROOT)
    message = str(refused.value)
    assert message.count("\n") == 0 and "[input.attributes.hispanic.map]" in message
    assert "['3'] are not codes of CENHISP" in message
    assert "codes ['2'] of CENHISP are not mapped" in message
    assert "maps to ['latino'], which are not levels of hispanic" in message


def test_legacy_keys_are_refused_with_other_formats(tmp_path):
    path = edited(tmp_path, 'layout = "block_counts"', 'layout = "block_counts"\nstate = "ri"')
    with pytest.raises(ConfigError, match=r"\[input\.state\] only for format = 'pl94_legacy'"):
        load_topdown_config(path, ROOT)
    path = edited(tmp_path, 'layout = "block_counts"\n', "")
    with pytest.raises(ConfigError, match=r"\[input\] missing required key\(s\) \['layout'\]"):
        load_topdown_config(path, ROOT)


def test_a_dwellings_table_is_refused_without_occupancy_groups_and_with_legacy_input():
    demo = tomllib.loads(DEMO.read_text())
    demo["estimation"]["dwellings"] = {"path": "dwellings.csv", "geocode": "GEOID"}
    with pytest.raises(
        ConfigError, match=r"\[estimation\.dwellings\] is read only by \[\[estimation\.occupancy"
    ):
        load_topdown_config(demo, ROOT)
    doc = tomllib.loads(E2E.read_text())
    doc["estimation"]["dwellings"] = {"path": "dwellings.csv", "geocode": "GEOID"}
    with pytest.raises(
        ConfigError, match=r"\[estimation\.dwellings\] format = 'pl94_legacy' input carries"
    ):
        load_topdown_config(doc, ROOT)


def test_the_providence_config_holds_one_occupancy_group_over_every_cell():
    (group,) = load_topdown_config(E2E, ROOT).occupancy
    assert group.cells == tuple(range(252))
    assert (group.plus, group.minus) == (("H0010001", "P0050001"), ())


@pytest.mark.parametrize(
    ("occupancy", "key", "rule"),
    [
        ([{"where": "H0010001 + P9990001"}], ".where", "['P9990001'] are not cells of the legacy"),
        ([{"where": "H0010001 *"}], ".where", "must be column names joined by + and -"),
        (
            [{"where": "H0010001", "cells": {"votingage": ["adult"]}}],
            ".cells.votingage",
            "['adult'] are not levels of votingage",
        ),
        ([{"where": "H0010001", "cells": {"sex": ["male"]}}], ".cells", "unknown key(s) ['sex']"),
        (
            [
                {"where": "H0010001", "cells": {"votingage": ["18plus"]}},
                {"where": "P0050001", "cells": {"votingage": ["18plus"], "hispanic": ["hispanic"]}},
            ],
            "[1].cells",
            "63 cell(s) are in an earlier group too",
        ),
        (
            [{"where": "H0010001", "at_least": "(P0050003 > 1)"}],
            ".at_least",
            "must be terms joined by + and -, each COLUMN, (COLUMN > 0) or an integer times one",
        ),
        ([{"where": "H0010001", "at_most": "99 * H0010001 P0050001"}], ".at_most", "must be terms"),
        ([{"where": "H0010001", "at_most": "99 * HU"}], ".at_most", "['HU'] are not cells of"),
        ([{"where": "H0010001", "at_least": ""}], ".at_least", "must not be empty"),
        (
            [{"where": "H0010001", "at_most": "99999999999 * H0010001"}],
            ".at_most",
            "coefficient 99999999999 is above 1,000,000,000",
        ),
    ],
)
def test_a_bad_occupancy_group_names_its_key_and_rule_in_one_line(occupancy, key, rule):
    doc = tomllib.loads(E2E.read_text())
    doc["estimation"]["occupancy"] = occupancy
    with pytest.raises(ConfigError) as caught:
        load_topdown_config(doc, ROOT)
    message = str(caught.value)
    assert "[estimation.occupancy" in message and key in message, message
    assert rule in message and "\n" not in message


PERSONS_CELL = "is not public: only housing units (H0010001) and occupied facilities"


@pytest.mark.parametrize(
    ("group", "key"),
    [
        ({"where": "H0010001", "at_most": "P0030001"}, ".at_most"),
        ({"where": "H0010001", "at_least": "P0010001 + (P0050003 > 0)"}, ".at_least"),
        ({"where": "H0010001", "at_most": "P0050001"}, ".at_most"),
        ({"where": "H0010001", "at_most": "99 * H0010002"}, ".at_most"),
        ({"where": "P0010001"}, ".where"),
        ({"where": "H0010001 - P0050001"}, ".where"),
    ],
)
def test_an_occupancy_group_naming_persons_is_refused_at_config_time(group, key):
    """Bounds and ``where`` are published without noise: they may name only what the 2020
    policy makes public, a block's housing units and its occupied group-quarters facilities
    (a type with persons counts as one: ``(P0050003 > 0)``; ``where`` tests positivity, so a
    type's persons may be added there). A persons count would leak through the bound and the
    refusal that names it."""
    doc = tomllib.loads(E2E.read_text())
    doc["estimation"]["occupancy"] = [group]
    with pytest.raises(ConfigError) as caught:
        load_topdown_config(doc, ROOT)
    message = str(caught.value)
    assert f"[estimation.occupancy[0]{key}]" in message and PERSONS_CELL in message, message
    assert "\n" not in message


def test_occupancy_bounds_are_integer_multiples_of_counts_and_indicators():
    doc = tomllib.loads(E2E.read_text())
    doc["estimation"]["occupancy"] = [
        {"where": "H0010001 + P0050001", "at_least": "(P0050003 > 0) + (P0050004>0)",
         "at_most": "99 * H0010001 + 99999 * (P0050003 > 0) - (P0050004 > 0)"}
    ]  # fmt: skip
    (group,) = load_topdown_config(doc, ROOT).occupancy
    assert group.at_least is not None and group.at_most is not None
    assert group.at_least.terms == ((1, "P0050003", True), (1, "P0050004", True))
    assert group.at_most.terms == (
        (99, "H0010001", False), (99999, "P0050003", True), (-1, "P0050004", True)
    )  # fmt: skip
    assert group.at_most.columns == ("H0010001", "P0050003", "P0050004")


def test_occupancy_needs_dwelling_counts_and_one_pass():
    demo = tomllib.loads(DEMO.read_text())
    demo["estimation"]["occupancy"] = [{"where": "HU"}]
    with pytest.raises(
        ConfigError,
        match=r"\[estimation\.occupancy\] needs each block's dwelling counts: \[estimation\]"
        r" dwellings = .* or format = 'pl94_legacy' input",
    ):
        load_topdown_config(demo, ROOT)
    demo["estimation"]["dwellings"] = {"path": "dwellings.csv", "geocode": "GEOID"}
    config = load_topdown_config(demo, ROOT)
    assert config.dwellings == SpineSpec(ROOT / "dwellings.csv", "csv", ("GEOID",))
    assert [(g.plus, g.minus) for g in config.occupancy] == [(("HU",), ())]
    doc = tomllib.loads(E2E.read_text())
    doc["estimation"]["passes"] = ["total", "all"]
    with pytest.raises(
        ConfigError, match=r"\[estimation\.passes\] \"total\" first is not supported"
    ):
        load_topdown_config(doc, ROOT)


def test_cells_are_identified_exactly_when_the_stacked_marginals_have_full_rank():
    """Against the stacked 0/1 matrix's SVD rank, on random marginal sets of 2-4 attributes
    with random structural zeros (where marginals without every attribute can identify the
    cells left): both the one-query shortcut and the Gram rank decide cases."""
    from censusdp_spark.topdown.config import _identify_every_cell

    rng = np.random.default_rng(5)
    outcomes = set()
    for _ in range(300):
        shape = tuple(rng.integers(2, 4, rng.integers(2, 5)))
        cells = np.indices(shape).reshape(len(shape), -1).T
        cells = cells[rng.random(len(cells)) < rng.uniform(0.2, 0.9)]  # the active cells
        codes = []
        for _ in range(rng.integers(1, 4)):
            kept = rng.random(len(shape)) < 0.5
            sizes = np.array(shape)[kept]
            codes.append(np.ravel_multi_index(cells[:, kept].T, sizes) if kept.any()
                         else np.zeros(len(cells), dtype=int))  # fmt: skip
        if len(cells) == 0:
            continue
        stacked = np.vstack([np.eye(code.max() + 1)[code].T for code in codes])
        expected = bool(np.linalg.matrix_rank(stacked) == len(cells))
        assert _identify_every_cell(codes, len(cells)) == expected
        outcomes.add((expected, any(np.unique(c).size == len(cells) for c in codes)))
    assert outcomes == {(True, True), (True, False), (False, False)}
