"""The portability probes as ``reproci run`` sees them (``stages.base.Stage``): what each model's
results depend on, one setting changed at a time, and their rows in every report (``report.py``).
In a module of its own because its report reads the package (``rows``, the outcomes) and this
module reads its report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import errors, typed
from ...results import ModelEntry, ResultsDocument
from ...settings.declared import BOOLEAN, setting
from ...settings.models import ModelRef
from ..base import Stage, StageRun, attach_results
from . import fails, report, run_model
from .result import ProbesResult, of


@dataclass(frozen=True, kw_only=True)
class ProbesOptions:
    probes_fail: bool = setting(
        False, flag=True, yaml=BOOLEAN, convert=bool, record=True,
        needs_stage=("probes", "fails a run on what the portability probes find"),
        help="A dependency found by --stage probes fails the run (exit 1) instead of being reported.")


class Probes(Stage):
    """What each model's results depend on, one setting changed at a time."""

    name = "probes"
    result = ProbesResult
    report = report
    options = ProbesOptions

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        attach_results(self.name, _probes, run, entries)

    def exit_code(self, document: ResultsDocument, code: int) -> int:
        """With --probes-fail, a dependency on the environment fails a run that passed otherwise:
        it is not reproducible elsewhere."""
        if code == errors.EXIT_PASS and fails(document):
            return errors.EXIT_REPRO_FAILURE
        return code

    def annotations(self, document: ResultsDocument) -> list[str]:
        """An annotation per dependency: an error with --probes-fail, else a notice."""
        return report.dependency_annotations(document)

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        p = of(entry)
        return {"probes": None if p is None else typed.dump(p.rows)}


def _probes(run: StageRun, model: ModelRef) -> dict[str, Any]:
    """A model's probes as its entry holds them: the JSON of its result."""
    return run_model(run, model).to_json()


STAGE = Probes()
