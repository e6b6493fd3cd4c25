"""The run manifest: what was run, with which budget, versions and timings; written last.

It carries no secret (only a fingerprint that cannot reveal it) and no true count.
"""

from __future__ import annotations

import json
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

from censusdp_spark.model.config import RunConfig
from censusdp_spark.privacy import zcdp_to_approx_dp
from censusdp_spark.privacy.conversions import bun_steinke_epsilon


def budget_rows(config: RunConfig) -> list[dict[str, Any]]:
    return [
        {
            "level": e.level,
            "query": e.query,
            "level_share": str(e.level_share),
            "query_share": str(e.query_share),
            "rho": str(e.rho),
            "sigma2": str(e.sigma2),
            "sigma": float(e.sigma2) ** 0.5,
        }
        for e in config.budget.entries
    ]


def privacy_summary(config: RunConfig) -> dict[str, Any]:
    rho = config.budget.total_rho
    delta = config.run.delta
    return {
        "definition": "rho-zCDP, change-one-record neighbours (bounded DP)",
        "rho": str(rho),
        "rho_float": float(rho),
        "delta": delta,
        "epsilon_tight": zcdp_to_approx_dp(rho, delta),
        "epsilon_bun_steinke": bun_steinke_epsilon(rho, delta),
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in (
        "censusdp-spark",
        "pyspark",
        "delta-spark",
        "numpy",
        "scipy",
        "pandas",
        "pyarrow",
        "randomgen",
    ):
        out[pkg] = version(pkg)
    return out


def write_manifest(path: Path, content: dict[str, Any]) -> None:
    """Atomic write: a reader sees either no manifest or the whole one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content, indent=2, sort_keys=False, default=str))
    os.replace(tmp, path)
