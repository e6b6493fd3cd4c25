"""The TopDown manifest's budget rows and privacy summary (exact ρ), and the budget table
``censusdp budget`` prints (with bypassing, the chains' node budgets and the path check)."""

from __future__ import annotations

from typing import Any

from censusdp_spark.privacy import zcdp_to_approx_dp
from censusdp_spark.privacy.accounting import ZcdpAllocation
from censusdp_spark.privacy.conversions import bun_steinke_epsilon
from censusdp_spark.topdown.config import TopDownConfig, privacy_unit
from censusdp_spark.topdown.path_cuts import bypass_paths


def budget_rows(config: TopDownConfig) -> list[dict[str, Any]]:
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


def privacy_summary(config: TopDownConfig) -> dict[str, Any]:
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


def bypass_table(allocation: ZcdpAllocation) -> list[str]:
    """The lines ``budget_table`` adds for ``[budget] bypass_single_child = true``: each chain
    a measured node can stand for, with its node rho and query sigmas, then the path check."""
    levels = allocation.levels
    lines = [
        "bypass_single_child = true: a parent with exactly one child (from the geography, never"
        " the data) is not measured;",
        "its share moves to the child, down to the lowest node of a single-child chain, which is"
        " measured with its level's queries at:",
        f"{'chain (levels spent)':<44}{'measured at':<14}{'node rho':>12}  query sigmas",
    ]
    for end in range(len(levels)):
        for start in range(end):
            chain = levels[start : end + 1]
            sigmas = ", ".join(
                f"{e.query} {float(e.sigma2) ** 0.5:.3f}" for e in allocation.node_budget(chain)
            )
            lines.append(
                f"{'+'.join(chain):<44}{chain[-1]:<14}{float(allocation.node_rho(chain)):>12.6f}"
                f"  {sigmas}"
            )
    paths = bypass_paths(allocation)
    lines.append(
        f"every root-to-leaf path: all {len(paths)} ways bypassing can cut it re-added, each"
        f" spends rho = {allocation.total_rho} exactly"
    )
    return lines


def budget_table(
    allocation: ZcdpAllocation, delta: float, bypass_single_child: bool = False
) -> str:
    """A printable table: per level and query the shares, rho, sigma; then totals and epsilon;
    with ``bypass_single_child``, the node budgets of bypass chains and the per-path check."""
    header = (
        f"{'level':<14}{'query':<34}{'level share':>14}{'query share':>14}{'rho':>12}{'sigma':>10}"
    )
    lines = [header, "-" * len(header)]
    for e in allocation.entries:
        sigma = float(e.sigma2) ** 0.5
        lines.append(
            f"{e.level:<14}{e.query:<34}{str(e.level_share):>14}{str(e.query_share):>14}"
            f"{float(e.rho):>12.6f}{sigma:>10.3f}"
        )
    lines.append("-" * len(header))
    for level in dict.fromkeys(e.level for e in allocation.entries):
        level_rho = allocation.level_rho(level)
        lines.append(f"{level:<14}{'(level total)':<34}{'':>28}{float(level_rho):>12.6f}")
    rho = allocation.total_rho
    lines += [
        "-" * len(header),
        f"total rho = {rho} = {float(rho):.6f} (re-added from the entries: exact match)",
    ]
    if bypass_single_child:
        lines += [*bypass_table(allocation), "-" * len(header)]
    lines.append(
        f"epsilon at delta={delta:g}: {zcdp_to_approx_dp(rho, delta):.4f} (tight, CKS20 Cor. 13); "
        f"{bun_steinke_epsilon(rho, delta):.4f} (Bun-Steinke bound)"
    )
    return "\n".join(lines)
