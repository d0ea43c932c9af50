"""The op audit as ``reproci run`` sees it (``stages.base.Stage``): the ops each model runs and
what strict determinism does to them on CUDA, and their rows in every report. In a module of its
own because the reports read the package (``rows``, ``summary``) and this module reads the reports."""

from __future__ import annotations


from rich.console import Console

from ...reports import findings, markdown
from ..base import Stage, StageRun, attach_results
from . import run_model
from ...results import ModelEntry, ResultsDocument


class Audit(Stage):
    """The ops each model runs, and what strict determinism does to them on CUDA."""

    name = "audit"

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        attach_results(self.name, run_model, run, entries)

    def terminal(self, document: ResultsDocument, out: Console, err: Console) -> None:
        findings.print_audit(document, out)

    def markdown(self, document: ResultsDocument) -> list[str]:
        return markdown.audit_section(document)

    def html(self, document: ResultsDocument) -> str:
        from ...reports import html  # matplotlib, imported when a report is made

        return html.audit_section(document)


STAGE = Audit()
