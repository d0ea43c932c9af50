"""The terminal report: one table, verdicts first."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from . import verdicts


def _where(m: dict[str, Any]) -> str:
    return verdicts.first_difference(m.get("evidence") or (m.get("golden") or {}).get("evidence"))


def table(document: dict[str, Any]) -> Table:
    image = document.get("image", {})
    title = f"reproci · {image.get('name')} ({image.get('backend')})"
    if image.get("digest"):
        title += f" · {image['digest'][:19]}"
    t = Table(title=title, title_justify="left")
    t.add_column("model", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("final sha256")
    t.add_column("first difference")
    t.add_column("seconds", justify="right")
    for m in document.get("models", []):
        v = m.get("verdict", "?")
        t.add_row(m["model"], f"[{verdicts.STYLE.get(v, '')}]{v}[/]", (m.get("final_sha256") or "-")[:12],
                  _where(m) if v != verdicts.ERROR else "see below", f"{m.get('seconds', 0):.1f}")
    return t


def print_report(document: dict[str, Any], console: Console, results_path: str | None = None) -> None:
    console.print(table(document))
    new = [m["model"] for m in document.get("models", []) if m.get("verdict") == verdicts.NEW]
    for m in document.get("models", []):
        if m.get("verdict") not in (verdicts.PASS, verdicts.NEW):
            console.print(f"[bold]{m['model']}[/]: {m.get('verdict')}: {m.get('message')}", highlight=False)
    if new and not (document.get("golden") or {}).get("updated"):
        image = (document.get("image") or {}).get("name")
        ci = (document.get("options") or {}).get("ci")
        lead = "[bold red]error[/]" if ci else "notice"
        console.print(f"{lead}: no golden for image {image} yet ({', '.join(new)}); runs are reproducible by "
                      f"themselves. Record with `reproci golden update --image {image}`" + (" (CI mode: this fails)" if ci else ""),
                      highlight=False)
    for m in document.get("models", []):
        if m.get("throughput_regression"):
            console.print(f"[yellow]warning[/]: {m['model']}: {m['throughput_regression']}", highlight=False)
    if results_path:
        console.print(f"results: {results_path}", highlight=False)
