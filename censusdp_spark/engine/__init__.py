"""Spark engines: they move data to the pure-numpy privacy core and solvers and back."""
