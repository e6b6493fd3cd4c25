"""Accuracy against the confidential truth, per query class: for internal evaluation only."""

from __future__ import annotations

from typing import Any

import numpy as np

from censusdp_spark.synth.workloads import KINDS, WorkloadSet


def error_rows(
    truth: np.ndarray, estimate: np.ndarray, workloads: WorkloadSet, target: str
) -> list[dict[str, Any]]:
    """Max and mean absolute error of each query class present in ``workloads``."""
    rows = []
    for kind in KINDS:
        mask = workloads.of_kind(kind)
        if not mask.any():
            continue
        err = np.abs(truth[mask] - estimate[mask])
        rows.append(
            {
                "target": target,
                "query_class": kind,
                "queries": int(mask.sum()),
                "max_error": float(err.max()),
                "mean_error": float(err.mean()),
            }
        )
    return rows
