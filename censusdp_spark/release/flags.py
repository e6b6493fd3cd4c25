"""The command line's shared flags and its one help style, for every release's command.

This module imports only the standard library, so that building the whole ``censusdp`` parser
(``censusdp --help``) starts no Spark and loads no numerical library: each command imports
what it runs only when it runs.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions and epilogs wrapped paragraph by paragraph, their indented lines (lists,
    examples) kept as written; an option's default shown after its help only when it has one
    worth showing (not ``None`` or ``False``) that the help does not already state."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = text.split("\n\n")
        return "\n\n".join(
            "\n".join(indent + line for line in paragraph.splitlines())
            if any(line.startswith(" ") for line in paragraph.splitlines())
            else textwrap.fill(
                " ".join(paragraph.split()), width, initial_indent=indent, subsequent_indent=indent
            )
            for paragraph in paragraphs
        )

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        silent = action.default in (None, False, argparse.SUPPRESS)
        if silent or not action.option_strings or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` in the shared help style; its subcommands inherit both."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    description: str,
    run: Callable[[argparse.Namespace], int],
    aliases: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """Add the command ``name`` (and its ``aliases``) to the CLI's subparsers, with
    ``--config`` (every command that reads a release's config has it) and ``run`` to run it."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, aliases=list(aliases), help=help, description=description
    )
    add_config_flag(parser)
    parser.set_defaults(run=run)
    return parser


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """``--config CONF``: the release's TOML file (required by every command that has it)."""
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        metavar="CONF",
        help="the release's TOML config, e.g. conf/ri_2010_demo.toml",
    )


def add_input_flag(parser: argparse.ArgumentParser) -> None:
    """``--input PATH``: read another file than the config's ``[input] path``."""
    parser.add_argument("--input", type=Path, metavar="PATH", help="override [input].path")


def add_secret_flag(parser: argparse.ArgumentParser) -> None:
    """``--secret-file PATH``: the run secret, instead of the config's or a generated one."""
    parser.add_argument(
        "--secret-file",
        type=Path,
        metavar="PATH",
        help="file with the 64-hex-char run secret (mode 0600); if the config's [run]"
        " secret_env variable is also set, it must hold the same secret",
    )


def add_release_flags(parser: argparse.ArgumentParser) -> None:
    """The options every release's command shares: output, secret, evaluation, overwrite and
    ``--reuse-secret`` (the one way past the secret binding, for experiments only)."""
    parser.add_argument("--output", type=Path, metavar="PATH", help="override [run].output")
    add_secret_flag(parser)
    parser.add_argument(
        "--evaluate",
        action="store_true",
        help="also write error against the truth (internal, beside the release, never in it)",
    )
    parser.add_argument(
        "--evaluation-output",
        type=Path,
        metavar="PATH",
        help="where --evaluate writes (default: <output>.evaluation beside the release)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument(
        "--reuse-secret",
        action="store_true",
        help="allow a secret already bound to another release (experiments comparing runs on"
        " identical noise; the output is marked not for release)",
    )


def add_spark_flags(parser: argparse.ArgumentParser) -> None:
    """``--master`` and ``--remote``: where Spark runs when the command starts it."""
    parser.add_argument(
        "--master",
        help="Spark master when not launched by spark-submit"
        " (default: $CENSUSDP_MASTER, else local[*])",
    )
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run on this Spark Connect server instead of a local JVM"
        " (default: $SPARK_REMOTE; unset: no server)",
    )


def add_validate_flags(parser: argparse.ArgumentParser) -> None:
    """The options of ``censusdp validate`` (any release's config, its input and secret)."""
    add_config_flag(parser)
    add_input_flag(parser)
    add_secret_flag(parser)
    add_spark_flags(parser)
