"""Yardsticks for the tests and the benchmarks, never for a release.

* :mod:`censusdp_spark.testing.gls_reference` — the exact generalised-least-squares estimate of
  every node's histogram from a finished TopDown release's noisy measurements, computed
  independently of the project's estimators and solvers (the tables are read from their Delta
  logs with pyarrow, not Spark).

No production module imports this package, and the reference imports none of the estimation
code it measures (both are import contracts in ``pyproject.toml``, checked by ``lint-imports``).
"""
