"""The group-size release: per node of a public geography, the number of groups (households)
of each size 1..N, under pure ε-DP.

One module per concern: ``config`` (the TOML, typed at the door; ``Mechanism``), ``readers``
(the input to leaf histograms), ``memory`` and ``shapes`` (the memory check at the door, from
the public geography), ``measure`` (the noise pass and its privacy claim), ``exact`` (the
dynamic program on Spark with its certificate loop), ``baselines`` (``relaxed``,
``relaxed_families``, ``cumulative``), ``rows`` (the Spark rows they share), ``checks`` (the
guarantees), ``evaluate`` (``--evaluate``), ``job`` (the stages, the manifest), ``validate``
and ``cli``; ``solvers/`` holds the pure-numpy solvers, Spark-free.
"""
