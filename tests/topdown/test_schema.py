"""The schema's cell index: row-major over the attributes, and its labels read back."""

from __future__ import annotations

import numpy as np

from censusdp_spark.model.attribute import Attribute
from censusdp_spark.topdown.schema import Schema

SCHEMA = Schema(
    (
        Attribute("votingage", ("under18", "18plus")),
        Attribute("hisprace", ("hispanic", "white", "black")),
    )
)


def test_the_last_attribute_varies_fastest():
    assert SCHEMA.cell_of(np.array([[0, 0], [0, 2], [1, 0], [1, 2]])).tolist() == [0, 2, 3, 5]


def test_labels_of_names_each_cell_s_levels():
    labels = SCHEMA.labels_of(np.array([5, 0, 4]))
    assert labels["votingage"].tolist() == ["18plus", "under18", "18plus"]
    assert labels["hisprace"].tolist() == ["black", "hispanic", "white"]


def test_labels_of_inverts_cell_of_over_every_cell():
    cells = np.arange(SCHEMA.n_cells)
    labels = SCHEMA.labels_of(cells)
    indices = np.stack([[a.index_of(v) for v in labels[a.name]] for a in SCHEMA.attributes], axis=1)
    assert (SCHEMA.cell_of(indices) == cells).all()
