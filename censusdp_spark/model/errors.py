"""Errors a user can act on: each names the file, the row or key, and the rule broken."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file breaks a rule; the message names the file and the key."""

    def __init__(self, source: str, key: str, rule: str) -> None:
        super().__init__(f"{source}: [{key}] {rule}")
        self.source = source
        self.key = key
        self.rule = rule


class InputError(ValueError):
    """An input table breaks a rule; the message names the file, the row/column and the rule."""

    def __init__(self, source: str, where: str, rule: str) -> None:
        super().__init__(f"{source}: {where}: {rule}")
        self.source = source
        self.where = where
        self.rule = rule


class GuaranteeViolation(RuntimeError):
    """The released estimates break a guarantee; the run must not be published."""


class SetupError(ValueError):
    """The environment cannot run a release (no Delta jars, no Spark Connect server at the given
    address); the message says what to run. A ``ValueError`` so every entry point prints it as one
    line."""
