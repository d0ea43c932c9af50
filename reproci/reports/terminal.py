"""What ``reproci run`` prints of the verdicts: the verdict table (verdicts first), each model's
message and warnings, the notice of a missing golden. ``print_run`` puts the stages'
parts together (each stage's own tables are in its ``report.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import verdicts
from ..document import Document, Entry
from ..golden import comparison
from ..golden.comparison import Outcome
from ..results import ModelEntry, ResultsDocument

if TYPE_CHECKING:
    from ..stages.base import Stages


def _where(m: ModelEntry) -> str:
    return verdicts.first_difference(verdicts.evidence(m))


def verdict_table(document: ResultsDocument) -> Table:
    doc = Document.of(document)
    image = doc.image
    title = f"reproci · {image.name} ({image.backend})"
    if digest := image.digest:
        title += f" · {digest[:19]}"
    t = Table(title=title, title_justify="left")
    # On a narrow terminal the verdict, hash and seconds keep their width; a long model name
    # and the first difference wrap instead.
    longest = max((len(m.verdict or "?") for m in doc.models), default=7)
    t.add_column("model", overflow="fold")
    t.add_column("verdict", no_wrap=True, min_width=longest)
    t.add_column("final sha256", no_wrap=True, min_width=12)
    t.add_column("first difference", overflow="fold")
    t.add_column("seconds", justify="right", no_wrap=True, min_width=7)
    for raw in verdicts.by_severity(document.get("models", [])):
        m = Entry.of(raw)
        v = m.verdict or "?"
        t.add_row(m.model, f"[{verdicts.STYLE.get(v, '')}]{v}[/]", (m.final_sha256 or "-")[:12],
                  _where(raw) if v != verdicts.ERROR else "see below", f"{m.seconds or 0:.1f}")
    return t


def print_report(document: ResultsDocument, console: Console, err: Console | None = None) -> None:
    """The verdict table and each model's verdict message on ``console`` (the results); its
    warnings and the NEW notice on ``err`` (see ``reproci.console``)."""
    err = err or console
    console.print(verdict_table(document))
    for raw in verdicts.by_severity(document.get("models", [])):
        m = Entry.of(raw)
        said = ""
        if m.verdict not in (verdicts.PASS, verdicts.NEW):
            said = str(m.message)
            console.print(f"[bold]{m.model}[/]: {m.verdict}: {escape(said)}", highlight=False)
        print_warnings(raw, err, said)
        across = m.across_nodes or {}
        if across.get("agree") and m.verdict in (verdicts.PASS, verdicts.NEW):
            console.print(f"[bold]{m.model}[/]: {escape(str(across['message']))}", highlight=False)
        golden = comparison.of(raw)
        if m.verdict == verdicts.PASS and golden and golden.upgrade_checked:
            console.print(f"[bold]{m.model}[/]: PASS: {escape(str(golden.message))}", highlight=False)
    doc = Document.of(document)
    new = [m.model for m in doc.models if m.verdict == verdicts.NEW]
    outcome = comparison.outcome_of(document) or Outcome()
    if new and not outcome.updated:
        image = doc.image.name
        ci = doc.options.ci
        lead = "[bold red]error[/]" if ci else "notice"
        record = outcome.update_command or f"reproci golden update --image {image}"
        err.print(f"{lead}: no golden for image {image} yet ({', '.join(new)}); runs are reproducible by "
                  f"themselves. Record with `{record}`"
                  + (" (CI mode: this fails)" if ci else ""),
                  highlight=False)


def print_warnings(m: ModelEntry, err: Console, said: str = "") -> None:
    """A model's warnings (``verdicts.warnings``), one line each, less those ``said`` holds."""
    for kind, text in verdicts.unsaid_warnings(m, said):
        label = "[bold]notice[/]" if kind.endswith(".notice") else "[bold yellow]warning[/]"  # notices never fail
        err.print(f"{label}: {escape(Entry.of(m).model)}: {escape(text)}", highlight=False)



def print_run(document: ResultsDocument, composed: Stages, out: Console, err: Console, results: Path) -> None:
    """What ``reproci run`` prints: each stage's part (of those ``composed`` that ran, in their
    order); where no stage checked reproducibility, the models' warnings and a line saying so;
    then the results file."""
    stages = composed.ran(document)
    for stage in stages:
        stage.terminal(document, out, err)
    if not any(stage.checks_reproducibility for stage in stages):
        for m in document.get("models", []):
            print_warnings(m, err)
        ran = ", ".join(stage.name for stage in stages)
        checker = next(s.name for s in composed if s.checks_reproducibility)
        out.print(f"{checker} not checked ({ran} {'stage' if len(stages) == 1 else 'stages'} only; "
                  f"add --stage {checker})", highlight=False, markup=False)
    out.print(f"results: {results}", highlight=False, markup=False)
