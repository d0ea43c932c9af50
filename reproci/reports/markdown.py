"""The Markdown report's parts: for $GITHUB_STEP_SUMMARY and pull-request comments. Each stage
shows its own sections (``stages.base.Stage.markdown``, and its trends: ``Stage.markdown_trends``);
``reports.build.markdown_report`` puts them together."""

from __future__ import annotations

from .. import verdicts
from ..cluster.merged import MergedDocument, MergedModel
from ..document import Document, Entry, OptionsView
from ..results import ModelEntry, ResultsDocument
from .mdtable import cell, code, plain_table


def _ranks(opts: OptionsView) -> str:
    n = opts.world_size or 1
    return f" · world size {n}" if n > 1 else ""


def head(doc: ResultsDocument, lead: list[str]) -> list[str]:
    """The run's facts, then ``lead`` (a stage's verdict table with its figures, ``Stage.markdown_verdicts``)
    or, where no stage gives one, the plain verdict table."""
    d = Document.of(doc)
    image, opts = d.image, d.options
    lines = [f"## reproci · {image.name} ({image.backend})", "",
             f"Run `{d.run_id}` · {d.created} · commit `{(d.project_commit or '-')[:12]}` · "
             f"stages {', '.join(opts.stages)} · device {opts.device} · "
             f"threads {opts.threads}{_ranks(opts)} · exit code {(d.summary or {}).get('exit_code')}", ""]
    if lead:
        return lines + lead
    lines += ["### Verdicts", ""]
    lines += plain_table(["model", "verdict", "message"], [[m.model, m.verdict, m.message] for m in d.models])
    return lines + [""]


def warnings(doc: ResultsDocument | MergedDocument) -> list[str]:
    """Every model's warnings (``verdicts.warnings``), a line each, most serious verdict first;
    nothing when there are none. The report and the step summaries show this section."""
    models: list[ModelEntry] = [*(doc.get("models") or [])]  # a merged document's too (MergedModel)
    found = [(m, text) for m in verdicts.by_severity(models) for _, text in verdicts.warnings(m)]
    if not found:
        return []
    return ["### Warnings", "", *(f"- ⚠️ **{cell(Entry.of(m).model)}**{_on(m)}: {cell(text)}" for m, text in found),
            ""]


def _on(m: ModelEntry | MergedModel) -> str:
    """' on `image`' for a merged matrix's model, whose image is part of its name."""
    image = m.get("image")
    return f" on {code(image)}" if isinstance(image, str) and image else ""

