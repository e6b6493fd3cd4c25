"""The synthetic-data config (``conf/synth_*.toml``), validated once at the door.

Sections: ``[run]`` (as for TopDown), ``[input]`` (two tables and their key columns),
``[budget]`` (ρ, rounds and how they scale with ρ, the selection share of each round),
``[workload]``, ``[relationships]``, one ``[[group]]`` / ``[[individual]]`` table per attribute
(column and bins), and one table of hyperparameters per method. Unknown keys are errors; fractions are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from censusdp_spark.model.config import ConfigReader, RunOptions, parse_toml, run_options
from censusdp_spark.synth.domain import Attribute, Binning, HouseholdDomain, Roles

METHODS = ("mwem", "hpd_fixed", "hpd_gen", "independent")
INPUT_FORMATS = ("csv", "parquet", "delta")
LARGER_HOUSEHOLDS = ("refuse", "drop")


@dataclass(frozen=True)
class SynthInput:
    households: Path
    persons: Path
    format: str
    household_id: str
    member_order: str
    drop_larger: bool = False  # households of more than M persons: left out, else an input error


@dataclass(frozen=True)
class SynthBudget:
    rho: Fraction
    rounds: int
    select_share: Fraction  # of each round's rho, for the exponential mechanism
    rounds_at_rho: Fraction | None = None  # the ρ at which T = rounds; None: T = rounds always

    def rounds_for(self, rho: Fraction) -> int:
        """T at this ρ: ``rounds``·√(ρ/``rounds_at_rho``), rounded, at least 1.

        A round's noise on a normalised answer grows as √(T/ρ), while the error left on the
        workloads no round measured shrinks as T grows; balancing a noise term ∝ √(T/ρ) against
        a coverage term ∝ 1/√T gives T ∝ √ρ. Without ``rounds_at_rho``, T is ``rounds``.
        """
        if self.rounds_at_rho is None:
            return self.rounds
        return max(1, round(self.rounds * math.sqrt(rho / self.rounds_at_rho)))


@dataclass(frozen=True)
class MwemOptions:
    passes: int = 10  # multiplicative-weights passes over all measurements after each round
    step: float = 1.0  # η of the multiplicative update
    max_domain: int = 2_000_000


@dataclass(frozen=True)
class HpdFixedOptions:
    components: int = 128  # K: product distributions in the mixture
    steps_per_round: int = 50  # Adam steps after each measurement
    learning_rate: float = 0.05
    init_scale: float = 0.5  # standard deviation of the initial logits


@dataclass(frozen=True)
class HpdGenOptions:
    components: int = 128  # latent draws per step (the mixture's K)
    steps_per_round: int = 50
    learning_rate: float = 0.003
    hidden: int = 128  # width of the two hidden layers
    latent: int = 32  # dimension of the Gaussian input


@dataclass(frozen=True)
class SynthConfig:
    source: str
    run: RunOptions
    input: SynthInput
    domain: HouseholdDomain
    budget: SynthBudget
    degree: int  # |S| of the Q_G / Q_I / Q_R workloads
    mwem: MwemOptions
    hpd_fixed: HpdFixedOptions
    hpd_gen: HpdGenOptions


def _attribute(r: ConfigReader, doc: Any, key: str) -> Attribute:
    doc = r.table(doc, key, {"name", "column", "levels", "ranges", "missing"}, {"name", "column"})
    name = r.string(doc["name"], f"{key}.name")
    column = r.string(doc["column"], f"{key}.column")
    if ("levels" in doc) == ("ranges" in doc):
        raise r.fail(
            key, "give exactly one of 'levels' (value lists) and 'ranges' ([low, high) pairs)"
        )
    names: list[str] = []
    values: dict[float | str, int] = {}
    ranges: list[tuple[float, float, int]] = []
    if "levels" in doc:
        levels = r.table(doc["levels"], f"{key}.levels", set(doc["levels"]))
        for level, members in levels.items():
            if not isinstance(members, list):
                raise r.fail(f"{key}.levels.{level}", "must be a list of raw values")
            for v in members:
                if isinstance(v, bool) or not isinstance(v, int | str):
                    raise r.fail(
                        f"{key}.levels.{level}", f"{v!r}: raw values are integers or strings"
                    )
                raw: float | str = float(v) if isinstance(v, int) else v.strip()
                if raw in values:
                    raise r.fail(f"{key}.levels.{level}", f"value {v!r} is in two levels")
                values[raw] = len(names)
            names.append(level)
    else:
        spec = r.table(doc["ranges"], f"{key}.ranges", set(doc["ranges"]))
        for level, bounds in spec.items():
            if bounds == []:  # the level of blanks only
                names.append(level)
                continue
            ok = isinstance(bounds, list) and len(bounds) == 2
            ok = ok and all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
            if not ok or not bounds[0] < bounds[1]:
                raise r.fail(
                    f"{key}.ranges.{level}", f"{bounds!r} must be [low, high] with low < high"
                )
            ranges.append((float(bounds[0]), float(bounds[1]), len(names)))
            names.append(level)
        ordered = sorted(ranges)
        if any(a[1] > b[0] for a, b in zip(ordered, ordered[1:], strict=False)):
            raise r.fail(f"{key}.ranges", "ranges overlap")
    missing = None
    if "missing" in doc:
        label = r.string(doc["missing"], f"{key}.missing")
        if label not in names:
            raise r.fail(f"{key}.missing", f"{label!r} is not one of the levels {names}")
        missing = names.index(label)
    spec = doc.get("levels", doc.get("ranges"))
    empty = [level for level, members in spec.items() if members == []]
    if any(missing is None or level != names[missing] for level in empty):
        raise r.fail(key, f"levels {empty} have no values; only the 'missing' level may be empty")
    if len(names) < 2:
        raise r.fail(key, "an attribute needs at least two levels")
    return Attribute(name, tuple(names), Binning(column, values, tuple(ranges), missing))


def _attributes(r: ConfigReader, doc: Any, key: str) -> tuple[Attribute, ...]:
    if not isinstance(doc, list) or not doc:
        raise r.fail(key, f"give at least one [[{key}]] attribute table")
    return tuple(_attribute(r, a, f"{key}[{i}]") for i, a in enumerate(doc))


def _positive_int(r: ConfigReader, value: Any, key: str, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 1
        or (high and value > high)
    ):
        limit = f" and at most {high}" if high else ""
        raise r.fail(key, f"{value!r} must be an integer >= 1{limit}")
    return value


def _positive_float(r: ConfigReader, value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise r.fail(key, f"{value!r} must be a positive number")
    return float(value)


def _roles(r: ConfigReader, doc: Any, individual: tuple[Attribute, ...], max_members: int) -> Roles:
    doc = r.table(
        doc,
        "relationships",
        {"attribute", "head", "spouse", "child", "max_members"},
        {"attribute", "head", "spouse", "child"},
    )
    name = r.string(doc["attribute"], "relationships.attribute")
    names = [a.name for a in individual]
    if name not in names:
        raise r.fail("relationships.attribute", f"{name!r} is not an individual attribute {names}")
    attr = individual[names.index(name)]

    def level(value: Any, key: str) -> int:
        label = r.string(value, key)
        if label not in attr.levels:
            raise r.fail(key, f"{label!r} is not a level of {name} {list(attr.levels)}")
        return attr.levels.index(label)

    def levels(value: Any, key: str) -> frozenset[int]:
        values = value if isinstance(value, list) else [value]
        return frozenset(level(v, key) for v in values)

    head = level(doc["head"], "relationships.head")
    spouse, child = (
        levels(doc["spouse"], "relationships.spouse"),
        levels(doc["child"], "relationships.child"),
    )
    if head in spouse | child or spouse & child:
        raise r.fail("relationships", "head, spouse and child levels must be distinct")
    cap = _positive_int(
        r, doc.get("max_members", max_members), "relationships.max_members", max_members
    )
    return Roles(names.index(name), head, spouse, child, cap)


def _options(r: ConfigReader, doc: Any, key: str, default: Any) -> Any:
    fields = type(default).__dataclass_fields__
    doc = r.table(doc, key, set(fields))
    values: dict[str, Any] = {}
    for name, value in doc.items():
        if isinstance(getattr(default, name), int):
            values[name] = _positive_int(r, value, f"{key}.{name}")
        else:
            values[name] = _positive_float(r, value, f"{key}.{name}")
    return type(default)(**{**default.__dict__, **values})


def load_synth_config(path: Path | str, project_root: Path | None = None) -> SynthConfig:
    """Parse and validate a synthetic-data config; raises ``ConfigError`` naming file and key."""
    path = Path(path)
    doc, r = parse_toml(path)
    sections = {
        "run",
        "input",
        "budget",
        "workload",
        "relationships",
        "group",
        "individual",
        "mwem",
        "hpd_fixed",
        "hpd_gen",
    }
    r.table(doc, "top level", sections, {"input", "budget", "group", "individual"})
    base = project_root or Path.cwd()
    run = run_options(r, doc.get("run", {}), base, path.stem)

    spec = r.table(
        doc["input"],
        "input",
        {
            "households",
            "persons",
            "format",
            "household_id",
            "member_order",
            "max_members",
            "larger_households",
        },
        {"households", "persons", "household_id", "member_order", "max_members"},
    )
    fmt = spec.get("format", "csv")
    if fmt not in INPUT_FORMATS:
        raise r.fail("input.format", f"{fmt!r} must be one of {INPUT_FORMATS}")
    larger = spec.get("larger_households", "refuse")
    if larger not in LARGER_HOUSEHOLDS:
        raise r.fail("input.larger_households", f"{larger!r} must be one of {LARGER_HOUSEHOLDS}")

    def data_path(key: str) -> Path:
        p = Path(r.string(spec[key], f"input.{key}"))
        return p if p.is_absolute() else base / p

    source = SynthInput(
        data_path("households"),
        data_path("persons"),
        fmt,
        r.string(spec["household_id"], "input.household_id"),
        r.string(spec["member_order"], "input.member_order"),
        larger == "drop",
    )
    max_members = _positive_int(r, spec["max_members"], "input.max_members", 10)
    group, individual = (
        _attributes(r, doc["group"], "group"),
        _attributes(r, doc["individual"], "individual"),
    )
    names = [a.name for a in (*group, *individual)]
    if len(set(names)) != len(names):
        raise r.fail("group/individual", f"attribute names must be unique: {names}")
    both = sorted({a.binning.column for a in group} & {a.binning.column for a in individual})
    if both:
        raise r.fail(
            "group/individual",
            f"column {both[0]!r} is declared at both levels; a column is a household (group) "
            "or a person (individual) attribute, not both",
        )
    roles = (
        _roles(r, doc["relationships"], individual, max_members) if "relationships" in doc else None
    )
    domain = HouseholdDomain(group, individual, max_members, roles)

    budget = r.table(
        doc["budget"],
        "budget",
        {"rho", "rounds", "rounds_at_rho", "select_share"},
        {"rho", "rounds"},
    )
    rho = r.fraction(budget["rho"], "budget.rho")
    share = r.fraction(budget.get("select_share", "1/2"), "budget.select_share")
    if rho <= 0:
        raise r.fail("budget.rho", f"{rho} must be > 0")
    if not 0 < share < 1:
        raise r.fail("budget.select_share", f"{share} must lie strictly between 0 and 1")
    rounds = _positive_int(r, budget["rounds"], "budget.rounds")
    rounds_at_rho = None
    if "rounds_at_rho" in budget:
        rounds_at_rho = r.fraction(budget["rounds_at_rho"], "budget.rounds_at_rho")
        if rounds_at_rho <= 0:
            raise r.fail("budget.rounds_at_rho", f"{rounds_at_rho} must be > 0")

    workload = r.table(doc.get("workload", {}), "workload", {"degree"})
    degree = _positive_int(
        r, workload.get("degree", min(3, len(names))), "workload.degree", len(names)
    )
    return SynthConfig(
        source=r.source,
        run=run,
        input=source,
        domain=domain,
        budget=SynthBudget(rho, rounds, share, rounds_at_rho),
        degree=degree,
        mwem=_options(r, doc.get("mwem", {}), "mwem", MwemOptions()),
        hpd_fixed=_options(r, doc.get("hpd_fixed", {}), "hpd_fixed", HpdFixedOptions()),
        hpd_gen=_options(r, doc.get("hpd_gen", {}), "hpd_gen", HpdGenOptions()),
    )
