"""``topdown.occupancy``: which entries of a family the occupancy groups allow."""

from __future__ import annotations

import numpy as np
import pandas as pd

from censusdp_spark.topdown.config import OccupancyGroup
from censusdp_spark.topdown.occupancy import EVERY_GROUP, allowed_entries, group_cells


def groups() -> tuple[np.ndarray, ...]:
    """Six cells: 0-2 housing units (group 0), 3-4 one facility type (group 1), 5 in none."""
    return group_cells(
        (
            OccupancyGroup((0, 1, 2), ("H",), (), "H"),
            OccupancyGroup((3, 4), ("G",), (), "G"),
        ),
        6,
    )


def test_a_child_holds_the_cells_of_its_groups_and_the_cells_of_none():
    bits = pd.Series([0b00, 0b01, 0b10, 0b11, None])
    allowed = allowed_entries(groups(), bits, np.arange(6))
    assert allowed is not None
    assert allowed.astype(int).tolist() == [
        [0, 0, 0, 0, 0, 1],  # no dwelling: only the cell no group holds
        [1, 1, 1, 0, 0, 1],
        [0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],  # no bits: every group
    ]


def test_only_the_active_cells_are_returned_and_no_groups_allow_everything():
    allowed = allowed_entries(groups(), pd.Series([0b10]), np.array([1, 3, 5]))
    assert allowed is not None and allowed.tolist() == [[False, True, True]]
    assert allowed_entries((), pd.Series([0]), np.arange(6)) is None
    assert allowed_entries(groups(), None, np.arange(6)) is None
    assert EVERY_GROUP & 0b11 == 0b11
