"""After the strict stage: compare with the image's golden, and record goldens on request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import drift, golden, verdicts
from .golden import Golden
from .options import RunOptions

OWN_FAILURES = (verdicts.NONDETERMINISTIC, verdicts.RESUME_BROKEN, verdicts.ERROR)


def _record(run_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    return json.loads((run_dir / entry["records"]["A"]).read_text())


def _final_state(run_dir: Path, entry: dict[str, Any]) -> dict[str, Any] | None:
    path = run_dir / entry["model"] / "final-A.pt"
    if not path.is_file():
        return None
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def apply(options: RunOptions, document: dict[str, Any], run_dir: Path, old: Golden | None) -> None:
    """Fill in each model's ``golden`` section and combined verdict; update goldens if asked."""
    for entry in document["models"]:
        if entry.get("verdict") in OWN_FAILURES or "A" not in (entry.get("records") or {}):
            continue  # not reproducible by itself, or the strict stage did not run: nothing to compare
        record = _record(run_dir, entry)
        section = drift.compare(entry, record, _final_state(run_dir, entry), document, old, ci=options.ci,
                                image_name=options.image_name)
        entry["golden"] = section
        entry["verdict"] = section["verdict"]
        if section["verdict"] in (verdicts.PASS, verdicts.NEW, verdicts.MODEL_CHANGED):
            entry["message"] = f"{entry['message']}; {section['message']}"  # own checks passed: say so too
        else:
            entry["message"] = section["message"]
    regressions = _throughput_regressions(options, document, old)
    document["golden"] = {"file": str(golden.path_for(options.goldens_dir, options.image_name)),
                          "existed": old is not None, "updated": False}
    vs = [m["verdict"] for m in document["models"]]
    document["summary"]["verdicts"] = {v: vs.count(v) for v in sorted(set(vs))}
    document["summary"]["exit_code"] = verdicts.exit_code(vs, ci=options.ci)
    if regressions and options.slowdown_fails and document["summary"]["exit_code"] == 0:
        document["summary"]["exit_code"] = verdicts.errors.EXIT_DRIFT
    if options.update_golden:
        update(options, document, run_dir)


def update(options: RunOptions, document: dict[str, Any], run_dir: Path) -> None:
    """Record goldens from this run, only if every model passed its own strict checks."""
    bad = [f"{m['model']} is {m['verdict']}" for m in document["models"]
           if m.get("verdict") in OWN_FAILURES]
    bad += [f"{m['model']} was not checked (add --stage determinism)" for m in document["models"]
            if "A" not in (m.get("records") or {}) and m.get("verdict") not in OWN_FAILURES]
    if bad:
        document["golden"]["refused"] = (f"golden not updated: {', '.join(bad)}; a golden is only recorded from "
                                         "runs that are reproducible by themselves")
        return
    records = {m["model"]: _record(run_dir, m) for m in document["models"]}
    states = {m["model"]: _final_state(run_dir, m) or {} for m in document["models"]}
    path = golden.write(options.goldens_dir, options.image_name, document, records, states)
    document["golden"].update(updated=True, file=str(path))
    # Drift against the previous golden is the evidence of this update, not a failure of it.
    vs = [verdicts.PASS if m["verdict"] in (verdicts.UPGRADE_CHANGED, verdicts.ENV_CHANGED, verdicts.GOLDEN_MISMATCH,
                                           verdicts.NEW, verdicts.MODEL_CHANGED) else m["verdict"]
          for m in document["models"]]
    document["summary"]["exit_code"] = verdicts.exit_code(vs)


def cleanup(options: RunOptions, run_dir: Path, document: dict[str, Any]) -> None:
    if options.keep_checkpoints:
        return
    for entry in document["models"]:
        (run_dir / entry["model"] / "final-A.pt").unlink(missing_ok=True)


def _throughput_regressions(options: RunOptions, document: dict[str, Any], old: Golden | None) -> list[str]:
    """Warn (or fail, with --slowdown-fails) when strict mode got slower than the golden's run."""
    if old is None:
        return []
    from .stages.throughput import check_regression, throughput_summary

    out = []
    for entry in document["models"]:
        g = old.models.get(entry["model"])
        current = throughput_summary(entry)
        if g is None or not current or not g.entry.get("throughput"):
            continue
        msg = check_regression(current, g.entry["throughput"], options.slowdown_factor)
        if msg:
            entry["throughput_regression"] = msg
            entry["throughput"]["regression"] = msg
            out.append(f"{entry['model']}: {msg}")
    return out
