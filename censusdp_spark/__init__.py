"""censusdp-spark: differentially private hierarchical statistics on Apache Spark.

Three releases of a confidential input organised in a geographic hierarchy, each written as
Delta tables and a ``manifest.json``:

* TopDown (:func:`run_topdown`) — counts of a schema's cells in every node, under ρ-zCDP
  (the Census Bureau's TopDown Algorithm);
* group sizes (:func:`run_group_sizes`) — households of each size in every node, under pure
  ε-DP;
* synthetic data (:func:`run_synth`) — synthetic households and their persons, under ρ-zCDP.

The public API, all of it importable from this package:

* :func:`check` and :func:`budget` — validate any release's config without Spark, and print
  how it spends its privacy budget (as ``censusdp check`` and ``censusdp budget``);
* :func:`optimize_budget` — a TopDown config's shares of ρ re-chosen for the tables a user
  names, from the config and its public spine (as ``censusdp budget --optimize``);
* :func:`run_topdown`, :func:`run_group_sizes`, :func:`run_synth` — run a release (as
  ``censusdp topdown``, ``group-sizes`` and ``synth``) and return its :class:`Release`;
* :func:`open_release` — the :class:`Release` in a folder a run wrote: its ``manifest``,
  ``budget``, ``tables``, and ``to_pandas(name)`` / ``spark(name)`` to read them (a TopDown
  ``cell`` decoded into one labelled column per attribute).

Example::

    from censusdp_spark import budget, check, open_release, run_topdown
    print(check("conf/ri_2010_demo.toml"))
    print(budget("conf/ri_2010_demo.toml"))
    release = run_topdown("conf/ri_2010_demo.toml", output="output/ri")
    estimates = open_release("output/ri").to_pandas("estimates")  # votingage, hisprace, count

Importing the package starts no Spark; the run and read functions import it when called.
``docs/reading-a-release.md`` describes a release's tables and manifest.

The code, for contributors: three releases over one shared core, imports going one way only
(checked by the import contracts in ``pyproject.toml``, ``lint-imports``):

* shared core, which imports no release:
  ``privacy`` (exact samplers, keyed ChaCha20 streams, the run secret, exact accounting) ·
  ``model`` (geography, errors, config reading) · ``engine`` (Spark plumbing: session,
  families, hierarchy) · ``io`` (readers' rules, the P.L. 94-171 layout, Delta tables) ·
  ``release`` (the one runner: output, lock, secret policy, resume, clock, manifest; the shared
  command-line flags);
* ``topdown`` — the Census TopDown Algorithm: config, schema, queries, readers (with ``pl94``,
  the P.L. 94-171 files), measure (with ``bypass`` and ``path_cuts``, bypassing single-child
  parents), estimate, checks, microdata, the P.L. 94-171 tables (``pl94_tables``,
  ``census_tables``), evaluate, job, cli; ``topdown.solvers`` (pure numpy/scipy: least squares,
  first order, rounding);
* ``group_sizes`` — households of each size per region (PGSR): config, readers, the Spark
  part, job, cli; ``group_sizes.solvers`` (cost tables, batch kernels, in-process tree driver,
  cumulative, relaxed QP, reference MILP);
* ``synth`` — hierarchical synthetic households and persons (numpy core; ``synth.spark``,
  ``synth.job`` and ``synth.cli`` are its Spark part and command);
* ``generate`` (synthetic national inputs), ``api`` and ``cli`` on top. Releases never import
  each other; within the core, ``release`` is above ``engine`` and ``io``, above ``model``,
  above ``privacy``; solvers, the privacy core, the numpy synth core, ``model``, ``release``
  and ``generate`` import no Spark.
* ``testing`` — yardsticks for the tests and the benchmarks (the exact GLS of a TopDown
  release, independent of the estimators); no production module imports it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from censusdp_spark.api import (
    Release,
    budget,
    check,
    open_release,
    optimize_budget,
    run_group_sizes,
    run_synth,
    run_topdown,
)

try:
    __version__ = version("censusdp-spark")
except PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
    __version__ = "unknown"

__all__ = [
    "Release",
    "budget",
    "check",
    "open_release",
    "optimize_budget",
    "run_group_sizes",
    "run_synth",
    "run_topdown",
]
