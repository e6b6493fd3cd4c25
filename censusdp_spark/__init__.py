"""censusdp-spark: differentially private hierarchical statistics on Apache Spark.

Three releases over one shared core; imports go one way only, checked by the import contracts
in ``pyproject.toml`` (``lint-imports``):

* shared core, which imports no release:
  ``privacy`` (exact samplers, keyed ChaCha20 streams, the run secret, exact accounting) ·
  ``model`` (geography, errors, config reading) · ``engine`` (Spark plumbing: session,
  families, hierarchy) · ``io`` (readers' rules, Delta tables) · ``release`` (the one runner:
  output, lock, secret policy, resume, clock, manifest);
* ``topdown`` — the Census TopDown Algorithm: config, schema, queries, readers, measure,
  estimate, checks, microdata, evaluate, job; ``topdown.solvers`` (pure numpy/scipy: least
  squares, first order, rounding);
* ``group_sizes`` — households of each size per region (PGSR): config, readers, the Spark
  part, job; ``group_sizes.solvers`` (cost tables, batch kernels, in-process tree driver,
  cumulative, relaxed QP, reference MILP);
* ``synth`` — hierarchical synthetic households and persons (numpy core; ``synth.spark`` and
  ``synth.job`` are its Spark part);
* ``generate`` (synthetic national inputs) and ``cli`` on top. Releases never import each
  other; solvers, the privacy core and the numpy synth core import no Spark.

The Python API (:mod:`censusdp_spark.api`), one call per release, each returning a
:class:`~censusdp_spark.api.Release` (Delta tables, manifest, checks)::

    from censusdp_spark import run_topdown, run_group_sizes, run_synth, budget
    release = run_topdown("conf/ri_2010_demo.toml", output="output/ri")
    release.tables["estimates"], release.manifest, release.checks

The run functions import Spark only when called.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("censusdp-spark")
except PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
    __version__ = "unknown"

__all__ = ["Release", "budget", "check", "run_group_sizes", "run_synth", "run_topdown"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from censusdp_spark import api

        return getattr(api, name)
    raise AttributeError(f"module 'censusdp_spark' has no attribute {name!r}")
