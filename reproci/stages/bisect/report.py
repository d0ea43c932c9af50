"""The bisection in every report, each built from the same rows (``stages.bisect.rows``, a row
per bisected model): its table in what ``reproci run`` prints, or its one line when it had
nothing to bisect (``stages.bisect.nothing``), its section of the Markdown report and of the
HTML report."""

from __future__ import annotations

from html import escape

from rich.console import Console
from rich.markup import escape as markup
from rich.table import Table

from ...reports.mdtable import plain_table
from ...results import ResultsDocument
from . import nothing, rows, stages_text

TITLE = "Bisection: the first factor whose removal restores equality"


def table(document: ResultsDocument) -> Table | None:
    """The terminal table; None where no model was bisected."""
    found = rows(document)
    if not found:
        return None
    t = Table(title=TITLE, title_justify="left")
    for name in ("model", "cause"):
        t.add_column(name, no_wrap=True)
    for name in ("stages", "finding"):
        t.add_column(name, overflow="fold")
    for model, r in found:
        t.add_row(model, f"[bold yellow]{markup(str(r.culprit))}[/]" if r.culprit else "[dim]—[/]",
                  markup(stages_text(r)), markup(r.message))
    return t


def terminal(document: ResultsDocument, console: Console) -> None:
    """The table, or the one line when the bisection had nothing to do."""
    t = table(document)
    if t is not None:
        console.print(t)
    line = nothing(document)
    if line:
        console.print(line, highlight=False, markup=False)


def markdown(document: ResultsDocument) -> list[str]:
    """The Markdown section; empty where no model was bisected."""
    found = rows(document)
    if not found:
        return []
    return [f"### {TITLE}", "", *plain_table(["model", "check", "cause", "stages", "finding"], [
        [model, r.check or "—", r.culprit or "—", stages_text(r), r.message] for model, r in found]), ""]


def html(document: ResultsDocument) -> str:
    """The HTML section; empty where no model was bisected."""
    from ...reports import html as page  # matplotlib, imported when a report is made

    found = rows(document)
    if not found:
        return ""
    cells = [[escape(str(model)), escape(r.check or "—"), escape(str(r.culprit or "—")),
              escape(stages_text(r)), page.prose(r.message)] for model, r in found]
    return (f'<section id="bisect"><h2>{escape(TITLE)}</h2>'
            + page.table(["model", "check", "cause", "stages", "finding"], cells) + "</section>")
