"""``censusdp``: the command line. Every user error is one line naming file, key/row and rule.

Building the parser imports only the standard library and the release's light ``cli`` modules,
so ``censusdp --help`` starts at once; each command imports what it runs when it runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import censusdp_spark
from censusdp_spark.generate.cli import add_generate_parser
from censusdp_spark.group_sizes.cli import add_group_sizes_parser
from censusdp_spark.release.flags import CommandParser, add_command, add_validate_flags
from censusdp_spark.synth.cli import add_synth_parser
from censusdp_spark.topdown.cli import (
    add_export_nmf_parser,
    add_optimizer_flags,
    add_topdown_parser,
)

DESCRIPTION = """\
Differentially private statistics on Apache Spark. Three releases, each run
from a TOML config (conf/ holds examples):

  topdown       counts per geography (the Census TopDown Algorithm, rho-zCDP)
  group-sizes   households of each size per geography (pure epsilon-DP)
  synth         synthetic households and persons (rho-zCDP)

Each writes Delta tables and a manifest.json to its [run] output. `topdown
--noisy-measurements` estimates from published noisy measurements instead (the
Census's Noisy Measurement File, or a release of ours), and `export-nmf` writes
a release's measurements in that file's layout. Before a
run, `check` validates a config (no Spark), `budget` prints how it spends its
privacy budget, and `validate` also reads the input and the secret (Spark).
`jars` fetches the Delta Lake jars a local session needs, once per user."""

EPILOG = """\
Start here:
  censusdp check --config conf/ri_2010_demo.toml
  censusdp budget --config conf/ri_2010_demo.toml
  censusdp topdown --config conf/ri_2010_demo.toml

`censusdp COMMAND --help` describes each command. A user error is one line on
stderr naming the file, key or row and the rule broken; the exit status is 2."""


def build_parser() -> argparse.ArgumentParser:
    """The ``censusdp`` parser: every command and option, each with its help."""
    parser = CommandParser(prog="censusdp", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {censusdp_spark.__version__}",
        help="print the installed censusdp-spark version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_command(
        sub,
        "check",
        help="validate a config of any release, without Spark or data; one line",
        description="Validate a config (every key and rule, the budget included) without"
        " starting Spark or reading data, and print a one-line summary.",
        run=_check,
    )
    budget = add_command(
        sub,
        "budget",
        help="print how a config of any release spends its privacy budget",
        description="Print whom a config's release protects (its privacy unit: how"
        " neighbouring inputs differ, and what is public), then its budget accounting:"
        " TopDown's rho and sigma per level and query, the group sizes' epsilon and noise"
        " scales per level, or synth's rho per measurement and round; then the total and"
        " its epsilon.",
        run=_budget,
    )
    budget.add_argument(
        "--epsilon",
        metavar="VALUE",
        help="the total epsilon, as the release's own --epsilon means it: group sizes, exact"
        " (e.g. 1/2), each level keeping its share; synth, at --delta, converted to rho"
        " (rounded down); TopDown takes none (its budget is rho)",
    )
    budget.add_argument("--delta", type=float, help="synth, with --epsilon (default: [run].delta)")
    add_optimizer_flags(budget)
    validate = sub.add_parser(
        "validate",
        help="check a config, its input and secret with Spark; writes nothing",
        description="Check any release's config, then read its input through the release's"
        " own reader and check its run secret; writes nothing and prints no count of people.",
    )
    add_validate_flags(validate)
    validate.set_defaults(run=_validate)
    add_topdown_parser(sub)
    add_export_nmf_parser(sub)
    add_group_sizes_parser(sub)
    add_synth_parser(sub)
    add_generate_parser(sub)
    jars = sub.add_parser(
        "jars",
        help="fetch the Delta Lake jars a local session needs, from Maven Central",
        description="Download the two Delta Lake jars Spark needs (delta-spark and"
        " delta-storage, the version this package pins), each checked against the SHA-1 Maven"
        " Central publishes beside it. Jars already there and matching are kept, so running"
        " it again fetches nothing. $CENSUSDP_MAVEN_URL names another Maven repository"
        " (a mirror).",
    )
    jars.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help="where to put them (default: the per-user cache where sessions look,"
        " $XDG_CACHE_HOME/censusdp/jars, else ~/.cache/censusdp/jars); sessions find"
        " another folder when $CENSUSDP_JARS names it",
    )
    jars.add_argument(
        "--class-archive",
        action="store_true",
        help="also record a class-data-sharing archive of the JVM classes a release loads,"
        " beside the jars (a minute or two, once): every local session then starts faster",
    )
    jars.set_defaults(run=_jars)
    return parser


def _check(args: argparse.Namespace) -> int:
    from censusdp_spark.api import check

    print(check(args.config))
    return 0


def _budget(args: argparse.Namespace) -> int:
    from censusdp_spark.api import budget, load_any_config, privacy_unit

    if args.optimize:
        return _budget_optimizer(args)

    config = load_any_config(args.config)
    table = budget(config, epsilon=args.epsilon, delta=args.delta)
    given = "" if args.epsilon is None else f" at --epsilon {args.epsilon}"
    given += "" if args.delta is None else f" --delta {args.delta:g}"
    print(f"budget of {args.config} ({config.run.name}){given}")
    print("\n".join(privacy_unit(config).lines()))
    print(table)
    return 0


def _budget_optimizer(args: argparse.Namespace) -> int:
    """``censusdp budget --optimize``: the allocation of the config's rho that minimises the
    workload's expected error on the config's spine (read for its node counts alone)."""
    from censusdp_spark.api import optimize_budget
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.topdown.strategy import refuse_existing

    if args.write_config is not None:  # before any work
        refuse_existing(args.write_config)
    spark = spark_session("censusdp-budget-optimizer", args.master)
    choice = optimize_budget(args.config, workload=args.workload, input=args.input, spark=spark)
    print(choice.text(), end="")
    if args.plot is not None:
        choice.plot(args.plot)
        print(f"plot written to {args.plot}")
    if args.write_config is not None:
        choice.write_config(args.write_config)
        print(f"config with this [budget] written to {args.write_config}")
    return 0


def _jars(args: argparse.Namespace) -> int:
    """``censusdp jars``: the pinned Delta jars into ``--dir`` or the per-user cache."""
    from censusdp_spark.engine.jars import DELTA_VERSION, cache_dir, fetch_delta_jars

    folder = args.dir if args.dir is not None else cache_dir()
    for jar in fetch_delta_jars(folder):
        done = f"fetched from {jar.url}" if jar.downloaded else "already there"
        print(f"{jar.path.name}: SHA-1 {jar.sha1} verified, {done}")
    print(f"Delta Lake {DELTA_VERSION} jars in {folder}")
    if args.dir is not None and folder.resolve() != cache_dir().resolve():
        print(f"sessions load them when CENSUSDP_JARS={folder}")
    if args.class_archive:
        from censusdp_spark.engine.class_archive import build_class_archive

        print(f"class archive recorded: {build_class_archive(folder)}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    """``censusdp validate`` for any release's config; writes nothing."""
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.model.config import release_kind
    from censusdp_spark.model.errors import ConfigError

    kind = release_kind(args.config)
    if kind == "topdown":
        from censusdp_spark.topdown.validate import run_validate_from_args

        return run_validate_from_args(args)
    if kind == "group_sizes":
        from censusdp_spark.group_sizes.config import load_group_sizes_config
        from censusdp_spark.group_sizes.validate import validate_group_sizes

        config = load_group_sizes_config(args.config)
        spark = spark_session(f"censusdp-validate-{config.run.name}", args.master, args.remote)
        print(validate_group_sizes(spark, config, args.input, args.secret_file))
        return 0
    from censusdp_spark.synth.config import load_synth_config
    from censusdp_spark.synth.validate import validate_synth

    if args.input is not None:
        raise ConfigError(str(args.config), "input", "--input is for one-table inputs, not synth's")
    synth = load_synth_config(args.config)
    spark = spark_session(f"censusdp-validate-{synth.run.name}", args.master, args.remote)
    print(validate_synth(spark, synth, args.secret_file))
    return 0


class _StageLines(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (it may be replaced, e.g. by pytest)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr, flush=True)


def _log_stages_to_stderr() -> None:
    """Stage lines (``[censusdp] measure: 3.1 s``) on stderr, once per process."""
    log = logging.getLogger("censusdp")
    if not log.handlers:
        handler = _StageLines()
        handler.setFormatter(logging.Formatter("[censusdp] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors a user can cause and read in one line (imported only once a command runs)."""
    from censusdp_spark.model.errors import ConfigError, InputError
    from censusdp_spark.privacy.accounting import BudgetError
    from censusdp_spark.release.runner import (
        OutputExistsError,
        ResumeError,
        RunLockedError,
        SecretError,
    )

    return (
        ConfigError,
        InputError,
        BudgetError,
        OutputExistsError,
        ResumeError,
        RunLockedError,
        SecretError,
        ValueError,
    )


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command line; a user error prints one line and exits 2."""
    _log_stages_to_stderr()
    user_errors = _user_errors()
    try:
        return int(args.run(args))
    except user_errors as err:
        print(f"censusdp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
