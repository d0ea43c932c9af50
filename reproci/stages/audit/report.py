"""The op audit in every report, each built from the same rows (``stages.audit.rows``): its
table in what ``reproci run`` prints, its section of the Markdown report and of the HTML report;
a row per finding and one per model with nothing to say."""

from __future__ import annotations

from html import escape

from rich.console import Console
from rich.markup import escape as markup
from rich.table import Table

from ...reports.mdtable import code, plain_table
from ...results import ResultsDocument
from . import audited, rows, summary
from .result import AuditResult

TITLE = "Op audit: what strict determinism does to these ops on CUDA"
HEADER = ["model", "op", "count", "on CUDA", "where", "fix or cost"]
CUDA_STYLE = {"raises on CUDA": "bold red", "slower on CUDA": "yellow", "fills memory": "dim", "error": "bold red"}


def _quiet(models: list[tuple[str, AuditResult]]) -> list[tuple[str, AuditResult]]:
    """The audited models with no finding and no error: a row each that says so."""
    return [(model, audit) for model, audit in models if not (audit.findings or audit.error)]


def table(document: ResultsDocument) -> Table | None:
    """The terminal table; None where no model was audited."""
    models = audited(document)
    if not models:
        return None
    t = Table(title=TITLE, title_justify="left")
    for name, kw in (("model", {"no_wrap": True}), ("op", {}), ("count", {"justify": "right"}),
                     ("on CUDA", {"no_wrap": True}), ("where", {"overflow": "fold"}), ("fix or cost", {"overflow": "fold"})):
        t.add_column(name, **kw)
    for r in rows(document):
        t.add_row(r["model"], markup(r["op"]), "" if r["count"] is None else str(r["count"]),
                  f"[{CUDA_STYLE.get(r['cuda'], 'yellow')}]{markup(r['cuda'])}[/]", markup(r["where"]),
                  markup(r["advice"] or r["what"]))
    for model, audit in _quiet(models):
        t.add_row(model, "—", "", "[green]nothing[/]", "", summary(audit))
    return t


def terminal(document: ResultsDocument, console: Console) -> None:
    """The table, where it found anything to say."""
    t = table(document)
    if t is not None:
        console.print(t)


def markdown(document: ResultsDocument) -> list[str]:
    """The Markdown section; empty where no model was audited."""
    models = audited(document)
    if not models:
        return []
    found = [[r["model"], code(r["op"]), r["count"], r["cuda"], r["where"], r["advice"] or r["what"]]
             for r in rows(document)]
    found += [[model, "—", "", "nothing", "", summary(audit)] for model, audit in _quiet(models)]
    return [f"### {TITLE}", "", *plain_table(HEADER, found), ""]


def html(document: ResultsDocument) -> str:
    """The HTML section; empty where no model was audited."""
    from ...reports import html as page  # matplotlib, imported when a report is made

    models = audited(document)
    if not models:
        return ""
    found = [[escape(str(r["model"])), f"<code>{escape(r['op'])}</code>", escape(str(r["count"] or "")),
              f'<span class="{"bad" if r["cuda"] in ("raises on CUDA", "error") else ""}">{escape(r["cuda"])}</span>',
              escape(r["where"]), escape(r["advice"] or r["what"])] for r in rows(document)]
    found += [[escape(str(model)), "—", "", "nothing", "", escape(summary(audit))] for model, audit in _quiet(models)]
    return f'<section id="audit"><h2>{escape(TITLE)}</h2>' + page.table(HEADER, found) + "</section>"
