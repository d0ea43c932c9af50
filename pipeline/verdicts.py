"""Verdicts: few and distinct, each mapped to an exit code."""

from __future__ import annotations

from typing import Callable

from . import errors

PASS = "PASS"
NEW = "NEW"  # no golden yet for this image and model
NONDETERMINISTIC = "NONDETERMINISTIC"  # A != B
RESUME_BROKEN = "RESUME_BROKEN"  # A == B != C
UPGRADE_CHANGED = "UPGRADE_CHANGED"  # runs agree, golden differs, image/packages differ
ENV_CHANGED = "ENV_CHANGED"  # runs agree, golden differs, same image, hardware/threads differ
GOLDEN_MISMATCH = "GOLDEN_MISMATCH"  # runs agree, golden differs, identical identity
MODEL_CHANGED = "MODEL_CHANGED"  # model code/config identity differs: re-record, not an alert
ERROR = "ERROR"  # the run could not complete
NOT_CHECKED = "NOT_CHECKED"  # only the throughput stage ran: nothing was claimed about reproducibility

ALL = (PASS, NEW, NONDETERMINISTIC, RESUME_BROKEN, UPGRADE_CHANGED, ENV_CHANGED, GOLDEN_MISMATCH,
       MODEL_CHANGED, ERROR, NOT_CHECKED)

EXIT_CODES = {
    PASS: errors.EXIT_PASS,
    NEW: errors.EXIT_PASS,
    MODEL_CHANGED: errors.EXIT_PASS,
    NONDETERMINISTIC: errors.EXIT_REPRO_FAILURE,
    RESUME_BROKEN: errors.EXIT_REPRO_FAILURE,
    UPGRADE_CHANGED: errors.EXIT_DRIFT,
    ENV_CHANGED: errors.EXIT_DRIFT,
    GOLDEN_MISMATCH: errors.EXIT_DRIFT,
    ERROR: errors.EXIT_RUN_ERROR,
    NOT_CHECKED: errors.EXIT_PASS,
}

# When several models disagree, the exit code is the most serious one.
SEVERITY = [errors.EXIT_PASS, errors.EXIT_DRIFT, errors.EXIT_REPRO_FAILURE, errors.EXIT_RUN_ERROR]

STYLE = {PASS: "green", NEW: "cyan", MODEL_CHANGED: "yellow", NONDETERMINISTIC: "bold red",
         RESUME_BROKEN: "bold red", UPGRADE_CHANGED: "bold magenta", ENV_CHANGED: "magenta",
         GOLDEN_MISMATCH: "bold magenta", ERROR: "bold red", NOT_CHECKED: "dim"}


def exit_code(verdicts: list[str], *, ci: bool = False) -> int:
    """The most serious exit code; in CI mode a missing golden (NEW) is drift."""
    codes = [errors.EXIT_DRIFT if (v == NEW and ci) else EXIT_CODES[v] for v in verdicts] or [errors.EXIT_PASS]
    return max(codes, key=SEVERITY.index)


def first_difference(ev: dict | None, *, code: Callable[[str], str] = str) -> str:
    """The one short spelling of where runs first differ, for every table:
    'step 15, buffer:bn.running_mean, |Δ| 4.66e-10 (1 ULP)', 'step 0 (initial state), param:fc.weight',
    'controls off at model.py:52', or '-'. ``code`` formats a name (backticks in Markdown)."""
    if not ev:
        return "-"
    controls = ev.get("controls") or []
    if ev.get("cause") == "controls" and controls:
        c = controls[0]
        return f"controls off at {code(c['where'])}" if c.get("where") else f"{code(c['control'])} off at the {c.get('found_at')}"
    step = ev.get("step")
    parts = [("step 0 (initial state)" if step == 0 else f"step {step}") if step is not None else "final state"]
    if ev.get("tensor"):
        parts.append(code(ev["tensor"]))
    if ev.get("max_abs") is not None:
        ulp = f" ({ev['max_ulp']} ULP)" if ev.get("max_ulp") is not None else ""
        parts.append(f"|Δ| {ev['max_abs']:.3g}{ulp}")
    return ", ".join(parts)
