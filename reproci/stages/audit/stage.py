"""The op audit as ``reproci run`` sees it (``stages.base.Stage``): the ops each model runs and
what strict determinism does to them on CUDA, and their rows in every report (``report.py``).
In a module of its own because its report reads the package (``rows``, ``summary``) and this
module reads its report."""

from __future__ import annotations

from typing import Any

from ... import typed
from ...results import ModelEntry
from ...settings.models import ModelRef
from ..base import Stage, StageRun, attach_results
from . import report, run_model
from .command import audit_cmd
from .result import AuditResult, of


class Audit(Stage):
    """The ops each model runs, and what strict determinism does to them on CUDA."""

    name = "audit"
    result = AuditResult
    report = report
    commands = (audit_cmd,)  # reproci audit --check-table: its table against this torch

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        attach_results(self.name, _audit, run, entries)

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        a = of(entry)
        return {"audit": None if a is None else {
            "torch": a.torch, "device": a.device, "ops_executed": a.ops_executed, "counts": a.counts,
            "findings": typed.dump(a.findings), "warnings": a.warnings, "error": typed.dump(a.error)}}


def _audit(run: StageRun, model: ModelRef) -> dict[str, Any]:
    """A model's audit as its entry holds it: the JSON of its result."""
    return run_model(run, model).to_json()


STAGE = Audit()
