"""Markdown tables: one cell escape and one table layout for every Markdown output
(the report, the step summaries, the pull-request body)."""

from __future__ import annotations

from typing import Any


def cell(value: Any) -> str:
    """Table-safe Markdown text: '-' for nothing, pipes escaped, one line."""
    return str(value if value is not None else "-").replace("|", "\\|").replace("\n", " ")


def code(value: Any) -> str:
    """A name in backticks, or '-' for nothing."""
    return f"`{cell(value)}`" if value not in (None, "") else "-"


def table(header: list[str], rows: list[list[Any]], *, max_rows: int | None = None,
          more: str = "in the results artifact") -> list[str]:
    """The lines of a table of cells written with ``cell``/``code`` (or other Markdown). With
    ``max_rows``, a longer table is cut and says how many rows are left out (GitHub refuses
    bodies over 65,536 characters)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    shown = rows if max_rows is None else rows[:max_rows]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in shown]
    if max_rows is not None and len(rows) > max_rows:
        lines.append(f"\n… {len(rows) - max_rows} more rows {more}.")
    return lines



def plain_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """``table`` of plain values, each written with ``cell`` (a report section's rows)."""
    return table(header, [[cell(c) for c in r] for r in rows])
