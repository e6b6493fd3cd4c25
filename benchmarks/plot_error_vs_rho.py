"""The docs' error-versus-ρ figure, from the measured runs of benchmarks/bench_topdown.py.

    .venv/bin/python benchmarks/plot_error_vs_rho.py [--results benchmarks/results/topdown_methods.json]
        [--output docs/img/error_vs_rho.svg]

Reads the per-secret errors ``bench_topdown.py`` recorded (real RI and HI 2010 blocks, the
demo config with only ρ changed, ``full_information``) and plots, per state and level below
the invariant states, the mean over secrets of each node's detailed L1 error against ρ on
log-log axes, with the 1/√ρ slope the measurements' σ follows. Nothing is rerun here: the
figure shows exactly the figures of benchmarks/results/topdown_methods.md.
"""

from __future__ import annotations

import json
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import _common as common  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

LEVELS = ("county", "tract", "block_group", "block")
METHOD = "full_information"
STATES = {"ri": "Rhode Island", "hi": "Hawaii"}


def mean_errors(cases: list[dict]) -> dict[tuple[str, str], dict[float, float]]:
    """``{(state, level): {rho: mean detailed L1 over the secrets}}`` for ``METHOD``."""
    sums: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    for case in cases:
        rho = float(Fraction(case["rho"]))
        for level in LEVELS:
            sums[(case["state"], level, rho)].append(case["errors"][level][METHOD]["l1_detailed"])
    means: dict[tuple[str, str], dict[float, float]] = defaultdict(dict)
    for (state, level, rho), values in sorted(sums.items()):
        means[(state, level)][rho] = sum(values) / len(values)
    return dict(means)


def plot(means: dict[tuple[str, str], dict[float, float]], output: Path) -> None:
    plt.rcParams["svg.hashsalt"] = "censusdp"  # the same file for the same figures
    states = sorted({state for state, _ in means}, reverse=True)
    fig, axes = plt.subplots(1, len(states), figsize=(4.2 * len(states), 3.6), sharey=True)
    for ax, state in zip(axes if len(states) > 1 else [axes], states, strict=True):
        for level in LEVELS:
            points = means.get((state, level), {})
            rhos = sorted(points)
            ax.plot(rhos, [points[r] for r in rhos], marker="o", label=level.replace("_", " "))
        rhos = sorted({r for (s, _), p in means.items() if s == state for r in p})
        anchor = means[(state, "county")][rhos[0]]
        ax.plot(
            rhos,
            [anchor * (rhos[0] / r) ** 0.5 for r in rhos],
            linestyle="--",
            color="grey",
            label="1/√ρ",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{STATES.get(state, state)} 2010 blocks")
        ax.set_xlabel("ρ (zCDP)")
        ax.grid(True, which="both", alpha=0.3)
    (axes[0] if len(states) > 1 else axes).set_ylabel("mean detailed L1 error of a node")
    (axes[-1] if len(states) > 1 else axes).legend(fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, metadata={"Date": None})
    plt.close(fig)


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--results", type=Path, default=common.RESULTS_DIR / "topdown_methods.json")
    parser.add_argument(
        "--output", type=Path, default=common.ROOT / "docs" / "img" / "error_vs_rho.svg"
    )
    args = parser.parse_args()
    plot(mean_errors(json.loads(args.results.read_text())["cases"]), args.output)


if __name__ == "__main__":
    main()
