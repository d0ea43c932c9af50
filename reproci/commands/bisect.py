"""``reproci bisect``: a failing (or drifting) model's check again, then the bisection by
configuration (``stages.bisect``)."""

from __future__ import annotations

from typing import Any

import click

from ..config_file import load_config
from ..errors import UsageError
from .run import run_and_report, run_options


def configured(kwargs: dict[str, Any], key: str) -> Any:
    """An option as the run will take it: the command line's, else reproci.yaml's (``--config``)."""
    given = kwargs.get(key)
    return given if given not in (None, ()) else load_config(kwargs.get("config"))[0].get(key)


def with_stage(kwargs: dict[str, Any], stage: str, verb: str) -> None:
    if verb == "bisect" and not configured(kwargs, "models"):
        raise UsageError("reproci bisect needs the model that failed: -m MODEL, or models: in reproci.yaml "
                         "(and the failing run's options)")
    kwargs["stages"] = tuple(dict.fromkeys((*(kwargs.get("stages") or ("determinism",)), stage)))
    run_and_report(kwargs)


@click.command("bisect")
@run_options(helps={"models": "The model that failed (required, here or as models: in reproci.yaml): conv, transformer, "
                              "embedding, FILE.py:factory or module:factory. Repeatable."})
def bisect_cmd(**kwargs: Any) -> None:
    """Run the determinism check of -m MODEL with the failing run's options; when it fails (or
    leaves its golden), name the first factor whose removal restores equality."""
    with_stage(kwargs, "bisect", "bisect")
