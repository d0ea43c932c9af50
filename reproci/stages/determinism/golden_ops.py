"""Per-op hashes of a model's first steps, kept with its golden, so that a later run in
another environment (other threads, another image) names the first op whose output
changed, without the old environment at hand.

When a golden is recorded, one more short run per model records every aten op of its first
``OPS_STEPS`` steps (``worker/oprecord.py``, digests of the outputs only); the golden's
sidecar keeps each op's overload and a short hash of its outputs. When a later run drifts
from the golden on the same batch at one of those steps, one run in the new environment
records that step again, and the first op whose outputs differ is named: "threads.intra_op
1 → 2 first changed aten::convolution_backward in conv at model.py:88 (forward), backward
pass". Normal runs never record ops.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from typing import Any

from ... import typed, verdicts
from ...document import Entry
from ...entry_sections import Evidence, EvidenceView, FirstOp, view
from ...errors import WorkerFailed
from ...golden import comparison, ops
from ...golden.comparison import Comparison
from ...golden.store import Golden
from ...results import Image, ModelEntry, ResultsDocument
from ...runner import RunContext, run_worker
from ...settings.models import ModelRef
from ...settings.options import RunOptions
from ...worker.process.spec import WorkerSpec
from ..base import StageRun
from ..runs import base_spec

OPS_STEPS = 3  # the first steps whose per-op hashes a golden keeps


def _spec(options: RunOptions, model: ModelRef, steps: tuple[int, ...], *, project_commit: str | None,
          image: Image) -> WorkerSpec:
    return dataclasses.replace(base_spec(options, model, "ops", project_commit=project_commit, image=image),
                               output="record-ops.json", dump_at=max(steps), ops_path="ops-golden-{step}.pt",
                               ops_steps=steps, fingerprints=False,
                               world_size=1)  # both sides in one process: comparable across goldens


def compact(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(overloads, short output hashes) of a step's op rows: what a golden keeps."""
    return ([str(r["overload"]) for r in rows],
            [hashlib.blake2b(str(r["digest"]).encode(), digest_size=8).hexdigest() for r in rows])


def _recorded(ctx: RunContext, spec: WorkerSpec) -> dict[int, list[dict[str, Any]]]:
    """Run the spec; every recorded step's op rows (the files are removed)."""
    run_worker(ctx, spec)
    out = {}
    for step in spec.ops_steps:
        path = ctx.run_dir / spec.model_name / spec.ops_path.format(step=step)  # type: ignore[union-attr]
        out[step] = ops.load(path)["rows"]
        path.unlink(missing_ok=True)
    return out


def record(run: StageRun, models: list[ModelRef]) -> dict[str, dict[int, tuple[list[str], list[str]]]]:
    """Per model, per step of the first ``OPS_STEPS``: what the golden keeps. A model whose
    recording fails keeps no per-op hashes (a warning says so); its golden is still recorded."""
    options, ctx = run.options, run.ctx
    steps = tuple(range(1, min(OPS_STEPS, options.steps) + 1))
    out: dict[str, dict[int, tuple[list[str], list[str]]]] = {}
    for model in models:
        try:
            rows = _recorded(ctx, _spec(options, model, steps, project_commit=run.project_commit, image=run.image))
        except (WorkerFailed, OSError) as e:
            print(f"warning: {model.name}: per-op hashes not recorded ({e}); a later drift will not name its op",
                  file=sys.stderr)
            continue
        out[model.name] = {step: compact(r) for step, r in rows.items()}
    return out


def name_changes(run: StageRun, document: ResultsDocument) -> None:
    """For each model that drifted from the golden on the same batch at a step whose per-op
    hashes the golden keeps: record that step here and name the first op that changed."""
    options, ctx = run.options, run.ctx
    golden: Golden | None = run.old_golden
    if golden is None:
        return
    refs = {m.name: m for m in options.models}
    for entry in document["models"]:
        section = comparison.of(entry)
        evidence: Evidence = (section.evidence if section else None) or {}
        kept = golden.models[entry["model"]].ops if entry["model"] in golden.models else {}
        seen = view(EvidenceView, evidence)
        step = seen.step if seen else None
        if Entry.of(entry).verdict not in verdicts.DRIFTING or seen is None or seen.cause != "compute":
            continue
        if step not in kept:  # say why no op is named, rather than leave the reader to wonder
            entry["message"] += f"; the first changed op is not named: {_unnamed(kept, step)}"
            continue
        try:
            rows = _recorded(ctx, _spec(options, refs[entry["model"]], (step,),
                                        project_commit=run.project_commit, image=run.image))[step]
        except (WorkerFailed, OSError) as e:
            _name(entry, section, evidence, None)
            print(f"warning: {entry['model']}: could not record step {step} to name the changed op ({e})", file=sys.stderr)
            continue
        op = _first_changed(rows, kept[step])
        _name(entry, section, evidence, op)
        if op.get("found"):
            entry["message"] += f"; first changed op: {verdicts.op_text(op)}"  # the cause is said once, before


def _name(entry: ModelEntry, section: Comparison | None, evidence: Evidence, op: FirstOp | None) -> None:
    """The first changed op (None: it could not be recorded), in the evidence of the model's golden section."""
    if section is not None:
        entry["golden"] = typed.replace(section, evidence={**evidence, "op": op}).to_json()


def _unnamed(kept: dict[int, Any], step: int | None) -> str:
    if not kept:
        return "the golden keeps no per-op hashes for this model (a golden update records them)"
    steps = sorted(kept)
    kept_steps = f"the golden keeps per-op hashes of steps {steps[0]}–{steps[-1]}"
    if step is None:  # no recorded step differs (a change outside them): there is no step to name
        return kept_steps
    return f"{kept_steps}, and this difference begins {'before the first step' if step == 0 else f'at step {step}'}"


def _first_changed(rows: list[dict[str, Any]], kept: tuple[list[str], list[str]]) -> FirstOp:
    """The first op of this run's step whose outputs differ from the golden's."""
    overloads, digests = compact(rows)
    here = {"rows": [{**r, "digest": d} for r, d in zip(rows, digests)], "kept": {}}
    there = {"rows": [{"op": o.split(".")[1] if "." in o else o, "overload": o, "digest": d}
                      for o, d in zip(*kept)], "kept": {}}
    return ops.first_op_difference(here, there)

