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
            OccupancyGroup(cells=(0, 1, 2), plus=("H",), minus=(), where="H"),
            OccupancyGroup(cells=(3, 4), plus=("G",), minus=(), where="G"),
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


def test_a_topdown_family_puts_no_one_in_a_child_without_dwellings():
    """``estimate.solve_family`` with the Providence config's group (every cell): children
    whose bits are 0 get nothing; the others hold the parent, cell by cell."""
    from pathlib import Path

    from censusdp_spark.topdown.config import load_topdown_config
    from censusdp_spark.topdown.estimate import level_plan, solve_family
    from censusdp_spark.topdown.readers import OCCUPIED

    root = Path(__file__).resolve().parents[2]
    plan = level_plan(
        load_topdown_config(root / "conf" / "pl94_e2e_providence.toml", root), "block"
    )
    rng = np.random.default_rng(7)
    parent = np.zeros(plan.n_cells, dtype=np.int64)
    parent[rng.choice(plan.n_cells, 40, replace=False)] = rng.integers(1, 6, 40)
    bits = [1, 0, 1, 0, 1]
    sizes = dict(zip(plan.query_names, plan.marginal_sizes, strict=True))
    rows = [
        {
            "geocode": f"44007000100{c}",
            "query": name,
            "noisy": list(rng.normal(1.0, 2.0, sizes[name])),
            "sigma2": "3/2",
            "inv_total": None,
            OCCUPIED: bits[c],
        }
        for c in range(len(bits))
        for name in sorted(plan.query_names)
    ]
    out = solve_family(plan, parent, pd.DataFrame(rows))
    held = {g: np.zeros(plan.n_cells, dtype=np.int64) for g in out["geocode"]}
    for g, cells, counts in zip(out["geocode"], out["cells"], out["counts"], strict=True):
        held[g][cells] = counts
    assert [int(held[g].sum() > 0) for g in sorted(held)] == bits
    np.testing.assert_array_equal(sum(held.values()), parent)
