"""Progress of ``reproci run`` while it runs, on stderr.

In a log (a pipe, a file, GitHub Actions) each run's start and end is one line with the
time since the start, so a CI log shows what ran, how far it got and how fast; on a
terminal a live bar shows the latest event, the runs finished and the elapsed time.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class RunProgress:
    """A ``progress(message)`` callable for the stages (thread-safe: runs overlap)."""

    def __init__(self, console: Console, *, log: bool) -> None:
        self.console, self.log = console, log
        self.started = time.monotonic()
        self.finished = 0
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> "RunProgress":
        if not self.log:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 TextColumn("[dim]{task.completed} runs done"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("starting", total=None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)

    def __call__(self, message: str) -> None:
        with self._lock:
            if " done" in message:
                self.finished += 1
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, description=message, completed=self.finished)
            else:
                self.console.print(f"[{time.monotonic() - self.started:7.1f} s] {message}", highlight=False,
                                   markup=False)
