"""Timing a throughput run: clocked steps, a steady allocator, peak memory, and the profiler
started and stopped around the profiled steps (their per-op times: ``profiling``).

Throughput runs (``warmup_steps > 0``) clock each timed step after a device sync; with
``profile_ops`` the last ``PROFILE_STEPS + 1`` steps run under torch.profiler, untimed.
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


class StepClock:
    """When each step of the training loop ran, and what the profiled steps spent per op.

    The clock starts once ``warmup_steps`` steps have been taken. Each timed step is
    clocked from the end of the previous one (or from the start of its turn, when paired
    runs take turns) to its end after a device sync; the part spent waiting for its batch
    is kept beside it. Steps past ``timed_stop`` go to the profiler instead.
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
        self.last_time: float | None = None  # the step just taken, when it was timed
        self.step_times: list[float] = []
        self.data_times: list[float] = []  # the part of each timed step spent waiting for its batch
        self.ended = since  # set by stop()
        self.checkpoint_s = 0.0  # of the training time, what writing checkpoints took
        self.peak: tuple[int | None, str | None] | None = None
        self.ops: list[dict[str, Any]] | None = None
        self._profiler: Any = None
        self._last = 0.0
        if self.profile_steps:
            prime_profiler(device)

    def past_warmup(self, taken: int) -> bool:
        """Whether the step that follows ``taken`` steps comes after warm-up (timed or profiled)."""
        return taken - self.start_step >= self.warmup_steps

    def turn_started(self) -> None:
        """A step taken in turns is clocked from its turn's start, not from the wait before it."""
        self._last = time.perf_counter()

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
        self.last_time = None
        if step - self.start_step == self.warmup_steps:
            sync(self.device)
            self.timed_from = self._last = time.perf_counter()
        elif self.timed_from is not None and step <= self.timed_stop:
            self.timed_steps += 1
            sync(self.device)
            now = time.perf_counter()
            self.step_times.append(now - self._last)
            self.last_time = now - self._last
            self.data_times.append(fetch_s)
            self._last = self.timed_end = now

    def step_ended(self) -> None:
        """The end of a step's work (checkpoints included): a profiled step's mark."""
        if self._profiler is not None:
            sync(self.device)
            self._profiler.step()

    def stop(self) -> None:
        sync(self.device)
        self.ended = time.perf_counter()
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
