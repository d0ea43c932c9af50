"""``reproci bisect``: the failing check of the models given, re-run with compile, AMP, loader
workers, ranks and threads turned off one at a time (``stages.bisect``)."""

from __future__ import annotations

from typing import Any

import click

from ..errors import UsageError
from .run import run_and_report, run_options


@click.command("bisect")
@run_options
def bisect_cmd(**kwargs: Any) -> None:
    """Run the determinism check of -m MODEL with the failing run's options; when it fails (or
    leaves its golden), name the first factor whose removal restores equality."""
    if not kwargs.get("models"):
        raise UsageError("reproci bisect needs the model that failed: -m MODEL (and the failing run's options)")
    kwargs["stages"] = tuple(dict.fromkeys((*(kwargs.get("stages") or ("determinism",)), "bisect")))
    run_and_report(kwargs)
