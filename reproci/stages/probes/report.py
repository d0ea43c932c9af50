"""The portability probes in every report, each built from the same rows (``stages.probes.rows``,
a row per model and probe): their table in what ``reproci run`` prints (with the line saying that
``--probes-fail`` fails the run), their section of the Markdown report and of the HTML report, an
annotation per dependency in GitHub Actions, and the dependencies that failed the run in the
webhook's alert."""

from __future__ import annotations

from html import escape

from rich.console import Console
from rich.markup import escape as markup
from rich.table import Table
from rich.text import Text

from ...reports.github import annotation
from ...reports.mdtable import plain_table
from ...results import ResultsDocument
from . import DEPENDS, FAILED, INDEPENDENT, NOT_APPLICABLE, fails, probes_fail, rows

TITLE = "Portability probes: what the results depend on"
HEADER = ["model", "probe", "result", "evidence"]
STYLE = {DEPENDS: "bold yellow", INDEPENDENT: "green", NOT_APPLICABLE: "dim", FAILED: "bold red"}


def table(document: ResultsDocument) -> Table | None:
    """The terminal table; None where no probe ran."""
    found = rows(document)
    if not found:
        return None
    t = Table(title=TITLE, title_justify="left")
    for name in HEADER[:3]:
        t.add_column(name, no_wrap=True)
    t.add_column(HEADER[3], overflow="fold")
    for model, r in found:
        t.add_row(model, r.probe, Text(r.status, style=STYLE.get(r.status, "")), markup(r.message))
    return t


def terminal(document: ResultsDocument, console: Console) -> None:
    """The table; with ``--probes-fail``, the line saying a dependency fails the run."""
    t = table(document)
    if t is None:
        return
    console.print(t)
    if fails(document):
        console.print("portability dependencies found and --probes-fail is set: this run fails (exit 1)", highlight=False)


def markdown(document: ResultsDocument) -> list[str]:
    """The Markdown section; empty where no probe ran."""
    found = rows(document)
    if not found:
        return []
    return [f"### {TITLE}", "", *plain_table(HEADER, [[model, r.probe, r.status, r.message] for model, r in found]), ""]


def html(document: ResultsDocument) -> str:
    """The HTML section; empty where no probe ran."""
    from ...reports import html as page  # matplotlib, imported when a report is made

    found = rows(document)
    if not found:
        return ""
    cells = [[escape(str(model)), escape(r.probe),
              f'<span class="{"bad" if r.status == DEPENDS else ""}">{escape(r.status)}</span>',
              page.prose(r.message)] for model, r in found]
    return f'<section id="probes"><h2>{escape(TITLE)}</h2>' + page.table(HEADER, cells) + "</section>"


def dependency_annotations(document: ResultsDocument) -> list[str]:
    """An annotation per portability dependency: an error with ``--probes-fail``, else a notice."""
    image = (document.get("image") or {}).get("name")
    level = "error" if probes_fail(document) else "notice"
    return [annotation(level, f"reproci {model} on {image}: depends on {r.factor}", r.message)
            for model, r in rows(document) if r.status == DEPENDS]


def webhook(document: ResultsDocument) -> list[tuple[str, str]]:
    """With ``--probes-fail``, what failed the run: each dependency, with its model."""
    if not probes_fail(document):
        return []
    return [(model, f"• *{model}*: {r.message}") for model, r in rows(document) if r.status == DEPENDS]
