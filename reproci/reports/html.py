"""The HTML report's parts: one self-contained file, charts embedded as base64 PNG. Each stage shows
its own sections (``stages.base.Stage.html``, and its trends: ``Stage.html_trends``);
``reports.build.html_report`` puts them together."""

from __future__ import annotations

import base64
import json
import math
from html import escape
from pathlib import Path
from typing import Any

from .. import verdicts
from ..document import Document, Entry
from ..results import ModelEntry, ResultsDocument
from . import charts

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.noisy { color: #a0660a; }
.bad { color: #b00020; font-weight: bold; }
figure { margin: 1em 0; }
figcaption { color: #555; font-size: 0.9em; }
code { background: #f5f5f5; padding: 0 0.2em; }
"""


def figure(png: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{escape(alt)}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def prose(text: str) -> str:
    """A message as HTML: escaped, with its `code spans` (commands, tensor names) as <code>."""
    parts = escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: leave the text as it is
        return escape(text)
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _floats(values: list[Any]) -> list[float]:
    out = []
    for v in values:
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            out.append(math.nan)
    return out


def loss_series(run_dir: Path | None, entry: ModelEntry,
                golden_losses: list[Any] | None) -> dict[str, tuple[list[int], list[float]]]:
    """Losses per step of runs A, B, C from their records, and the golden's when it differs from A."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    if run_dir is None:
        return series
    records = Entry.of(entry).records
    for role in ("A", "B", "C"):
        rel = records.get(role)
        if not rel or not (run_dir / rel).is_file():
            continue
        rec = json.loads((run_dir / rel).read_text())
        losses = _floats(rec.get("losses") or [])
        start = int(rec.get("start_step") or 0)
        series[role] = (list(range(start + 1, start + 1 + len(losses))), losses)
    if golden_losses and "A" in series and _floats(golden_losses) != series["A"][1]:
        g = _floats(golden_losses)
        series["golden"] = (list(range(1, len(g) + 1)), g)
    return series


def page(title: str, parts: list[str]) -> str:
    """The self-contained HTML file: ``title`` and the report's sections, in order."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>\n<h1>{escape(title)}</h1>\n"
            + "\n".join(p for p in parts if p) + "\n</body></html>\n")


def title(document: ResultsDocument | None) -> str:
    if document is None:
        return "reproci report"
    doc = Document.of(document)
    return f"reproci · {doc.image.name} · {doc.run_id}"


def head(doc: ResultsDocument) -> str:
    d = Document.of(doc)
    opts, image = d.options, d.image
    facts = [("image", f"{image.name} ({image.backend})"), ("digest", image.digest or "-"),
             ("created", d.created), ("commit", (d.project_commit or "-")[:12]),
             ("stages", ", ".join(opts.stages)), ("device", opts.device),
             ("threads", opts.threads), ("exit code", (d.summary or {}).get("exit_code"))]
    rows = [[escape(m.model), escape(str(m.verdict)), prose(m.message or "")] for m in d.models]
    return ("<section id=\"run\"><p>" + " · ".join(f"{escape(k)} <code>{escape(str(v))}</code>" for k, v in facts)
            + "</p><h2>Verdicts</h2>" + table(["model", "verdict", "message"], rows) + "</section>")


def warnings(doc: ResultsDocument) -> str:
    """Every model's warnings (``verdicts.warnings``), an item each; nothing when there are none."""
    items = [f'<li data-kind="{escape(kind)}"><strong>{escape(Entry.of(m).model)}</strong>: {prose(text)}</li>'
             for m in verdicts.by_severity(doc.get("models") or []) for kind, text in verdicts.warnings(m)]
    if not items:
        return ""
    return '<section id="warnings"><h2>Warnings</h2><ul>' + "".join(items) + "</ul></section>"


def losses(doc: ResultsDocument, run_dir: Path | None, golden_losses: dict[str, list[Any]]) -> str:
    figs = []
    for m in doc.get("models", []):
        model = Entry.of(m).model
        series = loss_series(run_dir, m, golden_losses.get(model))
        if not series:
            continue
        note = " The golden's curve differs from run A and is overlaid." if "golden" in series else ""
        figs.append(figure(charts.loss_curves(model, series), f"loss curves of {model}",
                         f"{model}: loss per step of runs A, B and C (C resumes from A's checkpoint); "
                         f"equal curves draw on top of each other.{note}"))
    if not figs:
        return ""
    return "<section id=\"losses\"><h2>Loss curves</h2>" + "".join(figs) + "</section>"

