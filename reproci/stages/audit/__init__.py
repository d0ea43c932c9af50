"""The op audit stage (``--stage audit``): one fresh-process step per model, every aten op
recorded under strict mode with ``warn_only``, cross-referenced with what strict
determinism does to those ops on CUDA (``reproci/worker/audit/audit.py``, read against the
torch in the image). A CPU run predicts what a GPU run will hit and what will get slower.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, TypedDict

from ... import typed
from ...errors import WorkerFailed
from ...results import ResultsDocument
from ...runner import run_worker
from ...settings.models import ModelRef
from ...typed import Error
from ..base import StageRun
from ..runs import base_spec
from .result import AuditResult, Finding, Inventoried, of

CATEGORIES = ("raises", "slower", "fills")
ON_CUDA = {"raises": "raises on CUDA", "slower": "slower on CUDA", "fills": "fills memory"}


class AuditFile(TypedDict):
    """The worker's audit.json (``worker.audit.audit.audited_step``)."""

    torch: str  # the version that ran it
    ops_executed: int
    warnings: list[str]  # torch's warnings about determinism in the step
    findings: list[Any]  # each a ``Finding``'s keys, most serious first
    attention: list[dict[str, Any]]  # each SDPA call
    inventory: list[Inventoried]


def run_model(run: StageRun, model: ModelRef) -> AuditResult:
    """The audit of one model: its findings, its op inventory, or why it could not run."""
    options, ctx = run.options, run.ctx
    t0 = time.monotonic()
    spec = dataclasses.replace(base_spec(options, model, "audit", project_commit=run.project_commit, image=run.image),
                               steps=1, audit_path="audit.json", fingerprints=False,
                               world_size=1)  # one process: the ops of a rank are the ops of the model
    try:
        run_worker(ctx, spec)
        data: AuditFile = json.loads((ctx.run_dir / model.name / "audit.json").read_text())
    except (WorkerFailed, OSError, json.JSONDecodeError) as e:
        return AuditResult(error=Error(kind=getattr(e, "kind", "crash"), message=str(e)),
                           seconds=round(time.monotonic() - t0, 3))
    findings = [typed.load(Finding, f) for f in data["findings"]]  # the worker's, keys as it wrote them
    inventory = data["inventory"]
    return AuditResult(
        torch=data["torch"],
        device=options.device,
        ops_executed=data["ops_executed"],
        distinct_ops=len({i["op"] for i in inventory}),
        counts={c: sum(1 for f in findings if f.cuda == c) for c in CATEGORIES},
        findings=findings,
        warnings=data["warnings"],
        attention=data["attention"],
        inventory=inventory,
        record=f"{model.name}/audit.json",
        seconds=round(time.monotonic() - t0, 3),
    )


def summary(audit: AuditResult) -> str:
    """'1 raises on CUDA, 2 slower on CUDA, 1 fills memory' (or why there is no audit)."""
    if audit.error:
        return f"audit failed: {audit.error.message}"
    counts = audit.counts or {}
    parts = [f"{counts[c]} {ON_CUDA[c]}" for c in CATEGORIES if counts.get(c)]
    return ", ".join(parts) if parts else "no op that strict determinism acts on"


def audited(document: ResultsDocument) -> list[tuple[str, AuditResult]]:
    """Each audited model's name and audit, in the document's order."""
    return [(m["model"], audit) for m in document.get("models") or [] if (audit := of(m)) is not None]


class Row(TypedDict, total=False):
    """A finding of the audit as every report shows it."""

    model: str
    op: str
    count: int | None
    where: str
    cuda: str  # what strict determinism does to it on CUDA, or "error"
    what: str
    advice: str
    checked: str
    phases: str


def rows(document: ResultsDocument) -> list[Row]:
    """One row per finding, per model, for every report: model, op, count, where, on CUDA, advice."""
    out: list[Row] = []
    for model, audit in audited(document):
        if audit.error:
            out.append({"model": model, "op": "—", "count": None, "where": "", "cuda": "error",
                        "what": audit.error.message, "advice": "", "checked": ""})
        for f in audit.findings or []:
            out.append({"model": model, "op": f.op, "count": f.count, "where": "; ".join(f.where),
                        "cuda": ON_CUDA.get(f.cuda, f.cuda) if f.device == "cuda" else f"{f.cuda} on CPU",
                        "what": f.why or f.what, "advice": f.advice, "checked": f.checked, "phases": ", ".join(f.phases)})
    return out
