"""The throughput table printed after ``reproci run --stage throughput``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .rows import op_text, throughput_rows


def table(document: dict[str, Any]) -> Table | None:
    rows = throughput_rows(document)
    if not rows:
        return None
    t = Table(title="cost of strict determinism (slowdown = strict / default step time, median [95 % CI])",
              title_justify="left")
    for name, justify in (("model", "left"), ("strict steps/s", "right"), ("default steps/s", "right"),
                          ("slowdown", "left"), ("peak mem strict / default", "right"), ("ops that grew most", "left")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        sd = r["slowdown_text"] if not r["error"] else "[bold red]failed[/]"
        if r["slowdown"].get("noisy"):
            sd = f"[yellow]{sd}[/]"
        ops = "\n".join(op_text(op) for op in r["top_ops"][:3]) or "-"
        t.add_row(str(r["model"]), r["strict"].split(" (")[0], r["default"].split(" (")[0], sd, r["memory"], ops)
    return t


def print_throughput(document: dict[str, Any], console: Console, results_path: str | None = None) -> None:
    """The throughput table and its failures; with ``results_path``, a run without the
    determinism stage, which therefore makes no reproducibility claim."""
    t = table(document)
    if t is not None:
        console.print(t)
    for r in throughput_rows(document):
        if r["error"]:
            console.print(f"[bold]{r['model']}[/]: throughput failed: {r['error']}", highlight=False)
        if r["regression"]:
            console.print(f"[bold yellow]warning[/]: {r['model']}: {r['regression']}", highlight=False)
    if results_path:
        console.print("determinism not checked (throughput stage only; add --stage determinism)", highlight=False)
        console.print(f"results: {results_path}", highlight=False)
