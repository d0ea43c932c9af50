"""The upgrade blame in what ``reproci run`` prints: its one line when it had nothing to blame
(``stages.blame.nothing``). What it found is in each blamed model's verdict message, which the
verdict tables of every report show; it has no section of its own in the Markdown or HTML report."""

from __future__ import annotations

from rich.console import Console

from ...results import ResultsDocument
from . import nothing


def terminal(document: ResultsDocument, console: Console) -> None:
    """The one line when the blame had nothing to do."""
    line = nothing(document)
    if line:
        console.print(line, highlight=False, markup=False)
