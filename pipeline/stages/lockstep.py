"""Turn-taking for paired throughput runs: two (or three) fresh processes, one step each in turn.

Each run of a pair is its own process with its own mode, started together; after warm-up
each waits for a turn before every step and reports the step's end, so the modes alternate
step by step (order flipped every round: A B, B A, A B, ...). Whatever the neighbours on a
shared machine do, they do it to both modes alike, at the time scale of one step. On a CPU
the workers also move to the same CPUs for their turns (pipeline.worker.turns.Turns):
on different CPUs each would keep its own neighbours for the whole run.

A turn is one byte through a FIFO in the model's run folder (``<name>.go``, answered on
``<name>.done``); this side opens its ends before the launch, so the worker's opens never
block. A worker that dies closes its end, which ends the pair.
"""

from __future__ import annotations

import os
import select
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import WorkerFailed
from ..runner import RunContext, run_worker
from ..worker.process.spec import WorkerSpec

POLL_S = 0.5  # how often a wait for a turn's end checks that the worker is still alive


def supported() -> bool:
    return hasattr(os, "mkfifo")


class Turn:
    """The orchestrator's ends of one worker's FIFOs."""

    def __init__(self, work_dir: Path, name: str) -> None:
        self.paths = [work_dir / f"{name}.go", work_dir / f"{name}.done"]
        for p in self.paths:
            p.unlink(missing_ok=True)
            os.mkfifo(p, 0o600)
        self.go = os.open(self.paths[0], os.O_RDWR)  # never blocks; keeps the FIFO open for the worker
        self.done = os.open(self.paths[1], os.O_RDONLY | os.O_NONBLOCK)

    def give(self, worker: Future[Any], role: str) -> None:
        """Hand one turn to the worker and wait until it has used it."""
        os.write(self.go, b"g")
        while True:
            ready, _, _ = select.select([self.done], [], [], POLL_S)
            if ready:
                try:
                    data = os.read(self.done, 1)
                except BlockingIOError:
                    continue
                if data == b"d":
                    return
                raise WorkerFailed(f"run {role} stopped in the middle of its steps")
            if worker.done():
                raise WorkerFailed(f"run {role} ended before its steps were done")

    def release(self) -> None:
        os.write(self.go, b"g")

    def close(self) -> None:
        """Unlink first (a late worker's open fails instead of blocking), then close (EOF)."""
        for p in self.paths:
            p.unlink(missing_ok=True)
        for fd in (self.go, self.done):
            try:
                os.close(fd)
            except OSError:
                pass
        self.go = self.done = -1


def run_together(ctx: RunContext, specs: list[WorkerSpec], rounds: int) -> list[dict[str, Any]]:
    """Launch every spec at once and hand out ``rounds`` turns to each; return their records.

    Every spec must carry ``lockstep`` (the FIFO name) and take ``rounds`` steps after warm-up.
    A failure of any run fails the pair with that run's own message.
    """
    work = ctx.run_dir / specs[0].model_name
    work.mkdir(parents=True, exist_ok=True)
    turns = [Turn(work, str(s.lockstep)) for s in specs]
    failure: WorkerFailed | None = None
    records: list[dict[str, Any]] = []
    errors: list[WorkerFailed] = []
    try:
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            futures = [pool.submit(run_worker, ctx, s) for s in specs]
            try:
                for r in range(rounds):
                    order = range(len(specs)) if r % 2 == 0 else range(len(specs) - 1, -1, -1)
                    for i in order:
                        turns[i].give(futures[i], specs[i].role)
                for t in turns:
                    t.release()
            except BaseException as e:
                for t in turns:
                    t.close()  # the workers read end-of-file and stop; the pool then joins them
                if not isinstance(e, WorkerFailed):
                    raise
                failure = e
            for f in futures:
                try:
                    records.append(f.result())
                except WorkerFailed as e:
                    errors.append(e)
    finally:
        for t in turns:
            t.close()
    if errors:  # the run that died first says why; its partner only lost its turns
        own = [e for e in errors if "lockstep" not in str(e)]
        raise (own or errors)[0]
    if failure is not None:
        raise failure
    return records
