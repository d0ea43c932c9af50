"""``reproci bisect``: a failing (or drifting) model's check again, then the bisection by
configuration (this package). The bisection's own command, listed by its stage (``stage.py``)."""

from __future__ import annotations

from typing import Any

from ...commands.run import read_settings, run_command, run_with
from ...errors import UsageError


@run_command("bisect", without=("script", "resume_script", "script_name"),  # a script model is checked, not bisected
             helps={"models": "The model that failed (required, here or as models: in reproci.yaml): conv, transformer, "
                              "embedding, FILE.py:factory or module:factory. Repeatable."})
def bisect_cmd(**kwargs: Any) -> None:
    """Run the determinism check of -m MODEL with the failing run's options; when it fails (or
    leaves its golden), name the first factor whose removal restores equality."""
    settings = read_settings(kwargs)  # reproci.yaml, read once for the check and the run
    if not settings("models", None):
        raise UsageError("reproci bisect needs the model that failed: -m MODEL, or models: in reproci.yaml "
                         "(and the failing run's options)")
    run_with("bisect", kwargs, settings)
