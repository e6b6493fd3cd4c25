"""Hierarchical synthetic data under zCDP: households (group attributes) and their members.

The core is pure numpy, no Spark. Layers, each importing only those above it (but for
``config``'s budget text, which plans the budget with ``adaptive`` and ``independent``):

* ``domain`` — attributes, binning of raw columns, encoded households (``Households``);
* ``config`` — the ``conf/synth_*.toml`` file, validated at the door;
* ``workloads`` — Q_G, Q_I, Q_R and size workloads and their vectorised answers on data;
* ``product`` — mixtures of product distributions and their expected answers and gradients;
* ``adaptive`` — Adaptive Measurements: budget split, exponential and Gaussian mechanisms, rounds;
* ``mwem``, ``hpd`` (HPD-Fixed, HPD-Gen), ``independent`` — the methods (named in ``methods``);
* ``sampling`` — synthetic households from a fitted model; ``evaluation`` — errors vs the truth;
* ``synthesise`` — one run of a method, from true answers to synthetic households;
* ``spark``, ``job``, ``validate`` and ``cli`` — the Spark part, the ``censusdp synth`` command
  and ``censusdp validate`` of a synth config.
"""
