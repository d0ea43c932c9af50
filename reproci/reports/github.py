"""GitHub Actions output: workflow-command annotations and the step-summary Markdown, for
one run's results (``reproci run`` in a job) and for a merged matrix (``reproci merge``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import atomic, errors, typed, verdicts
from ..cluster.merged import MergedDocument
from ..document import Document, Entry, ImageView
from ..golden import comparison
from ..results import Image, ModelEntry, ResultsDocument
from . import markdown
from .mdtable import cell, code, table

if TYPE_CHECKING:
    from ..stages.base import Stages


def escape_data(text: str) -> str:
    """GitHub workflow-command escaping of a message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """GitHub workflow-command escaping of a property value (a title)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: str, title: str, message: str) -> str:
    return f"::{level} title={escape_property(title)}::{escape_data(message)}"


def where(m: ModelEntry) -> str:
    """'step 15, `buffer:bn.running_mean`, |Δ| 4.66e-10 (1 ULP)' or '-'."""
    return verdicts.first_difference(verdicts.verdict_evidence(m), code=lambda s: f"`{s}`")


def _model_annotations(m: ModelEntry, image: str | None, *, ci: bool) -> list[str]:
    """The model's verdict annotation when it needs attention, then a ``warning`` for each of its
    warnings (``verdicts.warnings``), at that level even when the verdict's message says it too."""
    e = Entry.of(m)
    v = str(e.verdict)
    level = verdicts.annotation_level(v, ci=ci)
    out = []
    if level is not None:
        detail = verdicts.first_difference(verdicts.verdict_evidence(m))
        text = f"{v}: {e.message or ''}" + (f" (first difference: {detail})" if detail != "-" else "")
        out.append(annotation(level, f"reproci {e.model} on {image}: {v}", text))
    return out + [annotation("warning", f"reproci {e.model} on {image}: warning ({kind})", text)
                  for kind, text in verdicts.warnings(m)]


def run_annotations(document: ResultsDocument, stages: Stages) -> list[str]:
    """One annotation per model of a run that needs attention (level: ``verdicts.annotation_level``),
    one per warning of a model (``verdicts.warnings``), then each stage's (``Stage.annotations``)."""
    doc = Document.of(document)
    return [line for m in verdicts.by_severity(document.get("models", []))
            for line in _model_annotations(m, doc.image.name, ci=doc.options.ci)] + [
        line for stage in stages for line in stage.annotations(document)]


def merged_annotations(merged: MergedDocument) -> list[str]:
    """Annotations of a merged matrix: a missing image is an error, then one per model."""
    out = [annotation("error", f"reproci {name}", f"no results from image {name}: its job failed before "
                      "writing results.json") for name in merged["missing"]]
    for m in verdicts.by_severity(merged["models"]):
        out += _model_annotations(m, m["image"], ci=bool(m.get("ci")))
    return out


def _status(code_: int | None, unchecked: str | None = None) -> str:
    """The outcome of an exit code; a pass where no model's reproducibility was checked says what
    ran instead (``unchecked``: 'throughput only')."""
    return {errors.EXIT_PASS: "✅ reproducible" if unchecked is None else unchecked,
            errors.EXIT_DRIFT: "⚠️ golden drift", errors.EXIT_REPRO_FAILURE: "❌ not reproducible",
            errors.EXIT_RUN_ERROR: "💥 runs failed"}.get(code_ if code_ is not None else -1, "💥 infrastructure failure")


def _package_lines(models: list[ModelEntry], limit: int = 30) -> list[str]:
    diffs = [g.package_diff for m in models if (g := comparison.of(m)) and g.package_diff]
    if not diffs:
        return []
    changed = sorted(diffs[0].items())
    more = [f"- and {len(changed) - limit} more"] if len(changed) > limit else []
    return ["", "### Package changes against the golden", "",
            *[f"- `{k}`: {old or '(absent)'} → {new or '(absent)'}" for k, (old, new) in changed[:limit]], *more]


def summary_markdown(document: ResultsDocument, stages: Stages) -> str:
    """The step summary of one run: what changed comes first."""
    doc = Document.of(document)
    image = doc.image
    exit_ = (doc.summary or {}).get("exit_code", 0)
    models = verdicts.by_severity(document.get("models", []))
    entries = [Entry.of(m) for m in models]
    checked = any(e.verdict != verdicts.NOT_CHECKED for e in entries)
    unchecked = None if checked else f"{', '.join(s.name for s in stages.ran(document))} only"
    lines = [f"## reproci · `{image.name}` · {_status(exit_, unchecked)} (exit {exit_})", ""]
    if image.digest:
        lines += [f"Image digest: `{image.digest}`", ""]
    lines += table(["model", "verdict", "final sha256", "first difference", "detail"], [
        [cell(e.model), f"{verdicts.ICON.get(str(e.verdict), '')} **{e.verdict}**",
         code((e.final_sha256 or "")[:12] or None), cell(where(m)), cell(e.message)] for m, e in zip(models, entries)])
    warned = markdown.warnings(document)
    sections = [line for stage in stages for line in stage.markdown(document)]
    return "\n".join(lines + (["", *warned] if warned else []) + _package_lines(models)
                     + (["", *sections] if sections else [])) + "\n"


def merged_summary_markdown(merged: MergedDocument, stages: Stages) -> str:
    """The step summary of a merged matrix: per image and model (with each stage's columns,
    ``Stage.matrix_columns``), then each image's toolchain."""
    s = merged["summary"]
    counts = ", ".join(f"{v} {n}" for v, n in s["verdicts"].items()) or "no models"
    lines = [f"## reproci: {_status(s['exit_code'])} (exit {s['exit_code']})", "",
             f"{s['images']} image(s), {s['models']} model(s): {counts}.", ""]
    if merged["missing"]:
        lines += [f"**No results from:** {', '.join(f'`{n}`' for n in merged['missing'])} (see those jobs' logs).", ""]
    models = verdicts.by_severity(merged["models"])
    columns = [column for stage in stages for column in stage.matrix_columns]
    lines += table(["image", "model", "verdict", "first difference", "final sha256", *(h for h, _ in columns)], [
        [code(m["image"]), cell(m["model"]), f"{verdicts.ICON.get(m['verdict'], '')} {m['verdict']}", cell(where(m)),
         code((Entry.of(m).final_sha256 or "")[:12] or None), *(cell(text(m)) for _, text in columns)]
        for m in models])
    warned = markdown.warnings(merged)
    if warned:
        lines += ["", *warned[:-1]]
    notable = [m for m in models if m["verdict"] != verdicts.PASS]
    if notable:
        lines += ["", "### Details", ""]
        for m in notable:
            lines.append(f"- **{m['model']}** on `{m['image']}`: {m['verdict']}: {cell(Entry.of(m).message)}")
            changed = (g.package_diff if (g := comparison.of(m)) else None) or {}
            if changed:
                shown = ", ".join(f"{p} {old or '∅'} → {new or '∅'}" for p, (old, new) in sorted(changed.items())[:10])
                lines.append(f"  - packages: {shown}{f' and {len(changed) - 10} more' if len(changed) > 10 else ''}")
    lines += ["", "### Images", ""]
    lines += table(["image", "digest", "torch", "CUDA", "cuDNN", "GPU", "driver", "exit"], [
        [code(image.name), code((image.digest or "")[:19] or None),
         cell(env["torch"]), cell(env["cuda"]), cell(env["cudnn"]),
         cell(", ".join(env["gpu_names"]) or "-"), cell(env["driver"]), str(sh["exit_code"])]
        for sh in merged["shards"] for image, env in [(_image(sh["image"]), sh["environment"])]])
    return "\n".join(lines) + "\n"


def _image(image: Image | None) -> ImageView:
    """A shard's image (as its results.json has it) read by attribute."""
    return typed.load(ImageView, image or {}, lenient=True)


def write_step_summary(document: ResultsDocument, path: Path, stages: Stages) -> None:
    atomic.append_text(path, summary_markdown(document, stages))
