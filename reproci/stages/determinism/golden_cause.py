"""Proving the cause of a golden drift: re-run with the golden's setting of each factor that
software can set, and see whether the golden comes back bit for bit.

When a model's runs agree with each other but not with the golden, and the environments
differ in factors a launcher controls (the CPU kernel level, a kernel-selecting variable,
the thread count, the world size), one more run of that model, to the first differing step
plus one, with those factors as the golden had them, says whether they are the cause:
"confirmed: with ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 (the golden's), conv
matches the golden bit for bit through step 2". Factors no launcher can set (the GPU model,
the driver, a CPU's missing instructions) are named as unconfirmed. Only the affected models
run, only that far.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, TypedDict

from ... import cpu_flags, typed, verdicts
from ...document import Entry
from ...entry_sections import EvidenceView, view
from ...errors import WorkerFailed
from ...golden import comparison
from ...golden.comparison import Comparison, Confirmation
from ...golden.divergence import step_rows
from ...golden.environment import host_text
from ...results import ModelEntry, ResultsDocument
from ...runner import run_worker
from ...worker.process.launch import CPU_ISA_CAPABILITY
from ...worker.run_record import RunRecord, Trajectory
from ..base import StageRun
from ..runs import base_spec

_LEVELS = {v: k for k, v in CPU_ISA_CAPABILITY.items()}  # "AVX2" -> "avx2"
_RANK = ("DEFAULT", "AVX2", "AVX512")


class Change(TypedDict, total=False):
    """Changes to a run's spec (``WorkerSpec``'s fields) that put back the golden's value of a
    factor software can set: each key only where that factor differs."""

    env: dict[str, str | None]  # kernel-selecting variables (None: unset)
    threads: int
    world_size: int
    cpu_isa: str  # the CPU kernel level (launch.CPU_ISA_ENV)


def settings(env_diff: dict[str, list[Any]]) -> tuple[Change, list[str]]:
    """(the spec changes that put back the golden's value of each settable factor, the
    factors that cannot be set from software)."""
    change: Change = {"env": {}}
    unsettable: list[str] = []
    for key, (old, new) in env_diff.items():
        if key.startswith("kernel_env."):
            change["env"][key.removeprefix("kernel_env.")] = old
        elif key == "threads.intra_op" and isinstance(old, int):
            change["threads"] = old
        elif key == "world_size" and isinstance(old, int):
            change["world_size"] = old
        elif key == "cpu_capability":
            lacking = cpu_flags.host_lacks(_LEVELS[old]) if old in _LEVELS else None  # a run there dies of SIGILL
            if old in _LEVELS and lacking is None:  # a lower level is a cap; a higher one, if this CPU has it, lifts a cap
                change["cpu_isa"] = _LEVELS[old]
            else:
                unsettable.append(host_text(key, old, new) + (f": {lacking[0]}" if lacking else ""))
        elif key.startswith(("gpu.", "cpu_id.", "cpu", "machine")) and key != "cpu_id.isa":
            unsettable.append(host_text(key, old, new))
    if "cpu_isa" in change:  # the cap sets these itself; the golden's own values of them are the same thing
        for var in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
            change["env"].pop(var, None)
    if not change["env"]:
        del change["env"]
    return change, unsettable


def _said(change: Change) -> str:
    from ...worker.process.launch import CPU_ISA_ENV

    parts = [f"{k}={v}" for k, v in CPU_ISA_ENV.get(change.get("cpu_isa", ""), {}).items()]
    parts += [f"{k}={v}" if v is not None else f"{k} unset" for k, v in (change.get("env") or {}).items()]
    parts += [f"--threads {change['threads']}"] if "threads" in change else []
    parts += [f"--world-size {change['world_size']}"] if "world_size" in change else []
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 2 else parts)


def _cause(change: Change) -> str:
    names = (["the CPU kernel level (the instruction set the kernels use)"] if "cpu_isa" in change else []) + (
        [", ".join(change["env"])] if change.get("env") else []) + (
        ["the thread count"] if "threads" in change else []) + (["the world size"] if "world_size" in change else [])
    return f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} the cause"


def confirm(run: StageRun, document: ResultsDocument) -> None:
    """For each model drifting in settable factors: one run with the golden's settings; the
    answer lands in ``golden.confirmation`` and at the end of the model's message."""
    options, ctx, golden = run.options, run.ctx, run.old_golden
    if golden is None:
        return
    refs = {m.name: m for m in options.models}
    for entry in document["models"]:
        section = comparison.of(entry)
        if Entry.of(entry).verdict not in (verdicts.ENV_CHANGED, verdicts.GOLDEN_MISMATCH) or entry["model"] not in refs:
            continue
        change, unsettable = settings(section.env_diff if section else {})
        if not {"env", "threads", "world_size", "cpu_isa"} & set(change):
            if unsettable:
                _confirmation(entry, section, Confirmation(confirmed=None, settings={}, unsettable=unsettable))
                entry["message"] += f"; unconfirmed: {', '.join(unsettable)} cannot be set from software"
            continue
        evidence = view(EvidenceView, section.evidence) if section else None
        step = evidence.step if evidence else None
        steps = options.steps if step is None else min(options.steps, step + 1)
        spec = dataclasses.replace(base_spec(options, refs[entry["model"]], "confirm",
                                             project_commit=run.project_commit, image=run.image),
                                   output="record-confirm.json", steps=steps, **change)
        t0 = time.monotonic()
        try:
            record = run_worker(ctx, spec)
        except WorkerFailed as e:
            if e.kind == "attestation":  # e.g. the golden's CPU level is above what this CPU has
                _confirmation(entry, section, Confirmation(confirmed=None, settings=dict(change),
                                                           unsettable=[*unsettable, str(e)]))
                entry["message"] += f"; unconfirmed: the golden's settings ({_said(change)}) do not take effect here"
            else:
                print(f"warning: {entry['model']}: the run with the golden's settings failed ({e})", file=sys.stderr)
            continue
        g = golden.models[entry["model"]]
        confirmed = matches(g.as_record(), record, steps, options.steps)
        _confirmation(entry, section, Confirmation(confirmed=confirmed, settings=dict(change), steps=steps,
                                                   unsettable=unsettable, seconds=round(time.monotonic() - t0, 1)))
        through = f"through step {steps}" if steps < options.steps else "to the end"
        if confirmed:
            entry["message"] += (f"; confirmed: with {_said(change)} (the golden's), {entry['model']} matches the golden "
                                 f"bit for bit {through}: {_cause(change)}")
        else:
            entry["message"] += (f"; not confirmed: with {_said(change)} (the golden's), {entry['model']} still differs "
                                 f"from the golden {through}" + (f"; {', '.join(unsettable)} cannot be set from software"
                                                                 if unsettable else ""))


def _confirmation(entry: ModelEntry, section: Comparison | None, confirmation: Confirmation) -> None:
    """The answer, in the model's golden section (where it has one)."""
    if section is not None:
        entry["golden"] = typed.replace(section, confirmation=confirmation).to_json()


def matches(golden_record: Trajectory, record: RunRecord, steps: int, full: int) -> bool:
    """Whether a run to ``steps`` reproduces the golden's checksums at every one of its steps
    (and its final hash, when it ran the full length)."""
    ours, theirs = step_rows(record), step_rows(golden_record)
    if steps == full:
        return record.final_sha256 == golden_record.final_sha256
    return bool(ours) and bool(theirs) and all(theirs.get(s) == row for s, row in ours.items())
