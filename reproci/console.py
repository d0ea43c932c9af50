"""The two consoles of the CLI, and where output goes.

The rule: stdout carries the results (the verdict table, each model's verdict and message,
ERROR verdicts included, the throughput table, the results path), so ``reproci run > log``
keeps the whole report. stderr carries reproci's own voice: progress, notices, warnings,
and the one-line ``error:`` of a command that could not do its job (exit 2, 5, 6, 130).

Where there is no terminal (a CI log, a pipe, ``GITHUB_ACTIONS``) nothing is cut to 80
columns: lines are as wide as their content, so a tensor or op name is never shortened.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console

LOG_WIDTH = 400  # wide enough for any table reproci prints; only the content's width is used


def is_log(stream: TextIO) -> bool:
    """True where output is read later, not live: a pipe, a file, or a GitHub Actions log."""
    return os.environ.get("GITHUB_ACTIONS") == "true" or not stream.isatty()


def _console(stream: TextIO, *, stderr: bool) -> Console:
    width = LOG_WIDTH if is_log(stream) else None
    # emoji off: a user's text (a --gres gpu:x:1, a path, a model's message) prints as typed, never as :x: -> an emoji
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width, emoji=False)


def stdout() -> Console:
    return _console(sys.stdout, stderr=False)


def stderr() -> Console:
    return _console(sys.stderr, stderr=True)
