"""Shared Spark plumbing: the session and Delta's jars, families of rows through pandas, the
hierarchy's true histograms, progress lines; they move data to the pure-numpy cores and back."""
