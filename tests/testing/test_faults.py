"""The fault observers: they fire at their step only, and travel to executors by pickle."""

from __future__ import annotations

import pickle

import pytest

from censusdp_spark.testing.faults import FailAfter, InjectedFault, KillDriverAfter, KillWorkerOnce
from censusdp_spark.topdown.observer import QUIET


def test_a_driver_fault_lets_every_other_step_pass():
    fault = KillDriverAfter("tract")
    for step in ("measure", "nation", "bottom_up_tract", "block"):
        fault.step_committed(step)  # the process is still here
    fault.task_started()


def test_a_raised_fault_fires_at_its_step_only():
    fault = FailAfter("county")
    for step in ("measure", "bottom_up_county", "nation", "tract"):
        fault.step_committed(step)
    fault.task_started()
    with pytest.raises(InjectedFault, match="after step county"):
        fault.step_committed("county")


def test_a_worker_fault_does_nothing_once_its_marker_exists(tmp_path):
    marker = tmp_path / "killed-once"
    marker.touch()
    fault = KillWorkerOnce(marker)
    fault.task_started()
    fault.step_committed("block")


def test_observers_survive_the_trip_to_an_executor(tmp_path):
    for observer in (
        QUIET,
        KillDriverAfter("block"),
        FailAfter("block"),
        KillWorkerOnce(tmp_path / "m"),
    ):
        copy = pickle.loads(pickle.dumps(observer))
        assert type(copy) is type(observer) and vars(copy) == vars(observer)
