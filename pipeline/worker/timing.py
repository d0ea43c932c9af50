"""Timing a throughput run: clocked steps, a steady allocator, peak memory, per-op times.

Throughput runs (``warmup_steps > 0``) clock each timed step after a device sync; with
``profile_ops`` the last ``PROFILE_STEPS + 1`` steps run under torch.profiler, untimed.
"""

from __future__ import annotations

import bisect
import statistics
import sys
import time
from typing import Any

import torch

from .process.spec import PROFILE_STEPS

OPS_KEPT = 80  # per-op rows kept in a record, most expensive first


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
            _prime_profiler(device)

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
            self._profiler = _start_profiler(self.device, self.profile_steps)

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
            self.ops = _op_times(self._profiler, self.device)
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


def _prime_profiler(device: torch.device) -> None:
    """The profiler's first session pays a one-time start-up (about 1 s on a CPU): pay it
    before warm-up, beside a paired run's own set-up, not inside a turn."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities):
        torch.zeros(1, device=device).add_(1)


def _start_profiler(device: torch.device, steps: int) -> Any:
    """A profiler over ``steps`` steps: one warm-up step, then every step recorded and marked."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps - 1, repeat=1))
    prof.start()
    return prof


def _op_times(prof: Any, device: torch.device) -> list[dict[str, Any]]:
    """Per op, the median over profiled steps of its self time (microseconds), most expensive first.

    Events are assigned to the ``ProfilerStep`` range they start in; a step's own self
    time (Python between ops) is reported as "(outside ops)". Medians keep one slow step
    (a page fault, a neighbour on a shared machine) from inflating an op.
    """
    events = [e for e in prof.events() if str(getattr(e, "device_type", "CPU")).endswith("CPU")]
    marks = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep"))
    starts = [m[0] for m in marks]
    per_step: list[dict[str, list[float]]] = [{} for _ in marks]
    for e in events:
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start > marks[i][1]:
            continue
        name = "(outside ops)" if e.name.startswith("ProfilerStep") else e.name
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:  # older torch
            dev = getattr(e, "self_cuda_time_total", 0.0)
        row = per_step[i].setdefault(name, [0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += e.self_cpu_time_total
        row[2] += float(dev)
    names = set().union(*per_step) if per_step else set()
    rows = []
    for name in names:
        cols = [statistics.median(step.get(name, [0.0, 0.0, 0.0])[k] for step in per_step) for k in range(3)]
        rows.append({"name": name, "calls": cols[0], "self_cpu_us": cols[1], "self_device_us": cols[2]})
    key = "self_device_us" if device.type == "cuda" else "self_cpu_us"
    rows = [r for r in rows if r[key] > 0]
    rows.sort(key=lambda r: -r[key])
    return rows[:OPS_KEPT]

