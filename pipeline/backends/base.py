"""The backend interface."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..worker.spec import WorkerSpec

CODE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding pipeline/ and reference_models/


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    seconds: float
    timed_out: bool = False
    log_tail: str = ""  # last lines of the worker's stderr/stdout


class Backend(abc.ABC):
    """Runs worker specs, each in a fresh process with the determinism environment set
    before the interpreter starts."""

    name: str = "base"
    closed: bool = False  # set once the backend is left: no new worker may start

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True
        self.close()

    def close(self) -> None:
        """Release everything (processes, containers). Safe to call twice."""

    @abc.abstractmethod
    def image_info(self) -> dict[str, Any]:
        """{"name", "reference", "digest", "backend"} of what the workers run in."""

    def prepare_spec(self, spec: WorkerSpec, run_dir: Path) -> WorkerSpec:
        """Rewrite host paths in a spec to the paths the worker sees (identity by default)."""
        return spec

    @abc.abstractmethod
    def launch(self, spec: WorkerSpec, spec_file: Path, *, timeout: float) -> LaunchResult:
        """Run ``python -m pipeline.worker spec_file`` to completion or timeout."""
