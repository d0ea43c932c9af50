"""The portability probes as ``reproci run`` sees them (``stages.base.Stage``): what each model's
results depend on, one setting changed at a time, and their rows in every report (``report.py``).
In a module of its own because its report reads the package (``rows``, the outcomes) and this
module reads its report."""

from __future__ import annotations

from rich.console import Console

from ...results import ModelEntry, ResultsDocument
from ...settings.declared import BOOLEAN, Option
from ..base import Stage, StageRun, attach_results
from . import report, run_model


class Probes(Stage):
    """What each model's results depend on, one setting changed at a time."""

    name = "probes"
    options = (
        Option(name="probes_fail", group="probes", flag=True, yaml=BOOLEAN, default=False, convert=bool, record=True,
               needs_stage=("probes", "fails a run on what the portability probes find"),
               help="A dependency found by --stage probes fails the run (exit 1) instead of being reported."),
    )

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        attach_results(self.name, run_model, run, entries)

    def terminal(self, document: ResultsDocument, out: Console, err: Console) -> None:
        report.terminal(document, out)

    def markdown(self, document: ResultsDocument) -> list[str]:
        return report.markdown(document)

    def html(self, document: ResultsDocument) -> str:
        return report.html(document)


STAGE = Probes()
