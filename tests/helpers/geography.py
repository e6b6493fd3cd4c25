"""The public geography of the SYNTHETIC national inputs, for the tests that estimate a run's
memory from it."""

from __future__ import annotations

import numpy as np

from censusdp_spark.model.geography import LevelShape


def national_shapes_of() -> list[LevelShape]:
    """The shape of the SYNTHETIC national input of ``conf/pgsr_national.toml`` (seed 2020),
    from its generator's national layout, without generating the 8.1 M blocks."""
    from censusdp_spark.generate.national import ModelParameters, draw_layout, load_spine

    layout = draw_layout(load_spine(), 2020, ModelParameters())
    spine = layout.spine
    _, county = np.unique(spine.county, return_inverse=True)
    _, state = np.unique(spine.state, return_inverse=True)
    tract_bgs = np.bincount(layout.bg_tract, minlength=spine.code.size)
    bg_county, bg_state = county[layout.bg_tract], state[layout.bg_tract]
    counties_per_state = np.bincount(np.unique(np.stack([state, county]), axis=1)[0])
    per = np.bincount
    shapes = [
        LevelShape("nation", 1, 1, 1),
        LevelShape("state", state.max() + 1, state.max() + 1, state.max() + 1),
        LevelShape("county", county.max() + 1, counties_per_state.max(), county.max() + 1),
        LevelShape("tract", spine.code.size, per(county).max(), spine.code.size),
        LevelShape("block_group", tract_bgs.sum(), tract_bgs.max(), per(bg_state).max()),
        LevelShape(
            "block",
            layout.bg_blocks.sum(),
            layout.bg_blocks.max(),
            per(bg_county, layout.bg_blocks).astype(np.int64).max(),
        ),
    ]
    return [
        LevelShape(s.name, *(int(x) for x in (s.nodes, s.largest_family, s.largest_noise_group)))
        for s in shapes
    ]
