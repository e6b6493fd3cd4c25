"""Group-size inputs and configs made for a test."""

from __future__ import annotations

from pathlib import Path

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


CALM = Path(__file__).resolve().parents[2] / "data" / "calm" / "calm_taz_household_sizes.csv"
ONE_TRACT = "003,000100,"
"""The CALM tract of the file's first rows: 20 TAZs, under every level of the hierarchy."""


def calm_one_tract(folder: Path) -> Path:
    """The real CALM input cut to ``ONE_TRACT`` (its header kept), at
    ``folder/calm_one_tract.csv``: the input of tests about wiring (options, the secret rule),
    not about the size of the tree."""
    header, *rows = CALM.read_text().splitlines()
    path = folder / "calm_one_tract.csv"
    path.write_text("\n".join([header, *[r for r in rows if r.startswith(ONE_TRACT)]]) + "\n")
    return path
