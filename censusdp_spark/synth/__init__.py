"""Hierarchical synthetic data under zCDP: households (group attributes) and their members.

Pure numpy, no Spark. Layers, each importing only those above it:

* ``domain`` — attributes, binning of raw columns, encoded households (``Households``);
* ``config`` — the ``conf/synth_*.toml`` file, validated at the door;
* ``workloads`` — Q_G, Q_I, Q_R and size workloads and their vectorised answers on data;
* ``product`` — mixtures of product distributions and their expected answers and gradients;
* ``adaptive`` — Adaptive Measurements: budget split, exponential and Gaussian mechanisms, rounds;
* ``mwem``, ``hpd`` (HPD-Fixed, HPD-Gen), ``independent`` — the methods (named in ``methods``);
* ``sampling`` — synthetic households from a fitted model; ``evaluation`` — errors vs the truth;
* ``synthesise`` — one run of a method, from true answers to synthetic households;
* ``spark``, ``job`` and ``cli`` — the Spark part and the ``censusdp synth`` command.
"""
