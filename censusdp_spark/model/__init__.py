"""The shared model of a release: the geographic hierarchy, the categorical attribute (a name
and its levels), the errors a user can act on, the config reading every release shares
(``[run]``, ``[geography]``, exact fractions, unknown keys refused) and sizes of memory.

Everything here is pure Python and knows nothing of Spark.
"""
