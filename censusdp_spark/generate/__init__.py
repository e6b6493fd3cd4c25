"""Synthetic inputs for scaling runs, clearly labelled SYNTHETIC (pure numpy/pandas/pyarrow).

``national``: block-level counts for the 2020 United States on the real tract spine;
``production``: person microdata for the 2020 production schema on the same blocks.
"""
