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
