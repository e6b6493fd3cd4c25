"""``censusdp budget --optimize`` end to end: it reads the config and the public spine alone,
so two inputs on one spine get the same budget; it writes a config that runs, and a plot."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pandas as pd
import pytest

from censusdp_spark.cli import main
from censusdp_spark.topdown.config import load_topdown_config

ROOT = Path(__file__).resolve().parents[2]
RI_BLOCKS = ROOT / "data" / "ri_2010_blocks_pl.csv"
WORKLOAD = 'queries = ["votingage * hisprace", "total"]\n[levels]\ncounty = 1.0\ntract = 1.0\n'


def demo_on_a_spine(folder: Path, spine: bool = True) -> Path:
    """``conf/ri_2010_demo.toml`` with every RI 2010 block as its spine, absolute paths."""
    text = (ROOT / "conf" / "ri_2010_demo.toml").read_text()
    text = text.replace('path = "data/ri_2010_blocks_pl.csv"', f'path = "{RI_BLOCKS}"')
    text = text.replace('output = "output/ri_2010_demo"', f'output = "{folder / "out"}"')
    text = text.replace('private_dir = "runs/ri_2010_demo"', f'private_dir = "{folder / "runs"}"')
    if spine:
        line = f'spine = {{ path = "{RI_BLOCKS}", format = "csv", geocode = "GEOID" }}\n'
        text = text.replace("[geography]\n", "[geography]\n" + line, 1)
    path = folder / "demo_on_spine.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("optimizer")
    (folder / "workload.toml").write_text(WORKLOAD)
    # another input on the same spine: the same blocks, their counts moved between blocks
    blocks = pd.read_csv(RI_BLOCKS, dtype=str)
    blocks["GEOID"] = blocks["GEOID"].sample(frac=1.0, random_state=3).to_numpy()
    blocks.to_csv(folder / "other_input.csv", index=False)
    return folder


def optimize(folder: Path, *extra: str) -> tuple[int, str]:
    """``censusdp budget --optimize`` of the demo on RI's spine, in this process: its exit
    status and what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            ["budget", "--config", str(demo_on_a_spine(folder)), "--optimize", "--workload",
             str(folder / "workload.toml"), *extra]
        )  # fmt: skip
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def optimized(spark, folder) -> tuple[str, Path, Path]:
    """One run on the input the config names, writing a config and a plot: what it printed
    (up to the files' lines), the config and the plot."""
    written, plot = folder / "optimized.toml", folder / "errors.png"
    code, printed = optimize(
        folder, "--input", str(RI_BLOCKS), "--write-config", str(written), "--plot", str(plot)
    )
    assert code == 0, printed
    return printed.split("plot written to")[0], written, plot


def test_two_inputs_on_one_spine_get_the_same_budget(optimized, folder):
    first, _, _ = optimized
    code, second = optimize(folder, "--input", str(folder / "other_input.csv"))
    assert code == 0
    assert first == second
    assert "county 5, tract 244, block_group 815, block 25,181 nodes" in first
    assert '[budget]\nrho = "293764/114921"' in first
    assert "weighted workload error:" in first


def test_the_written_config_runs_and_the_plot_is_drawn(optimized, folder, capsys):
    printed, written, plot = optimized
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = load_topdown_config(written)
    assert config.budget.total_rho == load_topdown_config(demo_on_a_spine(folder)).budget.total_rho
    assert printed.split("[budget]\n", 1)[1].strip() in written.read_text()
    assert main(["check", "--config", str(written)]) == 0
    capsys.readouterr()
    code = main(["budget", "--config", str(written), "--optimize", "--write-config", str(written)])
    assert code == 2 and "exists: --write-config writes a new file" in capsys.readouterr().err


def test_the_api_gives_what_the_command_prints(optimized, spark, folder):
    from censusdp_spark import optimize_budget

    choice = optimize_budget(
        demo_on_a_spine(folder), workload=folder / "workload.toml", spark=spark
    )
    assert choice.text() == optimized[0]
    assert choice.nodes["block"] == 25_181
    assert choice.optimized.objective < choice.optimized.baseline_objective


def test_a_config_without_a_spine_is_refused(folder, capsys, tmp_path):
    config = demo_on_a_spine(tmp_path, spine=False)
    code = main(["budget", "--config", str(config), "--optimize"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{config}: [geography.spine]" in err and "the config needs [geography] spine" in err


def test_a_group_sizes_config_is_refused(capsys):
    code = main(["budget", "--config", str(ROOT / "conf" / "pgsr_calm.toml"), "--optimize"])
    assert code == 2
    assert "--optimize chooses TopDown budgets only" in capsys.readouterr().err
