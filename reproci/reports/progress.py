"""Progress of ``reproci run`` while it runs, on stderr.

In a log (a pipe, a file, GitHub Actions) each run's start and end is one line with the
time since the start, and a run that goes on says where it is every ``HEARTBEAT_S`` seconds
("conv: run A at step 120/300"), so a CI log shows what ran, how far it got and how fast and
a long run is never silent; on a terminal a live bar shows the latest event, the runs
finished and the elapsed time.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

HEARTBEAT_S = 30.0  # in a log, a line per run at most this often while it goes on


class _Steps(ProgressColumn):
    """'120/300 steps' on a run's bar; nothing on the overall line, whose end is not known."""

    def render(self, task: Task) -> Text:
        return Text(f"{int(task.completed)}/{int(task.total)} steps" if task.total else "", style="progress.download")


class RunProgress:
    """A ``progress(message)`` callable for the stages (thread-safe: runs overlap)."""

    def __init__(self, console: Console, *, log: bool) -> None:
        self.console, self.log = console, log
        self.started = time.monotonic()
        self.finished = 0
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._runs: dict[tuple[str, str], TaskID] = {}  # a bar per worker run in flight
        self._said: dict[tuple[str, str], float] = {}  # in a log: when each run in flight last said where it is

    def __enter__(self) -> "RunProgress":
        if not self.log:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 _Steps(), TimeElapsedColumn(), console=self.console, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("starting", total=None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)

    def step(self, model: str, role: str, step: int, stop: int) -> None:
        """A worker run's step count, from its progress lines: a bar of its own while it runs;
        in a log, a line every ``HEARTBEAT_S`` seconds."""
        if self._bar is None:
            now = time.monotonic()
            with self._lock:
                last = self._said.setdefault((model, role), now)
                if step < stop and now - last >= HEARTBEAT_S:
                    self._said[(model, role)] = now
                    self.console.print(f"[{now - self.started:7.1f} s] {model}: run {role} at step {step}/{stop}",
                                       highlight=False, markup=False)
                elif step >= stop:
                    self._said.pop((model, role), None)
            return
        with self._lock:
            key = (model, role)
            if key not in self._runs:
                self._runs[key] = self._bar.add_task(f"  {model} run {role}", total=stop)
            self._bar.update(self._runs[key], completed=step, total=stop)
            if step >= stop:
                self._bar.remove_task(self._runs.pop(key))

    def __call__(self, message: str) -> None:
        with self._lock:
            if " done" in message:
                self.finished += 1
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, description=f"{message} ({self.finished} runs done)")
            else:
                self.console.print(f"[{time.monotonic() - self.started:7.1f} s] {message}", highlight=False,
                                   markup=False)
