"""The public model of a release: schema, marginal queries, geography and validated config.

Everything here is pure Python/numpy and knows nothing of Spark.
"""
