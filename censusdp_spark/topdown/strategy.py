"""Choose TopDown's budget by its expected error: the allocation of rho over levels and queries
that minimises a user's workload error, from the config and the public spine alone.

The expected error (``solvers.expected_error``) models the tree as homogeneous, each level's
nodes with the level's mean fan-out on the spine, and the estimator as linear: non-negativity,
integrality, rounding, occupancy rules and bypassing are not in it. It reads no count, so an
allocation chosen with it spends no privacy budget and reveals nothing about the data.

A *workload* is what the user wants accurate: tables (P.L. 94-171 ``P1``-``P5``, through the
config's ``[output.pl94_tables]``) and marginal queries (the config's query grammar), at levels
with a weight each. Its error at a level is the expected absolute error of every field of every
table, summed over the fields, per node; the objective is the weighted sum over its levels.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field
from scipy.optimize import minimize

from censusdp_spark.model.config import Model, read_config
from censusdp_spark.model.errors import ConfigError
from censusdp_spark.topdown.bottom_up import config_layout
from censusdp_spark.topdown.census_tables import table_matrix
from censusdp_spark.topdown.config import TopDownConfig, load_topdown_config
from censusdp_spark.topdown.queries import parse_query
from censusdp_spark.topdown.solvers.expected_error import (
    FieldGrams,
    as_covariance,
    expected_absolute_error,
    final_blocks,
    unit_informations,
)
from censusdp_spark.topdown.solvers.gaussian_estimates import Covariance, LevelDesign
from censusdp_spark.topdown.solvers.symmetric_covariance import SymmetricLayout

PL94_PRESET = "pl94"
"""``--workload pl94``: the P.L. 94-171 tables P1-P4 at county, tract and block group, weight 1."""
PL94_PRESET_TABLES = ("P1", "P2", "P3", "P4")
PL94_PRESET_LEVELS = ("county", "tract", "block_group")
SHARE_DENOMINATOR = 10_000
"""The optimized shares are written as multiples of ``1 / 10,000`` (each at least one)."""


class WorkloadModel(Model):
    tables: list[str] = Field(
        default_factory=list,
        description='P.L. 94-171 tables ("P1"-"P5"), computed through the config\'s'
        " [output.pl94_tables] variables.",
    )
    queries: list[str] = Field(
        default_factory=list,
        description='Marginal queries in the config\'s grammar, e.g. "votingage * hispanic".',
    )
    levels: dict[str, float] = Field(
        description="Level -> its weight (> 0) in the objective; other levels count 0.",
    )


@dataclass(frozen=True)
class WorkloadTable:
    """One table of the workload: ``name`` and its fields as columns over the schema's cells."""

    name: str
    fields: np.ndarray  # (n_cells, fields) of 0 and 1


@dataclass(frozen=True)
class Workload:
    source: str
    tables: tuple[WorkloadTable, ...]
    levels: Mapping[str, float]


@dataclass(frozen=True)
class Allocation:
    """Shares of rho: each level's, and each of its queries' within it (floats while
    optimizing; ``exact`` makes them fractions that sum to 1 exactly)."""

    levels: Mapping[str, float]
    queries: Mapping[str, Mapping[str, float]]

    @classmethod
    def of(cls, config: TopDownConfig) -> Allocation:
        """The config's own allocation, as shares of its total rho."""
        rho = float(config.budget.total_rho)
        levels = {lv: float(config.budget.level_rho(lv)) / rho for lv in config.hierarchy.names}
        queries = {
            lv: {
                q.name: float(config.budget.sigma2_for(lv, q.name) ** -1)
                / float(config.budget.level_rho(lv))
                for q in config.queries[lv]
            }
            for lv in config.hierarchy.names
        }
        return cls(levels, queries)

    def exact(self) -> ExactAllocation:
        return ExactAllocation(
            _exact_shares(self.levels),
            {lv: _exact_shares(shares) for lv, shares in self.queries.items()},
        )


@dataclass(frozen=True)
class ExactAllocation:
    levels: Mapping[str, Fraction]
    queries: Mapping[str, Mapping[str, Fraction]]

    def as_floats(self) -> Allocation:
        return Allocation(
            {lv: float(s) for lv, s in self.levels.items()},
            {lv: {q: float(s) for q, s in qs.items()} for lv, qs in self.queries.items()},
        )


@dataclass(frozen=True)
class LevelError:
    """The expected error at one level of one workload table: summed over its fields, per
    node (``l1``), and the largest field's standard deviation (``largest_sd``)."""

    level: str
    table: str
    l1: float
    largest_sd: float


def load_workload(source: str | Path, config: TopDownConfig) -> Workload:
    """The workload of a TOML file, or the ``pl94`` preset; ``ConfigError`` naming the file,
    the key and the rule when it does not fit ``config``."""
    if str(source) == PL94_PRESET:
        model = WorkloadModel(
            tables=list(PL94_PRESET_TABLES), levels=dict.fromkeys(PL94_PRESET_LEVELS, 1.0)
        )
        name = f"--workload {PL94_PRESET}"
    else:
        _, model = read_config(WorkloadModel, source, None)
        name = str(source)
    fail = _failing(name)
    if not model.tables and not model.queries:
        raise fail("-", "names no table and no query: give tables, queries or both")
    for level, weight in model.levels.items():
        if level not in config.hierarchy.names:
            raise fail(f"levels.{level}", f"not a level of the config: {config.hierarchy.names}")
        if not weight > 0:
            raise fail(f"levels.{level}", f"weight {weight!r} must be > 0")
    if not model.levels:
        raise fail("levels", "names no level")
    tables = [_pl94_table(fail, config, t) for t in model.tables]
    tables += [_query_table(fail, config, q) for q in model.queries]
    return Workload(name, tuple(tables), dict(model.levels))


def _failing(source: str) -> Any:
    return lambda key, rule: ConfigError(source, key, rule)


def _pl94_table(fail: Any, config: TopDownConfig, table: str) -> WorkloadTable:
    if config.pl94_tables is None:
        raise fail("tables", f"{table}: the config has no [output.pl94_tables] to compute it")
    try:
        _, matrix = table_matrix(replace(config.pl94_tables, tables=(table,)), config.schema)
    except KeyError:
        raise fail("tables", f"unknown table {table!r} (P1, P2, P3, P4 or P5)") from None
    return WorkloadTable(table, matrix)


def _query_table(fail: Any, config: TopDownConfig, name: str) -> WorkloadTable:
    try:
        query = parse_query(name, config.schema)
    except ValueError as err:
        raise fail("queries", str(err)) from None
    fields = np.zeros((config.schema.n_cells, query.size), dtype=np.int64)
    fields[np.arange(config.schema.n_cells), query.cell_to_marginal] = 1
    return WorkloadTable(name, fields)


class ErrorModel:
    """The expected errors of allocations of one config on one spine shape."""

    def __init__(self, config: TopDownConfig, nodes: Mapping[str, int], workload: Workload) -> None:
        names = config.hierarchy.names
        missing = [lv for lv in names if nodes.get(lv, 0) < 1]
        if missing:
            raise ValueError(f"the spine has no nodes at {missing}")
        self.config = config
        self.workload = workload
        self.levels = names
        self.fanouts = [1.0] + [nodes[b] / nodes[a] for a, b in zip(names, names[1:], strict=False)]
        invariant = {lv for top in config.invariant_levels for lv in names[: names.index(top) + 1]}
        self.exact_totals = [lv in invariant for lv in names]
        self.active = np.ones(config.schema.n_cells, dtype=bool)
        self.active[list(config.structural_zero_cells)] = False
        self.layout: SymmetricLayout | None = config_layout(config)
        self.rho = float(config.budget.total_rho)
        self.grams = [FieldGrams(t.fields[self.active], self.layout) for t in workload.tables]
        self.units = [self._unit_informations(lv) for lv in names]

    def _unit_informations(self, level: str) -> np.ndarray:
        queries = self.config.queries[level]
        design = LevelDesign(
            level=level,
            marginals=tuple(q.cell_to_marginal[self.active] for q in queries),
            marginal_sizes=tuple(q.size for q in queries),
            weights=np.ones(len(queries)),
            layout=self.layout,
        )
        return unit_informations(design)

    def covariances(self, allocation: Allocation) -> list[Covariance]:
        """Each level's covariance of a node's final estimate under ``allocation``."""
        informations = []
        for lv, units in zip(self.levels, self.units, strict=True):
            shares = allocation.queries[lv]
            # 1 / sigma^2 = the query's rho (privacy.accounting.QueryBudget.sigma2)
            weights = np.array(
                [self.rho * allocation.levels[lv] * shares[q.name] for q in self.config.queries[lv]]
            )
            informations.append(np.einsum("q,qcij->cij", weights, units))
        blocks = final_blocks(
            informations, self.fanouts, self.exact_totals, self.levels,
            self.config.estimation_method,
        )  # fmt: skip
        return [as_covariance(b, self.layout) for b in blocks]

    def errors(
        self, allocation: Allocation, levels: Sequence[str] | None = None
    ) -> list[LevelError]:
        """Every workload table's expected error at ``levels`` (default: every level)."""
        covariances = self.covariances(allocation)
        rows = []
        for lv in levels or self.levels:
            covariance = covariances[self.levels.index(lv)]
            for table, grams in zip(self.workload.tables, self.grams, strict=True):
                variances = grams.variances(covariance)
                rows.append(
                    LevelError(
                        lv,
                        table.name,
                        float(expected_absolute_error(variances).sum()),
                        float(np.sqrt(variances.max())),
                    )
                )
        return rows

    def objective(self, allocation: Allocation) -> float:
        """The weighted sum over the workload's levels of their tables' expected errors."""
        rows = self.errors(allocation, list(self.workload.levels))
        return sum(self.workload.levels[r.level] * r.l1 for r in rows)


@dataclass(frozen=True)
class Optimized:
    """The optimizer's allocation (exact shares) and the objective at it and at the config's."""

    allocation: ExactAllocation
    objective: float
    baseline_objective: float
    evaluations: int


SHARE_RATIO = 100.0
"""No (level, query) share of rho is below this fraction of the largest. The fits slow down on
much more ill-conditioned precisions, and may not settle: Perry County's root had condition
5.6e4 and took the solver's fallback with shares down to 1e-7 of the largest; at a ratio of
100 its condition is 3.7e3 and the exact method settles in 2 s, for an expected workload error
of 0.362x the production allocation's against 0.359x unbounded."""
GRADIENT_STEP = 1e-5
"""L-BFGS-B's finite-difference step on the log-shares: smaller steps drown the gradient in
the round-off of the inverses and the search stops early (Perry County, P.L. 94-171 workload:
scipy's default 1e-8 stopped at 0.46x the production allocation's expected error; 1e-6, 1e-5
and 1e-4 reach 0.365x, 0.359x and 0.358x)."""


def optimize(model: ErrorModel, max_iterations: int = 500) -> Optimized:
    """The allocation minimising ``model.objective`` at the config's total rho and queries,
    from the config's own: L-BFGS-B over the logarithms of every (level, query) share of the
    total rho (a softmax, so every share stays positive and they sum to 1); the config's own
    when nothing better is found. Deterministic: no randomness is drawn."""
    start = Allocation.of(model.config)
    pairs = [(lv, q.name) for lv in model.levels for q in model.config.queries[lv]]
    x0 = np.log([start.levels[lv] * start.queries[lv][q] for lv, q in pairs])

    def allocation_of(x: np.ndarray) -> Allocation:
        shares = _softmax(x)
        levels = dict.fromkeys(model.levels, 0.0)
        for (lv, _), share in zip(pairs, shares, strict=True):
            levels[lv] += float(share)
        queries: dict[str, dict[str, float]] = {lv: {} for lv in model.levels}
        for (lv, q), share in zip(pairs, shares, strict=True):
            queries[lv][q] = float(share) / levels[lv]
        return Allocation(levels, queries)

    top = float(x0.max()) + 1.0
    x0 = np.maximum(x0, top - math.log(SHARE_RATIO))
    baseline = model.objective(start)
    evaluations = 0

    def scaled_objective(x: np.ndarray) -> float:
        nonlocal evaluations
        evaluations += 1
        return model.objective(allocation_of(x)) / baseline

    result = minimize(
        scaled_objective,
        x0,
        method="L-BFGS-B",
        bounds=[(top - math.log(SHARE_RATIO), top)] * x0.size,
        options={"maxiter": max_iterations, "eps": GRADIENT_STEP},
    )
    exact = allocation_of(result.x).exact()
    value = model.objective(exact.as_floats())
    if value >= baseline:
        exact, value = start.exact(), baseline
    return Optimized(exact, value, baseline, evaluations)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _exact_shares(shares: Mapping[str, float]) -> dict[str, Fraction]:
    """``shares`` (positive, summing to about 1) as multiples of ``1 / SHARE_DENOMINATOR``,
    each at least one and summing to exactly 1 (the largest takes the difference)."""
    units = {k: max(1, round(float(v) * SHARE_DENOMINATOR)) for k, v in shares.items()}
    largest = max(units, key=lambda k: units[k])
    units[largest] += SHARE_DENOMINATOR - sum(units.values())
    if units[largest] < 1:
        raise ValueError(f"cannot write {len(units)} positive shares over {SHARE_DENOMINATOR}")
    return {k: Fraction(u, SHARE_DENOMINATOR) for k, u in units.items()}


def budget_section(config: TopDownConfig, allocation: ExactAllocation) -> str:
    """The ``[budget]`` TOML of ``allocation`` at the config's total rho (mode ``shares``)."""
    lines = ["[budget]", f'rho = "{config.budget.total_rho}"', 'mode = "shares"']
    if config.bypass_single_child:
        lines.append("bypass_single_child = true")
    for lv in config.hierarchy.names:
        lines += ["", f"[budget.levels.{lv}]", f'share = "{allocation.levels[lv]}"']
        lines.append(f"[budget.levels.{lv}.queries]")
        lines += [f'"{q}" = "{s}"' for q, s in allocation.queries[lv].items()]
    return "\n".join(lines) + "\n"


BUDGET_HEADER = re.compile(r"^\s*\[\s*budget(\s*\]|\s*\.)")
ANY_HEADER = re.compile(r"^\s*\[")


def with_budget(text: str, section: str) -> str:
    """A config's TOML ``text`` with its ``[budget]`` tables (and comments within them)
    replaced by ``section``, where the first of them was."""
    out: list[str] = []
    inside, placed = False, False
    for line in text.splitlines(keepends=True):
        if ANY_HEADER.match(line):
            inside = bool(BUDGET_HEADER.match(line))
            if inside and not placed:
                out.append(section)
                placed = True
        if not inside:
            out.append(line)
    if not placed:
        out.append("\n" + section)
    return "".join(out)


def refuse_existing(path: Path) -> None:
    """``ConfigError`` when ``path`` exists: ``--write-config`` writes a new file only."""
    if path.exists():
        raise ConfigError(str(path), "-", "exists: --write-config writes a new file")


def write_config(
    config_path: Path, config: TopDownConfig, allocation: ExactAllocation, out: Path
) -> None:
    """``config_path``'s text with the ``[budget]`` of ``allocation``, to ``out``; validated
    as a config before it is written (relative paths resolve as the original's)."""
    text = with_budget(Path(config_path).read_text(), budget_section(config, allocation))
    load_topdown_config(tomllib.loads(text), project_root=config.document.base)
    out.write_text(text)


def report(model: ErrorModel, optimized: Optimized) -> str:
    """The expected error of every table at every level, the config's allocation beside the
    optimized one, workload levels marked with their weight; then the objective."""
    before = model.errors(Allocation.of(model.config))
    after = model.errors(optimized.allocation.as_floats())
    lines = [
        "expected absolute error of each table, summed over its fields, per node"
        " (linear estimator: no rounding, no non-negativity)",
        f"{'level':<14}{'weight':>7}  {'table':<34}{'config':>10}{'optimized':>11}{'ratio':>8}",
    ]
    for b, a in zip(before, after, strict=True):
        weight = model.workload.levels.get(b.level)
        lines.append(
            f"{b.level:<14}{'-' if weight is None else f'{weight:g}':>7}  {b.table:<34}"
            f"{b.l1:>10.1f}{a.l1:>11.1f}{a.l1 / b.l1:>7.2f}x"
        )
    lines.append(
        f"weighted workload error: {optimized.baseline_objective:.1f} (config) -> "
        f"{optimized.objective:.1f} (optimized), "
        f"{optimized.objective / optimized.baseline_objective:.2f}x"
        f" in {optimized.evaluations} evaluations"
    )
    return "\n".join(lines)


def plot(model: ErrorModel, optimized: Optimized, path: Path) -> None:
    """A PNG of the workload levels' expected errors (every table summed), config against
    optimized."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(model.workload.levels)
    totals = []
    for allocation in (Allocation.of(model.config), optimized.allocation.as_floats()):
        rows = model.errors(allocation, levels)
        totals.append([sum(r.l1 for r in rows if r.level == lv) for lv in levels])
    x = np.arange(len(levels))
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.bar(x - 0.2, totals[0], 0.4, label="config's allocation")
    axes.bar(x + 0.2, totals[1], 0.4, label="optimized")
    axes.set_xticks(x, levels)
    axes.set_ylabel("expected |error| per node,\nworkload tables summed")
    axes.set_title(f"{model.workload.source} at rho = {model.config.budget.total_rho}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


@dataclass(frozen=True, kw_only=True)
class BudgetChoice:
    """The optimizer's answer for one config, workload and spine (``api.optimize_budget``).

    Attributes:
        config: The config the shares were chosen for (its rho, queries and method).
        source: How its file is named in messages (``--config``'s value).
        spine: The spine read, as messages show it.
        nodes: The spine's node count per level.
        model: The expected-error model (``ErrorModel``) of that tree and workload.
        optimized: The exact shares and the objective at them and at the config's.
    """

    config: TopDownConfig
    source: str
    spine: str
    nodes: Mapping[str, int]
    model: ErrorModel
    optimized: Optimized

    @property
    def budget(self) -> str:
        """The ``[budget]`` TOML of the optimized shares (exact fractions)."""
        return budget_section(self.config, self.optimized.allocation)

    def text(self) -> str:
        """What ``censusdp budget --optimize`` prints: the config and spine, the expected
        error per level and table beside the config's own, then the ``[budget]``."""
        config = self.config
        return "\n".join(
            [
                f"budget optimizer: {self.source} ({config.estimation_method}) at rho ="
                f" {config.budget.total_rho}, workload {self.model.workload.source}",
                f"spine {self.spine}: "
                + ", ".join(f"{level} {count:,}" for level, count in self.nodes.items())
                + " nodes",
                report(self.model, self.optimized),
                "",
                self.budget,
            ]
        )

    def write_config(self, path: Path) -> None:
        """The config's file with this ``[budget]`` in place, validated, to the new file
        ``path`` (``ConfigError`` if it exists)."""
        refuse_existing(path)
        write_config(Path(self.source), self.config, self.optimized.allocation, path)

    def plot(self, path: Path) -> None:
        """A PNG of the workload levels' expected errors, the config's against these."""
        plot(self.model, self.optimized, path)
