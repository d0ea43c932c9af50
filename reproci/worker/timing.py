"""Timing a throughput run: clocked steps, a steady allocator, peak memory, and the profiler
started and stopped around the profiled steps (their per-op times: ``profiling``).

Throughput runs (``warmup_steps > 0``) clock each timed step: on a CPU by the host's clock,
on a GPU by CUDA events recorded on the device's stream around the step (``DeviceMarks``),
so no step waits for the device to be timed; their times are read when they are done
(``torch.cuda.Event.query``, which does not wait), when a paired run's turn ends (it waits
for its step anyway), and at the end. With ``profile_ops`` the last ``PROFILE_STEPS + 1``
steps run under torch.profiler, untimed.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from .process.spec import PROFILE_STEPS
from .profiling import op_times, prime_profiler, start_profiler


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceMarks:
    """Step boundaries on a CUDA stream: ``mark`` records an event and returns it; a
    step's seconds are ``elapsed(start, end)`` once ``end`` is done. The host never waits
    here: ``done`` asks without blocking, and whoever reads a step's time has waited for it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def done(self, mark: Any) -> bool:
        return bool(mark.query())

    def elapsed(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0  # milliseconds -> seconds


class HostMarks:
    """Step boundaries on the host's clock (a CPU's work is done when its call returns)."""

    def mark(self) -> float:
        return time.perf_counter()

    def done(self, mark: Any) -> bool:
        return True

    def elapsed(self, start: Any, end: Any) -> float:
        return float(end - start)


class StepClock:
    """When each step of the training loop ran, and what the profiled steps spent per op.

    The clock starts once ``warmup_steps`` steps have been taken. Each timed step is
    clocked from the end of the previous one (or from the start of its turn, when paired
    runs take turns) to its end: host time on a CPU, CUDA events on a GPU (no sync per
    step; ``step_times`` fills as the events complete, and wholly at ``stop``); the part
    spent waiting for its batch (host time) is kept beside it. Steps past ``timed_stop``
    go to the profiler instead.
    """

    def __init__(self, device: torch.device, *, since: float, start_step: int, stop: int, warmup_steps: int,
                 profile_ops: bool) -> None:
        self.device = device
        self.since = since  # the end of set-up: training time counts from here
        self.start_step = start_step
        self.warmup_steps = warmup_steps
        profile_steps = min(PROFILE_STEPS + 1, stop - start_step - warmup_steps - 2) if profile_ops else 0
        self.profile_steps = profile_steps if profile_steps >= 2 else 0
        self.timed_stop = stop - self.profile_steps
        self.timed_from: float | None = None
        self.timed_end: float | None = None
        self.timed_steps = 0
        self.marks: DeviceMarks | HostMarks = DeviceMarks(device) if device.type == "cuda" else HostMarks()
        self._pending: list[tuple[Any, Any]] = []  # timed steps' (start, end) marks not yet read
        self._last_timed = False  # whether the step just taken was timed
        self.step_times: list[float] = []
        self.data_times: list[float] = []  # the part of each timed step spent waiting for its batch
        self.ended = since  # set by stop()
        self.checkpoint_s = 0.0  # of the training time, what writing checkpoints took
        self.peak: tuple[int | None, str | None] | None = None
        self.ops: list[dict[str, Any]] | None = None
        self._profiler: Any = None
        self._last: Any = None  # the mark the next timed step is clocked from
        if self.profile_steps:
            prime_profiler(device)

    def past_warmup(self, taken: int) -> bool:
        """Whether the step that follows ``taken`` steps comes after warm-up (timed or profiled)."""
        return taken - self.start_step >= self.warmup_steps

    def turn_started(self) -> None:
        """A step taken in turns is clocked from its turn's start, not from the wait before it."""
        self._last = self.marks.mark()

    @property
    def last_time(self) -> float | None:
        """The seconds of the step just taken, None when it was not timed. On a GPU this
        waits for the step's end: call it where the step must be done anyway (a turn's end)."""
        if not self._last_timed:
            return None
        self._read(wait=True)
        return self.step_times[-1]

    def _read(self, *, wait: bool) -> None:
        """Move the timed steps whose end marks are done (all of them with ``wait``, the
        device's work having been waited for) into ``step_times``, in order."""
        if wait and self._pending and isinstance(self.marks, DeviceMarks):
            self._pending[-1][1].synchronize()
        while self._pending and (wait or self.marks.done(self._pending[0][1])):
            start, end = self._pending.pop(0)
            self.step_times.append(self.marks.elapsed(start, end))

    def before_step(self, step: int) -> None:
        """The first profiled step starts the profiler; peak memory is read before it, so
        the profiler's own buffers are not counted."""
        if self.profile_steps and step == self.timed_stop:
            self.peak = peak_memory(self.device)
            self._profiler = start_profiler(self.device, self.profile_steps)

    def end_timing(self, taken: int) -> int:
        """No more timed steps after ``taken`` (the orchestrator has measured enough): the
        profiled steps, if any, follow at once. Returns the step the run now stops at."""
        self.timed_stop = taken
        return taken + self.profile_steps

    def step_taken(self, step: int, fetch_s: float) -> None:
        """After the optimizer update of ``step``: start the clock, or clock a timed step."""
        self._last_timed = False
        if step - self.start_step == self.warmup_steps:
            sync(self.device)  # once a run: the host's and the device's clocks start together
            self._last = self.marks.mark()
            self.timed_from = self._last if isinstance(self.marks, HostMarks) else time.perf_counter()
        elif self.timed_from is not None and step <= self.timed_stop:
            self.timed_steps += 1
            end = self.marks.mark()
            self._pending.append((self._last, end))
            self._last_timed = True
            self.data_times.append(fetch_s)
            self._last = end
            if isinstance(self.marks, HostMarks):
                self.timed_end = end
            self._read(wait=False)

    def step_ended(self) -> None:
        """The end of a step's work (checkpoints included): a profiled step's mark."""
        if self._profiler is not None:
            sync(self.device)
            self._profiler.step()

    def stop(self) -> None:
        sync(self.device)
        self.ended = time.perf_counter()
        self._read(wait=True)
        if isinstance(self.marks, DeviceMarks) and self.timed_from is not None and self.step_times:
            self.timed_end = self.timed_from + sum(self.step_times)  # the device's span of the timed steps
        if self._profiler is not None:
            self._profiler.stop()
            self.ops = op_times(self._profiler, self.device)
        if self.peak is None:
            self.peak = peak_memory(self.device)


def peak_memory(device: torch.device) -> tuple[int | None, str | None]:
    """Peak memory so far: allocator peak on a GPU, the process's peak RSS on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda.max_memory_allocated"
    try:
        import resource
    except ImportError:  # not a Unix
        return None, None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "ru_maxrss"


def steady_allocator() -> bool:
    """Fix glibc malloc's thresholds for a timed run; True if they were set.

    By default glibc adapts its mmap and trim thresholds as a process frees memory, so
    whether each step's large CPU buffers are recycled or handed back to the kernel and
    faulted in again depends on the process's history: two identical processes measured
    side by side differed by up to 50 % in step time on a 2-core VM (conv, quick profile),
    and by about 1.5 % with fixed thresholds. Timed runs of every mode get the same settings.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    ok = mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's upper limit on 64-bit; fixed, no longer adaptive
    ok &= mallopt(m_trim_threshold, 2**30)  # keep freed heap memory instead of returning it each step
    ok &= mallopt(m_top_pad, 64 * 2**20)
    return bool(ok)
