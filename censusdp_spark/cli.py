"""``censusdp``: the command line. Every user error is one line naming file, key/row and rule."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from censusdp_spark.engine.session import add_remote_flag
from censusdp_spark.generate.cli import add_generate_parser, run_generate
from censusdp_spark.group_sizes.config import budget_text as group_sizes_budget
from censusdp_spark.group_sizes.config import load_pgsr_config
from censusdp_spark.group_sizes.job import add_pgsr_parser, run_pgsr_from_args
from censusdp_spark.model.config import release_kind
from censusdp_spark.model.errors import ConfigError, InputError
from censusdp_spark.privacy.accounting import BudgetError, budget_table
from censusdp_spark.release.runner import (
    OutputExistsError,
    ResumeError,
    RunLockedError,
    SecretError,
    add_release_flags,
)
from censusdp_spark.synth.config import budget_text as synth_budget
from censusdp_spark.synth.config import load_synth_config
from censusdp_spark.synth.job import add_synth_parser, run_synth_from_args
from censusdp_spark.topdown.config import load_config
from censusdp_spark.topdown.validate import add_validate_parser, run_validate_from_args

DEFAULTS = argparse.ArgumentDefaultsHelpFormatter


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="censusdp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    budget = sub.add_parser(
        "budget", help="print the privacy budget table of a config", formatter_class=DEFAULTS
    )
    budget.add_argument("--config", required=True, type=Path)
    topdown = sub.add_parser("topdown", help="run the TopDown release", formatter_class=DEFAULTS)
    topdown.add_argument("--config", required=True, type=Path)
    topdown.add_argument("--input", type=Path, help="override [input].path")
    add_release_flags(topdown)
    topdown.add_argument(
        "--resume", action="store_true", help="continue a killed run from its last complete step"
    )
    topdown.add_argument(
        "--variances",
        action="store_true",
        help="also write total_variances: the bottom-up variance of every node's total"
        ' (needs [estimation] method = "full_information")',
    )
    topdown.add_argument(
        "--master", default="local[*]", help="Spark master when not launched by spark-submit"
    )
    add_remote_flag(topdown)
    add_generate_parser(sub)
    add_synth_parser(sub)
    add_pgsr_parser(sub)
    add_validate_parser(sub)
    return parser


def _budget(args: argparse.Namespace) -> int:
    """The budget table of any release's config."""
    kind = release_kind(args.config)
    if kind == "topdown":
        topdown = load_config(args.config)
        name, table = (
            topdown.run.name,
            budget_table(topdown.budget, topdown.run.delta, topdown.bypass_single_child),
        )
    elif kind == "group_sizes":
        groups = load_pgsr_config(args.config)
        name, table = groups.run.name, group_sizes_budget(groups)
    else:
        synth = load_synth_config(args.config)
        name, table = synth.run.name, synth_budget(synth)
    print(f"budget of {args.config} ({name})")
    print(table)
    return 0


def _validate(args: argparse.Namespace) -> int:
    """``censusdp validate`` for any release's config; writes nothing."""
    from censusdp_spark.engine.session import spark_session

    kind = release_kind(args.config)
    if kind == "topdown":
        return run_validate_from_args(args)
    if kind == "group_sizes":
        from censusdp_spark.group_sizes.validate import validate_group_sizes

        config = load_pgsr_config(args.config)
        spark = spark_session(f"censusdp-validate-{config.run.name}", args.master, args.remote)
        print(validate_group_sizes(spark, config, args.input, args.secret_file))
        return 0
    from censusdp_spark.synth.validate import validate_synth

    if args.input is not None:
        raise ConfigError(str(args.config), "input", "--input is for one-table inputs, not synth's")
    synth = load_synth_config(args.config)
    spark = spark_session(f"censusdp-validate-{synth.run.name}", args.master, args.remote)
    print(validate_synth(spark, synth, args.secret_file))
    return 0


def _topdown(args: argparse.Namespace) -> int:
    from censusdp_spark.engine.session import spark_session
    from censusdp_spark.topdown.job import TopDownOptions, run_topdown

    config = load_config(args.config)
    if args.variances and config.estimation_method != "full_information":
        raise ConfigError(
            str(args.config),
            "estimation.method",
            f'--variances needs "full_information", not {config.estimation_method!r}',
        )
    options = TopDownOptions(
        args.input,
        args.output,
        args.secret_file,
        args.evaluate,
        args.overwrite,
        args.resume,
        args.reuse_secret,
        args.variances,
        args.evaluation_output,
    )
    spark = spark_session(f"censusdp-topdown-{config.run.name}", args.master, args.remote)
    summary = run_topdown(spark, config, options)
    print(summary.text())
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _log_stages_to_stderr()
    try:
        commands = {
            "budget": _budget,
            "topdown": _topdown,
            "generate": run_generate,
            "synth": run_synth_from_args,
            "pgsr": run_pgsr_from_args,
            "validate": _validate,
        }
        return commands[args.command](args)
    except (
        ConfigError,
        InputError,
        BudgetError,
        OutputExistsError,
        ResumeError,
        RunLockedError,
        SecretError,
        ValueError,
    ) as err:
        print(f"censusdp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
