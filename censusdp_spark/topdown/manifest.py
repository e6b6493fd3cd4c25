"""The TopDown manifest's budget table and privacy summary (exact ρ)."""

from __future__ import annotations

from typing import Any

from censusdp_spark.privacy import zcdp_to_approx_dp
from censusdp_spark.privacy.conversions import bun_steinke_epsilon
from censusdp_spark.topdown.config import RunConfig, privacy_unit


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
        "unit": privacy_unit(config).manifest(),
        "rho": str(rho),
        "rho_float": float(rho),
        "delta": delta,
        "epsilon_tight": zcdp_to_approx_dp(rho, delta),
        "epsilon_bun_steinke": bun_steinke_epsilon(rho, delta),
    }
