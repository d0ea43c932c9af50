"""The op audit as ``reproci run`` sees it (``stages.base.Stage``): the ops each model runs and
what strict determinism does to them on CUDA, and their rows in every report (``report.py``).
In a module of its own because its report reads the package (``rows``, ``summary``) and this
module reads its report."""

from __future__ import annotations

from typing import Any

from ...results import ModelEntry
from ..base import Stage, StageRun, attach_results
from . import report, run_model
from .command import audit_cmd

EXPORTED = ("torch", "device", "ops_executed", "counts", "findings", "warnings", "error")  # of a model's audit


class Audit(Stage):
    """The ops each model runs, and what strict determinism does to them on CUDA."""

    name = "audit"
    report = report
    commands = (audit_cmd,)  # reproci audit --check-table: its table against this torch

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        attach_results(self.name, run_model, run, entries)

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        a = entry.get("audit")
        return {"audit": {k: a.get(k) for k in EXPORTED} if isinstance(a, dict) else None}


STAGE = Audit()
