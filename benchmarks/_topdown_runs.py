"""TopDown releases as the accuracy benchmarks make them, each a ``censusdp topdown`` process of
its own (its own JVM, ``local[2]``, this worktree's code): one run under a benchmark's fixed
secret, with or without ``--evaluate``; the 2,016-cell production config with an estimation
method set; the real RI 2010 blocks expanded to that schema; and the Providence legacy files
read with pandas. ``bench_production.py``, ``bench_budget_optimizer.py``,
``bench_occupancy.py``, ``bench_gq_bounds.py`` and ``bench_topdown.py`` make their releases
here.

Every run is an experiment: one secret may serve several configs on purpose
(``--reuse-secret``; the outputs are marked not for release), bound in a secret registry of the
benchmark's own in its work folder, never the user's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from _common import CENSUSDP, ROOT, secret_hex, write_secret

PRODUCTION_CONFIG = ROOT / "conf" / "pl94_2020_production.toml"
RI_SPINE = 'spine = { path = "data/ri_2010_blocks_pl.csv", format = "csv", geocode = "GEOID" }'
"""The spine of the expanded RI input: every RI 2010 block, the empty ones included."""
PROVIDENCE_FILES = ROOT / "data" / "pl94_2018_e2e_providence_ri"
"""The 2018 End-to-End P.L. 94-171 files of Providence County, RI (legacy layout)."""


def censusdp_topdown(args: list[str], work: Path) -> float:
    """``censusdp topdown ARGS`` in a child process on this worktree's code, with the secret
    registry in ``work``: its wall time (the JVM's start included)."""
    started = time.perf_counter()
    subprocess.run(
        [str(CENSUSDP), "topdown", *args],
        check=True,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CENSUSDP_SECRET_REGISTRY": str(work / "secret_registry"),
        },
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def production_secret(i: int) -> str:
    """Secret ``i`` of the evaluated runs (named for ``bench_production.py``, which made the
    first of them): fixed, so a rerun measures the same noise."""
    return secret_hex(f"bench_production secret {i}")


def evaluated_run(
    config: Path, out: Path, secret_i: int, work: Path, source: Path | None = None
) -> tuple[float, dict, list[dict]]:
    """One ``censusdp topdown --evaluate`` run of ``config`` (on ``source``, else its own
    input) with the secret of index ``secret_i``, written to ``out`` and ``out.evaluation``:
    its wall time, manifest and the evaluation's error rows of the method it used."""
    secret = write_secret(work / f"secret{secret_i}.hex", production_secret(secret_i))
    evaluation = out.with_name(out.name + ".evaluation")
    wall = censusdp_topdown(
        [
            "--config", str(config),
            *(["--input", str(source)] if source else []),
            "--output", str(out), "--overwrite", "--evaluate", "--evaluation-output", str(evaluation),
            "--secret-file", str(secret), "--reuse-secret", "--master", "local[2]",
        ],
        work,
    )  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    errors = pd.read_csv(evaluation / "errors.csv")
    mine = errors[errors["method"] == manifest["estimation"]["method"]]
    rows = [
        {"level": r.level, "metric": r.metric, "query": r.query, "value": float(r.value)}
        for r in mine.itertuples()
    ]
    return wall, manifest, rows


def production_config(method: str, work: Path, name: str) -> Path:
    """The production config with ``[estimation] method`` set, written to ``work``; for the
    input ``ri``, on RI's spine."""
    text = re.sub(r"(?m)^method\s*=.*\n", "", PRODUCTION_CONFIG.read_text())
    assert "\n[estimation]\n" in text
    if name == "ri":
        text, replaced = re.subn(r"(?m)^spine\s*=.*$", RI_SPINE, text)
        assert replaced == 1
    path = work / f"production_{name}_{method}.toml"
    path.write_text(text.replace("\n[estimation]\n", f'\n[estimation]\nmethod = "{method}"\n', 1))
    return path


def production_input(name: str, work: Path) -> Path | None:
    """The input of ``name``: None for the config's own (``perry``, the Perry County sample);
    for ``ri`` the real RI 2010 blocks expanded to 2,016 cells by ``expand_pl94.py --seed 1``,
    made in ``work`` on first use."""
    if name == "perry":
        return None
    expanded = work / "ri_pl94.csv"
    if not expanded.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "expand_pl94.py"),
             str(ROOT / "data" / "ri_2010_blocks_pl.csv"), str(expanded), "--seed", "1"],
            check=True,
        )  # fmt: skip
    return expanded


def write_config(text: str, path: Path) -> Path:
    """A shipped config's ``text`` (or a variant of it) written to ``path`` in a work folder,
    its ``data/`` paths made absolute so that it loads from there."""
    path.write_text(text.replace('path = "data/', f'path = "{ROOT}/data/'))
    return path


def providence_segment(name: str, columns: dict[int, str]) -> pd.DataFrame:
    """The ``columns`` (position -> name) of one Providence legacy segment file, as text."""
    frame = pd.read_csv(
        PROVIDENCE_FILES / name, sep="|", header=None, dtype=str, encoding="latin-1"
    )
    return frame[list(columns)].rename(columns=columns)
