"""The synthetic-data methods, by name (``censusdp synth --method``).

Apart from the config so the command line lists them without importing the numpy core.
"""

from __future__ import annotations

from typing import Literal, cast, get_args

Method = Literal["mwem", "hpd_fixed", "hpd_gen", "independent"]
METHODS: tuple[str, ...] = get_args(Method)


def method_named(name: str) -> Method:
    """The method ``name`` names (``--method``, ``run_synth(method=...)``); anything else is a
    ``ValueError`` listing them."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; one of {METHODS}")
    return cast(Method, name)
