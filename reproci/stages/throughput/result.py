"""The throughput stage's result: a model entry's ``throughput`` section (``reproci.typed``), read
by attribute and written as the JSON it has always been.

A measured result (``MeasuredThroughput``) holds each mode's rates, the slowdown of every mode but
the baseline, and the ops that grew most; a failed one (``error``) keeps the plan (the device, the
run length, the records it meant to write) and has neither ``profiled_steps`` nor ``cpus``. A
slowdown measured by paired turns (``SampledSlowdown``) says how it was sampled and why it stopped;
one of runs after one another has only the figure, its interval and ``how_stopped``.

What a golden keeps of it (``ThroughputSummary``: the rates and slowdowns, beside the device,
threads and ranks they were measured with) is what a later run's ``conclude`` compares with, and
each point of the run history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ... import typed
from ...typed import Error

SUMMARY_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ModeSummary:
    """One mode's speed over the repetitions (``stages.throughput._mode_summary``)."""

    steps_per_s: float | None = None  # median over the repetitions
    samples_per_s: float | None = None  # None: the model does not say its batch size
    step_ms_median: float | None = None
    data_wait_ms_median: float | None = None  # the part of a step spent waiting for the loader
    peak_memory_bytes: int | None = None  # the largest of the repetitions'
    peak_memory_kind: str | None = None  # what measured it: ru_maxrss, cuda.max_memory_allocated
    steps_per_s_reps: list[float] = field(default_factory=list)  # one per repetition


@dataclass(frozen=True, kw_only=True)
class Slowdown:
    """One mode's step time over the baseline's (> 1: slower), the median over repetitions with its
    bootstrap interval (``stages.throughput.slowdown``: runs one after another). Every key is left
    out of a slowdown that was not measured (``{}``); the sampled one's are left out of this one."""

    median: float | None = typed.key(omit_none=True, default=None)
    ci_low: float | None = typed.key(omit_none=True, default=None)
    ci_high: float | None = typed.key(omit_none=True, default=None)
    confidence: float | None = typed.key(omit_none=True, default=None)  # 0.95
    relative_width: float | None = typed.key(omit_none=True, default=None)  # (ci_high - ci_low) / median
    noisy: bool | None = typed.key(omit_none=True, default=None)
    ratios: list[float] | None = typed.key(omit_none=True, default=None)  # per repetition (sampled: its pairs' median)
    pairs: int | None = typed.key(omit_none=True, default=None)  # sampled: ratios counted, all repetitions
    pairs_per_repetition: list[int] | None = typed.key(omit_none=True, default=None)
    warmup_rounds_dropped: list[int] | None = typed.key(omit_none=True, default=None)  # per repetition
    target_half_width: float | None = typed.key(omit_none=True, default=None)  # the profile's target, ±
    within_target: bool | None = typed.key(omit_none=True, default=None)
    stopped: str | None = typed.key(omit_none=True, default=None)  # why the sampling stopped, in a sentence
    stop: str | None = typed.key(omit_none=True, default=None)  # settled, budget, cap (sampling.STOPS)
    half_width: float | None = typed.key(omit_none=True, default=None)  # sampled: None without an interval
    how_stopped: str | None = typed.key(omit_none=True, default=None)  # sampling.how_stopped: '±1.8 %, settled'
    time_budget_s: float | None = typed.key(omit_none=True, default=None)  # sampled: the model's budget
    method: str | None = typed.key(omit_none=True, default=None)  # sampled: 'sequential paired turns'


@dataclass(frozen=True, kw_only=True)
class SampledSlowdown(Slowdown):
    """A slowdown of paired turns (``sampling.Sampler.summary``): every key of ``Slowdown``, in its
    order; its interval's half-width and the time budget are written even where they are None."""

    half_width: float | None = None
    time_budget_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class TopOp:
    """An op whose self time per step grew from default to strict mode (``stages.throughput.attribute_ops``)."""

    op: str = ""  # aten::name
    strict_ms: float | None = None  # its self time per step under strict mode
    default_ms: float | None = None  # and under default mode
    delta_ms: float = 0.0  # strict minus default
    growth: float | None = None  # delta over default; None: it does not run in default mode
    share: float | None = None  # its part of all the time that grew



@dataclass(frozen=True, kw_only=True)
class KeptMode:
    """What a golden keeps of a mode's speed: each value as the run had it, or None."""

    steps_per_s: float | None = None
    samples_per_s: float | None = None
    peak_memory_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class KeptSlowdown:
    """What a golden keeps of a mode's slowdown: each value as the run had it, or None."""

    median: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    noisy: bool | None = None


@dataclass(frozen=True, kw_only=True)
class ThroughputSummary(typed.Section):
    """What a golden (and a point of the run history) keeps of a model's throughput
    (``ThroughputResult.summary``)."""

    version: int = SUMMARY_VERSION
    device: str | None = None
    threads: int | None = None
    world_size: int = 1  # a golden from before ranks: one
    timed_steps: int | None = None
    repetitions: int | None = None
    modes: dict[str, KeptMode] = field(default_factory=dict)
    slowdown: dict[str, KeptSlowdown] = field(default_factory=dict)  # mode -> its slowdown (the golden's key,
    # not "slowdowns")

    def mode(self, name: str) -> KeptMode:
        """A mode's rates; all None where it was not measured."""
        return self.modes.get(name) or KeptMode()

    def slowdown_of(self, mode: str) -> KeptSlowdown:
        """A mode's slowdown; all None where it was not measured."""
        return self.slowdown.get(mode) or KeptSlowdown()



# A result without modes (a failed measurement) keeps its summary as {}, as it always has.
NO_SUMMARY = ThroughputSummary.from_json({})


@dataclass(frozen=True, kw_only=True)
class ThroughputResult(typed.Section):
    """The throughput stage's result for a model: strict against default mode (``stages.throughput.run_model``)."""

    version: int = SUMMARY_VERSION
    device: str | None = None
    threads: int | None = None
    world_size: int = 1
    warmup_steps: int | None = None
    timed_steps: int | None = None  # at most, a repetition
    run_length: str | None = None  # "time" (the sampler ends a repetition) or "steps" (--steps given)
    time_budget_s: float | None = None  # seconds a model's measurement may take
    repetitions: int | None = None  # as run
    max_repetitions: int | None = None  # as asked for
    order: str | None = None  # "step-by-step turns" or "ABBA"
    baseline: str | None = None  # the mode the others are compared with: default
    modes: dict[str, ModeSummary] = field(default_factory=dict)
    slowdown: Slowdown = field(default_factory=Slowdown)  # strict's, or {}
    slowdowns: dict[str, Slowdown] = field(default_factory=dict)  # every mode but the baseline
    top_ops: list[TopOp] = field(default_factory=list)  # most added time first
    records: list[str] = field(default_factory=list)  # a record file per run, relative to the run directory
    error: Error | None = None
    profiled_steps: int | None = typed.key(omit_none=True, default=None)  # measured only
    cpus: list[int] | None = typed.key(omit_none=True, default=None)  # measured only (MeasuredThroughput)
    seconds: float = 0.0
    golden_summary: ThroughputSummary | None = typed.key(omit_none=True, default=None)  # stages.throughput.attach
    regression: str | None = typed.key(omit_none=True, default=None)  # the entry's throughput_regression, when any

    def mode(self, name: str) -> ModeSummary:
        """A mode's speed; all None where it was not measured."""
        return self.modes.get(name) or ModeSummary()

    def summary(self) -> ThroughputSummary | None:
        """What a golden keeps of it; None where no mode was measured (a failed run)."""
        if not self.modes:
            return None
        return ThroughputSummary(
            device=self.device, threads=self.threads, world_size=self.world_size, timed_steps=self.timed_steps,
            repetitions=self.repetitions,
            modes={m: KeptMode(steps_per_s=v.steps_per_s, samples_per_s=v.samples_per_s,
                               peak_memory_bytes=v.peak_memory_bytes) for m, v in self.modes.items()},
            slowdown={m: KeptSlowdown(median=s.median, ci_low=s.ci_low, ci_high=s.ci_high, noisy=s.noisy)
                      for m, s in self.slowdowns.items()})



@dataclass(frozen=True, kw_only=True)
class MeasuredThroughput(ThroughputResult):
    """A result whose repetitions ran: it says where a CPU pair took its turns even where none was
    pinned (``cpus``: null on a GPU, or for runs one after another)."""

    cpus: list[int] | None = None


def of(entry: Mapping[str, Any]) -> ThroughputResult | None:
    """A model's throughput, from its entry (or a merged matrix's model); None where the stage did not run for it."""
    section = entry.get("throughput")
    return ThroughputResult.from_json(section) if isinstance(section, Mapping) else None
