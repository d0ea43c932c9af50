"""What every stage after the determinism stage does to a model's entry in the results."""

from __future__ import annotations

from typing import Any

from .. import verdicts


def add_result(entry: dict[str, Any], stage: str, result: dict[str, Any]) -> None:
    """Put a stage's result under ``entry[stage]``: its seconds add up, its first record stands
    for the entry when no determinism run did, and a failed stage makes the entry an ERROR."""
    entry[stage] = result
    entry["seconds"] = round(entry.get("seconds", 0.0) + result.get("seconds", 0.0), 3)
    if not entry.get("records") and result.get("records"):
        entry["records"] = {stage: result["records"][0]}
    if result.get("error") and entry.get("verdict") != verdicts.ERROR:
        before = entry.get("verdict")
        entry["verdict"] = verdicts.ERROR
        entry["message"] = f"{stage} stage: {result['error']['message']} (determinism: {before})"
        entry["error"] = result["error"]
