"""Turn-taking for paired throughput runs: two (or three) fresh processes, one step each in turn.

Each run of a pair is its own process with its own mode, started together; after warm-up
each waits for a turn before every step and reports the step's end, so the modes alternate
step by step (order flipped every round: A B, B A, A B, ...). Whatever the neighbours on a
shared machine do, they do it to both modes alike, at the time scale of one step. On a CPU
the workers also move to the same CPUs for their turns (reproci.worker.turns.Turns):
on different CPUs each would keep its own neighbours for the whole run.

A turn is one byte through a FIFO in the model's run folder (``<name>.go``, answered on
``<name>.done`` with the step's clocked time); this side opens its ends before the launch,
so the worker's opens never block. A worker that dies closes its end, which ends the pair.
Whoever hands out the turns sees each round's step times as they come (``on_round``) and
may end the timing early: the workers then take their profiled steps, if any, and finish.
"""

from __future__ import annotations

import os
import select
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from ...errors import WorkerFailed
from ...runner import RunContext, run_worker
from ...worker.process.spec import DONE, END_TIMING, GO, WorkerSpec
from ...worker.run_record import RunRecord

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

    def give(self, worker: Future[Any], role: str, turn: bytes = GO) -> tuple[float | None, bool]:
        """Hand one turn to the worker and wait until it has used it: (the step's clocked
        seconds, None when it was not timed; whether it was the worker's last step)."""
        os.write(self.go, turn)
        answer = b""
        while True:
            ready, _, _ = select.select([self.done], [], [], POLL_S)
            if ready:
                try:
                    data = os.read(self.done, DONE.size - len(answer))
                except BlockingIOError:
                    continue
                if not data:
                    raise WorkerFailed(f"run {role} stopped in the middle of its steps")
                answer += data
                if len(answer) == DONE.size:
                    mark, seconds, last = DONE.unpack(answer)
                    if mark != b"d":
                        raise WorkerFailed(f"run {role} stopped in the middle of its steps")
                    return (seconds if seconds >= 0 else None), bool(last)
            elif worker.done():
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


RoundTimes = list["float | None"]  # one round's clocked step time per spec, in spec order
OnRound = Callable[[RoundTimes], bool]  # True: enough is timed, end the timing


def run_together(ctx: RunContext, specs: list[WorkerSpec], on_round: OnRound | None = None) -> list[RunRecord]:
    """Launch every spec at once and hand out turns, one step each per round (the order
    flipped every round), until every run has taken its last step; return their records.

    Every spec must carry ``lockstep`` (the FIFO name) and the same step counts. After each
    round ``on_round`` gets the round's step times; when it returns True the next turn ends
    the timing (the runs go on to their profiled steps, or finish).
    A failure of any run fails the pair with that run's own message.
    """
    work = ctx.run_dir / specs[0].model_name
    work.mkdir(parents=True, exist_ok=True)
    turns = [Turn(work, str(s.lockstep)) for s in specs]
    failure: WorkerFailed | None = None
    records: list[RunRecord] = []
    errors: list[WorkerFailed] = []
    try:
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            futures = [pool.submit(run_worker, ctx, s) for s in specs]
            try:
                _hand_out(turns, futures, specs, on_round)
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


def _hand_out(turns: list[Turn], futures: list[Future[Any]], specs: list[WorkerSpec], on_round: OnRound | None) -> None:
    """Rounds of turns until every run has taken its last step."""
    r, turn, finished = 0, GO, [False] * len(specs)
    while not all(finished):
        order = range(len(specs)) if r % 2 == 0 else range(len(specs) - 1, -1, -1)
        times: RoundTimes = [None] * len(specs)
        for i in order:
            if not finished[i]:
                times[i], finished[i] = turns[i].give(futures[i], specs[i].role, turn)
        turn = GO
        if on_round is not None and all(t is not None for t in times) and on_round(times):
            turn, on_round = END_TIMING, None
        r += 1
