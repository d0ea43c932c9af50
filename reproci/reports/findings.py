"""What ``reproci run`` prints for the op audit, the portability probes and the bisection: one
table each, a row per finding, probe or model; each stage prints its own (``stages.registry``).
The rows are made once, in ``stages.audit.rows`` and ``stages.probes.rows``; Markdown and HTML
show the same rows."""

from __future__ import annotations


from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..stages import audit, bisect, blame, probes
from ..results import ResultsDocument

PROBE_STYLE = {probes.DEPENDS: "bold yellow", probes.INDEPENDENT: "green", probes.NOT_APPLICABLE: "dim",
               probes.FAILED: "bold red"}
CUDA_STYLE = {"raises on CUDA": "bold red", "slower on CUDA": "yellow", "fills memory": "dim", "error": "bold red"}


def audit_table(document: ResultsDocument) -> Table | None:
    models = [m for m in document.get("models") or [] if isinstance(m.get("audit"), dict)]
    if not models:
        return None
    t = Table(title="Op audit: what strict determinism does to these ops on CUDA", title_justify="left")
    for name, kw in (("model", {"no_wrap": True}), ("op", {}), ("count", {"justify": "right"}),
                     ("on CUDA", {"no_wrap": True}), ("where", {"overflow": "fold"}), ("fix or cost", {"overflow": "fold"})):
        t.add_column(name, **kw)
    for r in audit.rows(document):
        t.add_row(r["model"], escape(r["op"]), "" if r["count"] is None else str(r["count"]),
                  f"[{CUDA_STYLE.get(r['cuda'], 'yellow')}]{escape(r['cuda'])}[/]", escape(r["where"]), escape(r["advice"] or r["what"]))
    for m in models:
        if not (m["audit"].get("findings") or m["audit"].get("error")):
            t.add_row(m["model"], "—", "", "[green]nothing[/]", "", audit.summary(m["audit"]))
    return t


def _table(title: str, short: tuple[str, ...], long: tuple[str, ...]) -> Table:
    """A findings table: its short columns never wrap, its long ones fold."""
    t = Table(title=title, title_justify="left")
    for name in short:
        t.add_column(name, no_wrap=True)
    for name in long:
        t.add_column(name, overflow="fold")
    return t


def probes_table(document: ResultsDocument) -> Table | None:
    rows = probes.rows(document)
    if not rows:
        return None
    t = _table("Portability probes: what the results depend on", ("model", "probe", "result"), ("evidence",))
    for r in rows:
        t.add_row(r["model"], r["probe"], f"[{PROBE_STYLE.get(r['status'], '')}]{r['status']}[/]", escape(r["message"]))
    return t


def bisect_table(document: ResultsDocument) -> Table | None:
    rows = bisect.rows(document)
    if not rows:
        return None
    t = _table("Bisection: the first factor whose removal restores equality", ("model", "cause"), ("stages", "finding"))
    for r in rows:
        t.add_row(r["model"], f"[bold yellow]{escape(str(r['culprit']))}[/]" if r["culprit"] else "[dim]—[/]",
                  escape(bisect.stages_text(r)), escape(r["message"]))
    return t


def print_audit(document: ResultsDocument, console: Console) -> None:
    """The op audit's table, where it found anything to say."""
    table = audit_table(document)
    if table is not None:
        console.print(table)


def print_probes(document: ResultsDocument, console: Console) -> None:
    """The probes' table; with ``--probes-fail``, the line saying a dependency fails the run."""
    table = probes_table(document)
    if table is None:
        return
    console.print(table)
    if (document.get("options") or {}).get("probes_fail") and any(
            (m.get("probes") or {}).get("depends") for m in document.get("models") or []):
        console.print("portability dependencies found and --probes-fail is set: this run fails (exit 1)", highlight=False)


def print_bisect(document: ResultsDocument, console: Console) -> None:
    """The bisection's table, or its one line when it had nothing to do."""
    table = bisect_table(document)
    if table is not None:
        console.print(table)
    line = bisect.nothing(document)
    if line:
        console.print(line, highlight=False, markup=False)


def print_blame(document: ResultsDocument, console: Console) -> None:
    """The blame's one line when it had nothing to do (what it found is in the verdict's message)."""
    line = blame.nothing(document)
    if line:
        console.print(line, highlight=False, markup=False)
