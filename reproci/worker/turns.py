"""Taking turns with paired runs (``spec.lockstep``).

One step per turn, handed out by the orchestrator through two FIFOs, so the modes of a
throughput pair meet the same neighbours on a shared machine. The orchestrator holds its
ends open before launch.

On a CPU, the first turn moves this process to the first ``threads`` CPUs it may use:
paired workers start with the same CPU set, so they take their turns on the same CPUs.
Processes it forks later (loader workers) get the full set back, so data loading still
runs beside training as it would unpinned.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .process.spec import DONE, END_TIMING, GO, WorkerSpec, resolve
from .timing import sync


class Turns:
    """This run's ends of the FIFOs: wait for a turn, say it is done."""

    def __init__(self, spec: WorkerSpec, spec_file: Path, device: torch.device) -> None:
        base = str(resolve(spec_file, spec.lockstep))
        try:
            self.go = os.open(base + ".go", os.O_RDONLY)
            self.finished = os.open(base + ".done", os.O_WRONLY)
        except FileNotFoundError:  # the orchestrator ended the pair (its partner failed) before this run got here
            raise RuntimeError("lockstep: the orchestrator stopped handing out turns") from None
        self.device = device
        self.pin = spec.threads if device.type == "cpu" and hasattr(os, "sched_setaffinity") else 0
        self.cpus: list[int] | None = None
        self.allowed: set[int] | None = None

    def wait(self) -> bool:
        """Wait for a turn; False when the orchestrator has timed enough steps (this turn
        then starts the profiled steps, or ends the loop when there are none)."""
        if self.pin and self.cpus is None:
            allowed = self.allowed = os.sched_getaffinity(0)
            self.cpus = sorted(allowed)[:self.pin]
            os.register_at_fork(after_in_child=lambda: os.sched_setaffinity(0, allowed))
            os.sched_setaffinity(0, self.cpus)
        turn = os.read(self.go, 1)
        if turn not in (GO, END_TIMING):
            raise RuntimeError("lockstep: the orchestrator stopped handing out turns")
        return turn == GO

    def done(self, seconds: float | None, last: bool) -> None:
        """The turn is used, once the step's work on the device is done: how long its step
        took (None: not timed), and whether it was the last."""
        sync(self.device)
        os.write(self.finished, DONE.pack(b"d", -1.0 if seconds is None else seconds, last))

    def close(self) -> None:
        """After the last turn: the pair finishes (hashes, record, exit) side by side again."""
        os.close(self.go)
        os.close(self.finished)
        if self.allowed is not None:
            os.sched_setaffinity(0, self.allowed)
