"""A model's entry in the results: made in one place (``new``), before any stage runs; the
determinism stage fills in its verdict, and every later stage adds its result (``add_result``)."""

from __future__ import annotations

from typing import Any, Mapping

from .. import results, verdicts
from ..results import ModelEntry
from ..settings.models import ModelRef
from ..settings.options import RunOptions


def new(options: RunOptions, model: ModelRef) -> ModelEntry:
    """The entry of ``model`` before any stage ran: which model, with which settings, and no
    reproducibility claim (NOT_CHECKED) until the determinism stage makes one."""
    return {
        "model": model.name, "ref": model.ref, "plugin": model.plugin, "description": model.description,
        "source": str(model.source), "code_sha256": model.code_sha256, "steps": options.steps,
        "resume_at": options.resume_at, "seed": options.seed, "fault": options.fault, "world_size": options.world_size,
        "verdict": verdicts.NOT_CHECKED, "message": f"{options.catalog.checker} not checked (stages: {', '.join(options.stages)})",
        "final_sha256": None, "runs": {}, "evidence": None, "error": None, "records": {}, "seconds": 0.0,
    }


def add_result(entry: ModelEntry, stage: str, result: Mapping[str, Any]) -> None:
    """Put a stage's result under ``entry[stage]``: its seconds add up, its first record stands
    for the entry when no determinism run did, and a failed stage makes the entry an ERROR."""
    results.add_section(entry, stage, result)
    entry["seconds"] = round(entry.get("seconds", 0.0) + result.get("seconds", 0.0), 3)
    if not entry.get("records") and result.get("records"):
        entry["records"] = {stage: result["records"][0]}
    if result.get("error") and entry.get("verdict") != verdicts.ERROR:
        before = entry.get("verdict")
        entry["verdict"] = verdicts.ERROR
        entry["message"] = f"{stage} stage: {result['error']['message']} (determinism: {before})"
        entry["error"] = result["error"]

