"""The throughput stage as ``reproci run`` sees it (``stages.base.Stage``): strict against default
mode per model, its table and report sections. In a module of its own because the reports read
the package (``NOISY_WIDTH``) and this module reads the reports."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from ...reports import markdown
from ...reports.terminal import print_throughput
from ..base import Stage, StageRun
from . import attach, run_model


class Throughput(Stage):
    """Strict against default mode, per model, in turns; a failed measurement makes the entry an ERROR."""

    name = "throughput"
    records = ("throughput",)

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        for model, entry in zip(run.options.models, entries):
            attach(entry, run_model(run, model))

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        print_throughput(document, out)

    def markdown_verdicts(self, document: dict[str, Any]) -> list[str]:
        return markdown.throughput(document)

    def html(self, document: dict[str, Any]) -> str:
        from ...reports import html  # matplotlib, imported when a report is made

        return html.throughput(document)


STAGE = Throughput()
