"""Which steps of a run are complete, kept in the run's private folder so a killed driver can
resume: a resumed run never redraws a committed noisy measurement and skips finished levels.

The state file is replaced atomically after each committed step; it holds step names and a
hash of the config, nothing confidential.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


class OutputExistsError(RuntimeError):
    """The output folder holds a previous release and ``--overwrite`` was not given."""


class ResumeError(RuntimeError):
    """``--resume`` was asked for a run that cannot be resumed (no state, or another config)."""


@dataclass
class RunState:
    config_sha256: str
    output: str
    measured: bool = False
    levels_done: list[str] = field(default_factory=list)
    bottom_up_done: list[str] = field(default_factory=list)  # full_information's first pass

    @staticmethod
    def path(private_dir: Path) -> Path:
        return private_dir / "state.json"

    def save(self, private_dir: Path) -> None:
        private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self.path(private_dir)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, target)

    @classmethod
    def load(cls, private_dir: Path) -> RunState | None:
        target = cls.path(private_dir)
        if not target.exists():
            return None
        return cls(**json.loads(target.read_text()))


def config_digest(config_text: str, input_path: str) -> str:
    return hashlib.sha256(f"{config_text}\0{input_path}".encode()).hexdigest()


def resume_state(private_dir: Path, digest: str, output: Path) -> RunState:
    state = RunState.load(private_dir)
    if state is None:
        raise ResumeError(f"{RunState.path(private_dir)}: no run state to resume from")
    if state.config_sha256 != digest or state.output != str(output):
        raise ResumeError(
            f"{RunState.path(private_dir)}: the run was started with another config, input or output"
        )
    return state
