"""Launching one worker spec through a backend and reading back its record (``run_worker``);
the stages call it, ``orchestrate.run_all`` runs the stages."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .backends import Backend
from .errors import InfrastructureError, WorkerFailed, how_ended
from .worker import run_record
from .worker.process.spec import WorkerSpec, rank_path
from .worker.run_record import FailedRun, Launched, RunRecord

Progress = Callable[[str], None]
StepProgress = Callable[[str, str, int, int], None]


@dataclass
class RunContext:
    backend: Backend
    run_dir: Path
    timeout: float
    progress: Progress = lambda msg: None
    on_step: StepProgress = lambda model, role, step, stop: None  # a live bar's step counts
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


def run_many(ctx: RunContext, specs: Sequence[WorkerSpec], jobs: int) -> list[RunRecord | WorkerFailed]:
    """Every spec in its own fresh process, at most ``jobs`` at once (in ``ctx.slots`` when a
    caller shares them across models), in the order given. A run that fails is kept as its
    ``WorkerFailed``, so that one failed run leaves the others' records; anything else (an
    interrupt, the engine gone) is raised once every run in flight has ended."""
    if jobs >= 2 and ctx.slots is None:
        ctx = dataclasses.replace(ctx, slots=threading.BoundedSemaphore(jobs))
    futures: list[Future[RunRecord]] = []
    for spec in specs:
        futures.append(background(run_worker, ctx, spec))
        if jobs < 2:
            settle(futures[-1])  # one at a time
    settle(*futures)
    outcomes: list[RunRecord | WorkerFailed] = []
    for f in futures:
        e = f.exception()
        if e is not None and not isinstance(e, WorkerFailed):
            raise e
        outcomes.append(e if e is not None else f.result())
    return outcomes


def _disk_full(text: str) -> bool:
    """Whether a worker's last words say it ran out of disk (ENOSPC): the whole run stops there,
    naming what was being written, rather than failing later on the results file."""
    return "No space left on device" in text or "[Errno 28]" in text


def _shown(path: Path) -> str:
    """A path as a user reads it: relative to the working directory when it is under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except (ValueError, OSError):  # elsewhere, or the working directory is gone
        return str(path)


def _from(spec: WorkerSpec) -> str:
    return f", resuming from {Path(spec.resume_from).name}" if spec.resume_from else ""


def run_worker(ctx: RunContext, spec: WorkerSpec, on_launch: Callable[[], None] | None = None) -> RunRecord:
    """Write the spec, launch it in a fresh process, return the record (or raise WorkerFailed).
    ``on_launch`` is called as the process starts (once a job slot is free, and any fork server
    or container it needs is up)."""
    ctx.backend.refuse_if_closed(spec)
    work = ctx.run_dir / spec.model_name
    work.mkdir(parents=True, exist_ok=True)
    spec = ctx.backend.prepare_spec(spec, ctx.run_dir)
    spec_file = work / f"spec-{spec.role}.json"
    spec.write(spec_file)
    out = work / spec.output
    out.unlink(missing_ok=True)
    with ctx.slots if ctx.slots is not None else contextlib.nullcontext():
        ctx.backend.refuse_if_closed(spec)  # interrupted while this run waited for a slot
        stop = spec.steps if spec.dump_at is None else min(spec.steps, spec.dump_at)  # a probe stops at its step
        ctx.progress(f"{spec.model_name}: run {spec.role} started ({stop} steps{_from(spec)})")
        started: list[float] = []

        def on_start(at: float | None) -> None:  # the process really starts (after a fork server's or container's own start)
            started.append(min(at, time.monotonic()) if at is not None else time.monotonic())
            if on_launch is not None:
                on_launch()
        called = time.monotonic()
        result = ctx.backend.launch(spec, spec_file, timeout=ctx.timeout, on_start=on_start,
                                    on_step=lambda step, stop: ctx.on_step(spec.model_name, spec.role, step, stop))
        ended = time.monotonic()
        launched = started[0] if started else ended - result.seconds
    if result.limit is not None:  # before the record: a run stopped by a limit may still have written one
        raise WorkerFailed(f"run {spec.role} stopped: {result.limit}", kind="limit")  # a run at a limit may time out
    if result.timed_out:
        raise WorkerFailed(f"run {spec.role} timed out after {ctx.timeout:g} s; raise --timeout or use a smaller profile",
                           kind="timeout")
    record, record_file = _read(out), out
    if spec.script is not None and result.returncode != 0 and not (isinstance(record, FailedRun) and record.traceback):
        raise WorkerFailed(f"run {spec.role}: the command {how_ended(result.returncode)}: {last_lines(result.log_tail)}")
    if record is None and spec.world_size > 1:
        record, record_file = rank_failure(work, spec) or (None, out)
    if record is None:
        last = result.log_tail.strip().splitlines()[-1:] or ["(no output)"]
        if _disk_full(result.log_tail):
            raise InfrastructureError(f"disk full while run {spec.role} of {spec.model_name} wrote its files in {work} "
                                      f"({last[0][:200]}); free space and run again")
        raise WorkerFailed(f"run {spec.role} {how_ended(result.returncode)} and wrote no record: {last[0][:300]}")
    if isinstance(record, FailedRun):
        if record.error_kind == "no-device":
            raise InfrastructureError(record.message)  # no run of this invocation can work: stop it
        if _disk_full(record.message):
            raise InfrastructureError(f"disk full while run {spec.role} of {spec.model_name} wrote its files in {work} "
                                      f"({record.message}); free space and run again")
        kind = record.error_kind or "crash"
        where = f"; traceback in {_shown(record_file)}" if kind == "crash" and record.traceback else ""
        raise WorkerFailed(f"run {spec.role}: {record.message or 'failed'}{where}", kind=kind)
    record.launched = Launched(wall_s=ended - launched, start_wait_s=launched - called, how=result.launch, at=launched)
    done = len(record.losses)
    rate = record.steps_per_s or (done / record.timings.train_s if done and record.timings.train_s else None)
    ctx.progress(f"{spec.model_name}: run {spec.role} done: {done} steps, "
                 f"{f'{rate:.1f} steps/s, ' if rate else ''}{record.launched.wall_s:.1f} s")
    return record


def last_lines(tail: str, n: int = 3) -> str:
    """A command's last ``n`` lines of output as one line (a traceback's last lines say what failed)."""
    lines = [line.strip() for line in tail.strip().splitlines() if line.strip()][-n:]
    text = " | ".join(lines) if lines else "(no output)"
    return text if len(text) <= 600 else "..." + text[-597:]


def _read(path: Path) -> RunRecord | FailedRun | None:
    """The record file a run wrote, typed; None when there is none, or it is not whole JSON."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return run_record.from_json(data)


def rank_failure(work: Path, spec: WorkerSpec) -> tuple[FailedRun, Path] | None:
    """The error record of the first rank above 0 that failed, its message naming the rank, and
    its file: when a rank fails, torchrun stops the others, and rank 0 then has no record to write."""
    for rank in range(1, spec.world_size):
        path = work / rank_path(spec.output, rank)
        try:
            record = run_record.from_json(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, FailedRun):
            return dataclasses.replace(record, message=f"rank {rank}: {record.message or 'failed'}"), path
    return None
