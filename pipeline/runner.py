"""Launching one worker spec through a backend and reading back its record."""

from __future__ import annotations

import contextlib
import json
import threading
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .backends import Backend
from .errors import InfrastructureError, RunError
from .worker.spec import WorkerSpec

Progress = Callable[[str], None]


@dataclass
class RunContext:
    backend: Backend
    run_dir: Path
    timeout: float
    progress: Progress = lambda msg: None
    slots: threading.BoundedSemaphore | None = None  # at most --jobs worker processes at once, across models


def background(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
    """Run ``fn`` in a daemon thread; its future holds the outcome. Daemon, so that on Ctrl-C
    the process exits at once: leaving the backend has already stopped every worker, and a
    thread still waiting on one must not keep the interpreter alive."""
    future: Future[Any] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to whoever reads the future
            future.set_exception(e)

    threading.Thread(target=run, daemon=True, name=f"reproci-{getattr(fn, '__name__', 'task')}").start()
    return future


def settle(*futures: Future[Any]) -> None:
    """Wait for runs in flight whose outcome no longer matters (a partner failed)."""
    wait(futures)


class WorkerFailed(RunError):
    """One worker run failed; carries its error kind for the verdict's evidence."""

    def __init__(self, message: str, kind: str = "crash") -> None:
        super().__init__(message)
        self.kind = kind


def _refuse_if_closed(ctx: RunContext, spec: WorkerSpec) -> None:
    """After Ctrl-C the backend is left and the run directory removed: start nothing, write nothing."""
    if ctx.backend.closed:
        raise WorkerFailed(f"run {spec.role} not started: the run was interrupted", kind="interrupted")


def execute(ctx: RunContext, spec: WorkerSpec) -> dict[str, Any]:
    """Write the spec, launch it in a fresh process, return the record (or raise WorkerFailed)."""
    _refuse_if_closed(ctx, spec)
    work = ctx.run_dir / spec.model_name
    work.mkdir(parents=True, exist_ok=True)
    spec = ctx.backend.prepare_spec(spec, ctx.run_dir)
    spec_file = work / f"spec-{spec.role}.json"
    spec.write(spec_file)
    out = work / spec.output
    out.unlink(missing_ok=True)
    ctx.progress(f"{spec.model_name}: run {spec.role} started")
    with ctx.slots if ctx.slots is not None else contextlib.nullcontext():
        _refuse_if_closed(ctx, spec)  # interrupted while this run waited for a slot
        result = ctx.backend.launch(spec, spec_file, timeout=ctx.timeout)
    if result.timed_out:
        raise WorkerFailed(f"run {spec.role} timed out after {ctx.timeout:.0f} s; raise --timeout or use a smaller profile",
                           kind="timeout")
    record: dict[str, Any] | None = None
    if out.is_file():
        try:
            record = json.loads(out.read_text())
        except json.JSONDecodeError:
            record = None
    if record is None:
        last = result.log_tail.strip().splitlines()[-1:] or ["(no output)"]
        raise WorkerFailed(f"run {spec.role} died with exit code {result.returncode} and wrote no record: {last[0][:300]}")
    if record.get("status") != "ok" and record.get("error_kind") == "no-device":
        raise InfrastructureError(str(record.get("message")))  # no run of this invocation can work: stop it
    if record.get("status") != "ok":
        raise WorkerFailed(f"run {spec.role}: {record.get('message', 'failed')}", kind=record.get("error_kind", "crash"))
    record["wall_s"] = result.seconds
    ctx.progress(f"{spec.model_name}: run {spec.role} done in {result.seconds:.1f} s")
    return record
