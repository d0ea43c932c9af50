"""The JSON report: the same facts as the Markdown and HTML reports, for machines: per model its
verdict, hash and warnings, then each stage's keys (``Stage.export``), in the order they run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .. import verdicts
from ..document import Entry
from ..golden import comparison
from ..results import ResultsDocument
from .history import Trends

if TYPE_CHECKING:
    from ..stages.base import Stages

SCHEMA = "reproci.report"
VERSION = 1


def render(document: ResultsDocument | None, stages: Stages, trends: Trends | None = None) -> str:
    out: dict[str, Any] = {"schema": SCHEMA, "version": VERSION}
    if document is not None:
        out["run"] = {k: document.get(k) for k in ("run_id", "created", "project_commit", "reproci_version", "image",
                                                   "options", "summary")}
        out["models"] = []
        for m in document.get("models", []):
            e, golden = Entry.of(m), comparison.of(m)
            out["models"].append({
                "model": e.model, "verdict": e.verdict, "message": e.message,
                "golden_verdict": golden.verdict if golden else None, "final_sha256": e.final_sha256,
                "warnings": [{"kind": kind, "text": text} for kind, text in verdicts.warnings(m)],
                **{k: v for stage in stages for k, v in stage.export(m).items()},
            })
    if trends is not None:
        out["trends"] = trends
    return json.dumps(out, indent=2, default=str) + "\n"
