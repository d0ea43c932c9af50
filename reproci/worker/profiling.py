"""Per-op times of a throughput run's profiled steps, from torch.profiler.

The last ``PROFILE_STEPS + 1`` steps of a throughput run run under the profiler (``timing``
starts and stops it); ``op_times`` reads each op's self time per step from what it recorded.
"""

from __future__ import annotations

import bisect
import statistics
from typing import Any

import torch

OPS_KEPT = 80  # per-op rows kept in a record, most expensive first


def prime_profiler(device: torch.device) -> None:
    """The profiler's first session pays a one-time start-up (about 1 s on a CPU): pay it
    before warm-up, beside a paired run's own set-up, not inside a turn."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities):
        torch.zeros(1, device=device).add_(1)


def start_profiler(device: torch.device, steps: int) -> Any:
    """A profiler over ``steps`` steps: one warm-up step, then every step recorded and marked."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps - 1, repeat=1))
    prof.start()
    return prof


def op_times(prof: Any, device: torch.device, raw: bool = True) -> list[dict[str, Any]]:
    """Per op, the median over profiled steps of its self time (microseconds), most expensive first.

    Events are assigned to the ``ProfilerStep`` range they start in; a step's own self
    time (Python between ops) is reported as "(outside ops)". Medians keep one slow step
    (a page fault, a neighbour on a shared machine) from inflating an op. On the CPU the
    events are read raw (``raw``): the same self times without the profiler's event objects.
    """
    events = _events(prof, device, raw)
    marks = sorted((start, end) for name, start, end, _, _ in events if name.startswith("ProfilerStep"))
    starts = [m[0] for m in marks]
    per_step: list[dict[str, list[float]]] = [{} for _ in marks]
    for name, start, _, self_cpu, self_dev in events:
        i = bisect.bisect_right(starts, start) - 1
        if i < 0 or start > marks[i][1]:
            continue
        if name.startswith("ProfilerStep"):
            name = "(outside ops)"
        row = per_step[i].setdefault(name, [0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += self_cpu
        row[2] += self_dev
    names = set().union(*per_step) if per_step else set()
    rows: list[dict[str, Any]] = []
    for name in names:
        cols = [statistics.median(step.get(name, [0.0, 0.0, 0.0])[k] for step in per_step) for k in range(3)]
        rows.append({"name": name, "calls": cols[0], "self_cpu_us": cols[1], "self_device_us": cols[2]})
    key = "self_device_us" if device.type == "cuda" else "self_cpu_us"
    rows = [r for r in rows if r[key] > 0]
    rows.sort(key=lambda r: -r[key])
    return rows[:OPS_KEPT]


# (name, start µs, end µs, self CPU µs, self device µs) of a CPU event
Event = tuple[str, float, float, float, float]


def _events(prof: Any, device: torch.device, raw: bool) -> list[Event]:
    """The profile's CPU events. On a device, from the profiler's event objects (they link
    each kernel's time to the op that launched it); on the CPU from its raw events, which
    give the same self times: building the objects takes seconds where a data loader runs
    thousands of small ops a step (about 6 s for embedding's four profiled steps here)."""
    if raw and device.type == "cpu":
        try:
            return _raw_cpu_events(prof)
        except (AttributeError, TypeError):  # an older torch without these raw fields
            pass
    out = []
    for e in prof.events():
        if not str(getattr(e, "device_type", "CPU")).endswith("CPU"):
            continue
        dev: float | None = getattr(e, "self_device_time_total", None)
        if dev is None:  # older torch
            dev = getattr(e, "self_cuda_time_total", 0.0)
        out.append((e.name, e.time_range.start, e.time_range.end, e.self_cpu_time_total, float(dev)))
    return out


# the utility events the profiler's own event list leaves out (torch.autograd.profiler_util._filter_name)
_UTILITY = {"[memory]", "[OutOfMemory]", "profiler::_record_function_enter", "profiler::_record_function_enter_new",
            "profiler::_record_function_exit", "aten::is_leaf", "aten::output_nr", "aten::_version"}


def _raw_cpu_events(prof: Any) -> list[Event]:
    """CPU events with their self time as the profiler's event list computes it: an event's
    duration less its direct children's, children being the events nested in it on its thread
    (an asynchronous event, ending on another thread, has none); and, as that list does, an
    only child of the same name as its parent (``aten::sort`` inside ``aten::sort``) merged
    into it. Times are kept in integer nanoseconds until the end (epoch nanoseconds as float
    microseconds would round to a quarter of a microsecond)."""
    from torch.autograd import DeviceType

    names: dict[str, str] = {}
    rows: list[list[Any]] = []  # name, start ns, end ns, self ns, parent row, children (-1: merged away)
    threads: dict[int, list[int]] = {}
    for e in prof.profiler.kineto_results.events():
        raw = e.name()
        if e.device_type() != DeviceType.CPU or raw in _UTILITY or getattr(e, "is_hidden_event", bool)():
            continue
        name = names.get(raw)
        if name is None:
            name = names[raw] = torch._C._demangle(raw) if len(raw) > 1 else raw
        start, end = e.start_ns(), e.end_ns()
        asynchronous = e.is_async() or e.start_thread_id() != e.end_thread_id()
        rows.append([name, start, end, 0 if asynchronous else end - start, None, 0])
        if not asynchronous:
            threads.setdefault(e.start_thread_id(), []).append(len(rows) - 1)
    for nested in threads.values():
        nested.sort(key=lambda i: (rows[i][1], -rows[i][2]))
        open_: list[int] = []
        for i in nested:
            start, end = rows[i][1], rows[i][2]
            while open_ and (start >= rows[open_[-1]][2] or end > rows[open_[-1]][2]):
                open_.pop()
            if open_:
                rows[open_[-1]][3] -= end - start
                rows[open_[-1]][5] += 1
                rows[i][4] = open_[-1]
            open_.append(i)
    _merge_only_children(rows)
    base = min((r[1] for r in rows), default=0)
    return [(r[0], (r[1] - base) / 1000, (r[2] - base) / 1000, r[3] / 1000, 0.0) for r in rows if r[5] >= 0]


def _merge_only_children(rows: list[list[Any]]) -> None:
    """Merge every only child of the same name as its parent into the parent: its self time
    and its children become the parent's (``EventList._remove_dup_nodes``)."""
    into: dict[int, int] = {}  # a merged row: the row it went into

    def alive(i: int) -> int:
        while i in into:
            i = into[i]
        return i

    # Only a row whose parent has its name can merge: a row's new parent, once its own parent
    # merged away, has that parent's name, which is its old parent's.
    candidates = [i for i, row in enumerate(rows) if row[4] is not None and rows[row[4]][0] == row[0]]
    merged = True
    while merged:
        merged = False
        for i in candidates:
            row = rows[i]
            if row[5] < 0:
                continue
            p = row[4] = alive(row[4])
            parent = rows[p]
            if parent[0] == row[0] and parent[5] == 1:
                parent[3] += row[3]
                parent[5] = row[5]
                row[5] = -1
                into[i] = p
                merged = True
