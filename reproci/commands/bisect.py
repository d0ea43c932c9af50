"""``reproci bisect``: a failing (or drifting) model's check again, then the bisection by
configuration (``stages.bisect``)."""

from __future__ import annotations

from typing import Any

import click

from ..errors import UsageError
from ..settings.config_file import Settings
from .run import run_and_report, run_options


def with_stage(kwargs: dict[str, Any], stage: str, verb: str, settings: Settings | None = None) -> None:
    """Run with ``stage`` added; ``settings``: the command line over reproci.yaml, read once (here
    unless the command read it already), which the run's options are built from."""
    settings = Settings.read(kwargs) if settings is None else settings
    if verb == "bisect" and not settings("models", None):
        raise UsageError("reproci bisect needs the model that failed: -m MODEL, or models: in reproci.yaml "
                         "(and the failing run's options)")
    kwargs["stages"] = tuple(dict.fromkeys((*(kwargs.get("stages") or ("determinism",)), stage)))
    run_and_report(kwargs, settings=settings)


@click.command("bisect")
@run_options(without=("script", "resume_script", "script_name"),  # a script model is checked, not bisected
             helps={"models": "The model that failed (required, here or as models: in reproci.yaml): conv, transformer, "
                              "embedding, FILE.py:factory or module:factory. Repeatable."})
def bisect_cmd(**kwargs: Any) -> None:
    """Run the determinism check of -m MODEL with the failing run's options; when it fails (or
    leaves its golden), name the first factor whose removal restores equality."""
    with_stage(kwargs, "bisect", "bisect")
