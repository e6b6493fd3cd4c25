"""censusdp-spark: differentially private hierarchical statistics on Apache Spark.

Layers, imported one way only:
privacy (samplers, keyed streams, accounting) -> model (config, schema, queries, spine)
-> solvers (pure numpy/scipy) -> engine (Spark measurement/estimation) -> io (Delta)
-> jobs and the CLI.
"""

__version__ = "0.1.0"
