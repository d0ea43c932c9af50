"""Timing a throughput run's steps (reproci.worker.timing): on a CPU by the host's clock, on a
GPU by CUDA events, with no wait for the device per step beyond what taking turns needs.

The CPU cannot run CUDA events: the tests of the GPU path stand ``_FakeCuda`` in for
``torch.cuda.Event``, ``torch.cuda.current_stream`` and ``torch.cuda.synchronize`` (a device
clock moved by hand, and a count of every wait), so what they check is the clock's use of
the CUDA API: which events it records, when it waits, and how it reads them. The GPU check
(benchmarks/gpu_check.sh) times the real thing.
"""

from __future__ import annotations

import pytest
import torch

from reproci.worker import timing
from reproci.worker.timing import StepClock


class _FakeCuda:
    """A stream whose work is done up to ``done_at`` (seconds on the device's clock ``now``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.done_at = 0.0
        self.device_syncs = 0
        self.event_waits = 0
        self.recorded = 0
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t: float | None = None

            def record(self, stream: object = None) -> None:
                self.t = fake.now
                fake.recorded += 1

            def query(self) -> bool:
                return self.t is not None and self.t <= fake.done_at

            def synchronize(self) -> None:
                fake.event_waits += 1
                fake.done_at = max(fake.done_at, self.t or 0.0)

            def elapsed_time(self, end: "Event") -> float:
                assert self.query() and end.query(), "elapsed_time of events not yet done raises on CUDA"
                return (end.t - self.t) * 1000.0  # type: ignore[operator]

        self.Event = Event

    def synchronize(self, device: object = None) -> None:
        self.device_syncs += 1
        self.done_at = self.now


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> _FakeCuda:
    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 1)
    return fake


def _clock(steps: int = 10, warmup: int = 2) -> StepClock:
    return StepClock(torch.device("cuda"), since=0.0, start_step=0, stop=steps, warmup_steps=warmup, profile_ops=False)


def test_on_a_gpu_each_step_is_timed_by_events_without_waiting_for_the_device(cuda: _FakeCuda):
    """Step k takes k ms on the device; the device runs behind the host (its work is done
    only up to step 6 when the loop ends): the clock reads what is done without waiting,
    and the rest once, at the end."""
    clock = _clock()
    for step in range(1, 11):
        cuda.now += step / 1000
        clock.step_taken(step, fetch_s=0.0)
        if step == 6:
            cuda.done_at = cuda.now  # the device caught up to here on its own
    assert cuda.device_syncs == 1 and cuda.event_waits == 0  # one sync where the timing starts, none a step
    assert cuda.recorded == 9  # where the timing starts, and the end of each of the 8 timed steps
    assert clock.step_times == pytest.approx([k / 1000 for k in (3, 4, 5, 6)])  # read as they were done
    clock.stop()
    assert clock.step_times == pytest.approx([k / 1000 for k in range(3, 11)])
    assert clock.timed_end - clock.timed_from == pytest.approx(sum(range(3, 11)) / 1000)  # type: ignore[operator]


def test_a_step_taken_in_turns_is_timed_from_its_turns_start_and_read_when_the_turn_ends(cuda: _FakeCuda):
    clock = _clock()
    for step in range(1, 3):
        clock.step_taken(step, fetch_s=0.0)
    syncs = cuda.device_syncs
    cuda.now += 5.0  # the wait for the turn: not the step's time
    clock.turn_started()
    cuda.now += 0.004
    clock.step_taken(3, fetch_s=0.001)
    assert clock.last_time == pytest.approx(0.004)
    assert cuda.event_waits == 1 and cuda.device_syncs == syncs  # the turn's one wait: on the step's end
    assert clock.data_times == [0.001]
    clock.step_taken(11, fetch_s=0.0)  # past the timed steps
    assert clock.last_time is None


def test_on_a_cpu_the_host_clock_times_each_step(monkeypatch: pytest.MonkeyPatch):
    ticks = iter([1.0, 1.5, 2.25, 9.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))
    clock = StepClock(torch.device("cpu"), since=0.0, start_step=0, stop=4, warmup_steps=1, profile_ops=False)
    for step in (1, 2, 3):
        clock.step_taken(step, fetch_s=0.0)
        if step > 1:
            assert clock.last_time == clock.step_times[-1]
    assert clock.step_times == [0.5, 0.75] and clock.timed_end == 2.25
