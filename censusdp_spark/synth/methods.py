"""The synthetic-data methods, by name (``censusdp synth --method``).

Apart from the config so the command line lists them without importing the numpy core.
"""

from __future__ import annotations

from typing import Literal, get_args

Method = Literal["mwem", "hpd_fixed", "hpd_gen", "independent"]
METHODS: tuple[str, ...] = get_args(Method)
