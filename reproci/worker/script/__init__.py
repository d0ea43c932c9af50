"""A team's own training script as a model: ``reproci run --script CMD --resume-script CMD``.

Runs A, B and C are the script's own processes. ``python -m reproci.worker.script SPEC``
(``__main__``) prepares the run's output folder ``{out}`` (empty for A and B; for C a copy of
the folder run A left as its step k + 1 began), fills the command's placeholders and replaces
itself with the command. A ``sitecustomize`` on ``PYTHONPATH`` (``site/``) is loaded by every
Python process the command starts (``torchrun`` and ``accelerate launch`` children too); in the
process that trains it switches strict determinism on before the script's first line and
installs torch's global hooks (``hooks.ScriptTrace``): a step is an optimizer step, and each
one leaves the same record a factory model's step leaves.

Standard library, torch and numpy only, like the rest of the worker.
"""

from __future__ import annotations

import string

PLACEHOLDERS = ("steps", "resume_at", "out")  # {steps}: N, {resume_at}: k, {out}: the run's own output folder
SPEC_VARIABLE = "REPROCI_SCRIPT_SPEC"  # the run's spec file, for the hooks
TOP_PID_VARIABLE = "REPROCI_SCRIPT_PID"  # the command's own process (the launcher execs into it)


def placeholders(command: str) -> list[str]:
    """The placeholders a command names (``{steps}``...), in order; ValueError for a brace that
    opens no placeholder (``{`` alone: write ``{{``)."""
    return [field for _, field, _, _ in string.Formatter().parse(command) if field is not None]


def fill(command: str, *, steps: int, resume_at: int, out: str) -> str:
    """The command with its placeholders filled in (``{{`` and ``}}`` are literal braces)."""
    return command.format(steps=steps, resume_at=resume_at, out=out)
