"""Step progress on the worker's stdout, for the live bar of ``reproci run``.

A line ``@reproci:step N/M`` goes out at most twice a second and at the last step. It is a
Python counter written to a pipe the backend already drains: no device sync, nothing in the
record, and a line nobody reads costs nothing but the write.
"""

from __future__ import annotations

import sys
import time

PREFIX = "@reproci:step "
INTERVAL_S = 0.5


class StepLine:
    def __init__(self, stop: int) -> None:
        self.stop = stop
        self._last = float("-inf")  # the first step goes out at once

    def __call__(self, step: int) -> None:
        now = time.monotonic()
        if step >= self.stop or now - self._last >= INTERVAL_S:
            self._last = now
            sys.stdout.write(f"{PREFIX}{step}/{self.stop}\n")
            sys.stdout.flush()


def parse(line: str) -> tuple[int, int] | None:
    """(step, stop) of a progress line, or None for any other line of the worker's output."""
    if not line.startswith(PREFIX):
        return None
    done, _, total = line[len(PREFIX):].strip().partition("/")
    try:
        return int(done), int(total)
    except ValueError:
        return None
