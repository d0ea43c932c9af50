"""The JSON report: the same facts as the Markdown and HTML reports, for machines."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .. import verdicts
from ..entry_sections import GoldenComparison
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
            t = m.get("throughput") if isinstance(m.get("throughput"), dict) else None
            g = m.get("golden")
            golden: GoldenComparison = g if isinstance(g, dict) else {}
            out["models"].append({
                "model": m.get("model"), "verdict": m.get("verdict"), "message": m.get("message"),
                "golden_verdict": golden.get("verdict"), "final_sha256": m.get("final_sha256"),
                "warnings": [{"kind": kind, "text": text} for kind, text in verdicts.warnings(m)],
                "audit": None if not isinstance(m.get("audit"), dict) else {
                    k: m["audit"].get(k) for k in ("torch", "device", "ops_executed", "counts", "findings", "warnings",
                                                   "error")},
                "probes": (m.get("probes") or {}).get("rows"),
                "variance": m.get("variance") if isinstance(m.get("variance"), dict) else None,
                "throughput": None if t is None else {
                    k: t.get(k) for k in ("modes", "slowdown", "slowdowns", "top_ops", "regression", "error",
                                          "repetitions", "timed_steps", "warmup_steps", "device", "threads")
                },
            })
    if trends is not None:
        out["trends"] = trends
    return json.dumps(out, indent=2, default=str) + "\n"
