"""The portability probes as ``reproci run`` sees them (``stages.base.Stage``): what each model's
results depend on, one setting changed at a time, and their rows in every report. In a module of
its own because the reports read the package (``rows``, the outcomes) and this module reads the reports."""

from __future__ import annotations


from rich.console import Console

from ...reports import findings, markdown
from ...settings.declared import BOOLEAN, Option
from ..base import Stage, StageRun, attach_results
from . import run_model
from ...results import ModelEntry, ResultsDocument


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
        findings.print_probes(document, out)

    def markdown(self, document: ResultsDocument) -> list[str]:
        return markdown.probes_section(document)

    def html(self, document: ResultsDocument) -> str:
        from ...reports import html  # matplotlib, imported when a report is made

        return html.probes_section(document)


STAGE = Probes()
