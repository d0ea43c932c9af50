"""The throughput-cost stage: what strict determinism costs, per model, and where (this package
holds its turn-taking, ``lockstep``, and its sampling, ``sampling``).

Per model and repetition, one fresh process per mode (strict, default, optionally
bookkeeping), so flags read at start-up are honest. The processes of a repetition start
together and, after their warm-up steps, take turns step by step (reproci.stages.throughput.lockstep),
so whatever else runs on a shared machine slows every mode alike, and time sets how long
they run (``sampling``: until the slowdown's interval reaches its target or the model's
``--time-budget`` is spent; at most ``--steps`` timed steps when it is given). Where FIFOs are not
available, or when each mode is a job of ``--world-size`` ranks under DDP (whose steps
wait on one another's all-reduce), they run one after another, ``--steps`` timed steps
each, in ABBA order across repetitions, while the budget holds another; rank 0's clock
stands for the job. Each timed step is clocked from the start of its turn to its end (on a
GPU by CUDA events, reproci.worker.timing); a process's throughput is 1 / its median step
time. The slowdown of a repetition is strict step time / default step time; the stage
reports the median over repetitions with a bootstrap confidence interval, marks the
measurement noisy when that interval is wide, and says how it stopped
(``sampling.how_stopped``). The first repetitions also
run a few profiled steps after the timed ones, and the ops whose self time grows most
under strict mode are reported with their part of the added time.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, TypedDict

import numpy as np

from ... import typed
from ...errors import WorkerFailed
from ...results import Image, ModelEntry
from ...runner import RunContext, run_worker
from ...settings.models import ModelRef
from ...settings.options import RunOptions
from ...typed import Error
from ...worker.process.spec import PROFILE_STEPS, WorkerSpec
from ...worker.run_record import RunRecord
from ..base import StageRun
from ..model_entry import add_result
from . import lockstep, sampling
from .options import ThroughputOptions
from .result import (
    NO_SUMMARY,
    MeasuredThroughput,
    ModeSummary,
    Slowdown,
    ThroughputResult,
    ThroughputSummary,
    TopOp,
    of,
)

BASELINE = "default"
MODES = ("strict", "default")  # bookkeeping is optional: pass modes=("strict", "default", "bookkeeping")
CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 2000
NOISY_WIDTH = 0.06  # an interval wider than 6 % of the median marks the measurement noisy
PROFILED_REPS = 1  # repetitions whose processes also profile per-op times (parsing a profile costs seconds)
TOP_OPS = 5
TIMED_STEPS_CAP = 20_000  # a paired repetition's guard: time ends it long before (20 k steps of 5 ms: 100 s)


def warmup_steps(steps: int) -> int:
    """Warm-up steps before timing: allocator, caches, lazy inits, loader start-up."""
    return max(3, steps // 6)


def plan(options: RunOptions, model: ModelRef, *, project_commit: str | None, image: Image,
         modes: tuple[str, ...] = MODES, paired: bool = True) -> list[list[WorkerSpec]]:
    """One group of processes per repetition, one process per mode; repetition r lists the
    modes forward (r odd) or reversed. ``paired``: a group takes turns step by step, for as
    long as the sampler lets it (``timed_cap``); else each run times ``--steps`` steps."""
    warm = warmup_steps(options.steps)
    timed = timed_cap(options, paired)
    groups = []
    for rep in range(1, options.of(ThroughputOptions).repetitions + 1):
        order = modes if rep % 2 else tuple(reversed(modes))
        group = []
        for mode in order:
            role = f"throughput-{mode}-{rep}"
            profiled = rep <= PROFILED_REPS
            group.append(WorkerSpec(
                model_ref=model.ref, model_name=model.name, role=role,
                steps=warm + timed + (PROFILE_STEPS + 1 if profiled else 0),
                seed=options.seed, profile=options.profile, device=options.device, threads=options.threads,
                mode=mode, output=f"record-{role}.json", fingerprints=False, warmup_steps=warm,
                profile_ops=profiled, lockstep=f"turn-{role}" if paired else None,
                project_commit=project_commit, image=image, world_size=options.world_size, cpu_isa=options.cpu_isa,
            ))
        groups.append(group)
    return groups


def timed_cap(options: RunOptions, paired: bool) -> int:
    """At most how many steps a repetition times: paired runs, as many as time allows (up
    to ``TIMED_STEPS_CAP``) unless ``--steps`` was given; runs one after another, ``--steps``."""
    return options.steps if options.steps_given or not paired else TIMED_STEPS_CAP


def bootstrap_median(values: list[float], *, samples: int = BOOTSTRAP_SAMPLES,
                     confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float, float]:
    """Median and a percentile-bootstrap interval for it (a fixed seed: same data, same interval)."""
    data = np.asarray(values, dtype=float)
    med = float(np.median(data))
    if len(data) < 2:
        return med, med, med
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(data, size=(samples, len(data)), replace=True), axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(meds, [tail, 100 - tail])
    return med, float(low), float(high)


def slowdown(ratios: list[float], *, budget_spent: bool = False) -> Slowdown:
    """Median slowdown over repetitions, its bootstrap interval, whether it is noisy, and how
    it stopped (``budget_spent``: the time budget, not the count of repetitions, ended it)."""
    med, low, high = bootstrap_median(ratios)
    width = (high - low) / med if med else float("inf")
    noisy = bool(width > NOISY_WIDTH or len(ratios) < 3)
    stop = "settled" if not noisy else "budget" if budget_spent else "cap"
    half = sampling.half_width(med, low, high) if len(ratios) > 1 else math.inf
    return Slowdown(median=med, ci_low=low, ci_high=high, confidence=CONFIDENCE, relative_width=width,
                    noisy=noisy, ratios=[round(r, 5) for r in ratios], stop=stop,
                    how_stopped=sampling.how_stopped(stop, half))


class OpTime(TypedDict):
    """An op's calls and self times in one profiled step, the medians over the steps (a row of a
    record's ``ops``: ``worker.profiling``)."""

    name: str  # aten::name, or "(outside ops)"
    calls: float
    self_cpu_us: float
    self_device_us: float


def attribute_ops(ops: dict[str, list[list[OpTime]]], *, device: str, top: int = TOP_OPS) -> list[TopOp]:
    """The ops whose self time per step grows most from default to strict mode.

    ``ops[mode]`` holds one op list per profiled process (the record's "ops", per-step
    medians). Times are averaged over processes and given in milliseconds per step;
    ``share`` is an op's part of all the time that grew (the sum of every op's growth),
    ``growth`` its own relative change (None: the op does not run in default mode).
    """
    def mean_times(runs: list[list[OpTime]]) -> dict[str, float]:
        total: dict[str, float] = {}
        for run in runs:
            for row in run:
                total[row["name"]] = total.get(row["name"], 0.0) + (row["self_device_us"] if device == "cuda"
                                                                     else row["self_cpu_us"])
        return {k: v / len(runs) for k, v in total.items()} if runs else {}

    a, b = mean_times(ops.get("strict", [])), mean_times(ops.get(BASELINE, []))
    if not a or not b:
        return []
    deltas = {name: a.get(name, 0.0) - b.get(name, 0.0) for name in set(a) | set(b)}
    growth_total = sum(d for d in deltas.values() if d > 0)
    rows = []
    for name, d in sorted(deltas.items(), key=lambda kv: -kv[1])[:top]:
        if d <= 0:
            break
        base = b.get(name, 0.0)
        rows.append(TopOp(op=name, strict_ms=a.get(name, 0.0) / 1000, default_ms=base / 1000, delta_ms=d / 1000,
                          growth=(d / base) if base > 0 else None,
                          share=(d / growth_total) if growth_total > 0 else None))
    return rows


def _mode_summary(records: list[RunRecord]) -> ModeSummary:
    sps = [r.steps_per_s or 0.0 for r in records]
    samples = [r.samples_per_s for r in records if r.samples_per_s]
    peaks = [r.peak_memory_bytes for r in records if r.peak_memory_bytes]
    data = [statistics.median(r.data_times_s) for r in records if r.data_times_s]
    return ModeSummary(
        steps_per_s=statistics.median(sps),
        samples_per_s=statistics.median(samples) if samples else None,
        step_ms_median=1000.0 / statistics.median(sps),
        data_wait_ms_median=1000.0 * statistics.median(data) if data else None,  # part of a step
        peak_memory_bytes=max(peaks) if peaks else None,
        peak_memory_kind=records[0].peak_memory_kind,
        steps_per_s_reps=[round(v, 4) for v in sps],
    )


def _measure(ctx: RunContext, model: ModelRef, groups: list[list[WorkerSpec]], sampler: sampling.Sampler | None,
             modes: tuple[str, ...], budget: sampling.Budget) -> tuple[dict[str, dict[int, RunRecord]], bool]:
    """Run the repetitions (paired: as many as the sampler wants; else while the budget holds
    one more as long as the longest so far); each mode's record per repetition, and whether
    the budget left repetitions out."""
    by_mode: dict[str, dict[int, RunRecord]] = {m: {} for m in modes}
    longest = 0.0
    for rep, group in enumerate(groups, start=1):
        if sampler is not None and not sampler.more_reps():
            break
        if sampler is None and rep > 1 and not budget.holds(longest):
            return by_mode, True
        began = budget.elapsed()
        ctx.progress(f"{model.name}: throughput, repetition {rep}" + (
            f" (at most {len(groups)})" if sampler is not None else f"/{len(groups)}"))
        if sampler is not None:
            sampler.start_rep(tuple(s.mode for s in group))
            records = lockstep.run_together(ctx, group, sampler.on_round)
            sampler.end_rep()
        else:
            records = [run_worker(ctx, spec) for spec in group]
        for spec, record in zip(group, records):
            if not record.steps_per_s:
                raise WorkerFailed(f"run {spec.role} timed no step; raise --steps")
            by_mode[spec.mode][rep] = record
        longest = max(longest, budget.elapsed() - began)
    return by_mode, False


def run_model(run: StageRun, model: ModelRef, modes: tuple[str, ...] = MODES) -> ThroughputResult:
    """Measure every mode of one model; the result goes under the model entry's "throughput"."""
    options, ctx = run.options, run.ctx
    if BASELINE not in modes or len(modes) < 2:
        raise ValueError(f"throughput modes {modes} must include {BASELINE!r} and another mode")
    t0 = time.monotonic()
    own = options.of(ThroughputOptions)
    repetitions, time_budget = own.repetitions, own.time_budget
    budget = sampling.Budget(time_budget)
    paired = lockstep.supported() and options.world_size == 1  # ranks of two jobs cannot take turns
    groups = plan(options, model, project_commit=run.project_commit, image=run.image, modes=modes, paired=paired)
    cap = timed_cap(options, paired)

    def result(kind: type[ThroughputResult], ran: int, **outcome: Any) -> ThroughputResult:
        """The plan's keys (``ran`` repetitions of it, their records), then ``outcome``'s."""
        return kind(device=options.device, threads=options.threads, world_size=options.world_size,
                    warmup_steps=groups[0][0].warmup_steps, timed_steps=cap,
                    run_length="time" if paired and not options.steps_given else "steps", time_budget_s=time_budget,
                    repetitions=ran, max_repetitions=repetitions, order="step-by-step turns" if paired else "ABBA",
                    baseline=BASELINE, records=[f"{model.name}/{s.output}" for g in groups[:ran] for s in g],
                    **outcome)

    sampler = sampling.Sampler(modes, BASELINE, target=sampling.TARGETS.get(options.profile, sampling.TARGETS["quick"]),
                               max_rounds=cap, max_reps=repetitions, budget=budget) if paired else None
    try:
        by_mode, budget_spent = _measure(ctx, model, groups, sampler, modes, budget)
    except WorkerFailed as e:
        return result(ThroughputResult, repetitions, error=Error(kind=e.kind, message=str(e)),
                      seconds=round(time.monotonic() - t0, 3))
    ran = len(by_mode[BASELINE])
    reps = range(1, ran + 1)
    slowdowns: dict[str, Slowdown]
    if sampler is not None:  # from the paired step times, as sampled
        slowdowns = {m: sampler.summary(m) for m in modes if m != BASELINE}
    else:  # slowdown of a repetition: baseline steps/s over the mode's (> 1: the mode is slower)
        slowdowns = {
            m: slowdown([(by_mode[BASELINE][r].steps_per_s or 0.0) / (by_mode[m][r].steps_per_s or 1.0) for r in reps],
                        budget_spent=budget_spent)
            for m in modes if m != BASELINE
        }
    ops = {m: [by_mode[m][r].ops for r in reps if by_mode[m][r].ops] for m in modes}
    return result(
        MeasuredThroughput, ran, modes={m: _mode_summary([by_mode[m][r] for r in reps]) for m in modes},
        slowdown=slowdowns.get("strict", Slowdown()), slowdowns=slowdowns, top_ops=attribute_ops(ops, device=options.device),
        profiled_steps=next((by_mode[m][1].profiled_steps for m in modes), 0),
        cpus=by_mode[BASELINE][1].cpus,  # where a CPU pair took its turns
        seconds=round(time.monotonic() - t0, 3))


def attach(entry: ModelEntry, result: ThroughputResult) -> None:
    """Put a throughput result on a model entry, with what a golden keeps of it; a failed
    measurement makes the entry an ERROR."""
    add_result(entry, "throughput", typed.replace(result, golden_summary=result.summary() or NO_SUMMARY).to_json())


def throughput_summary(model_entry: ModelEntry) -> ThroughputSummary | None:
    """What a golden file keeps of a model's throughput; None where the stage did not run or measured nothing."""
    t = of(model_entry)
    return t.summary() if t is not None else None


def check_regression(current: ThroughputSummary, golden: ThroughputSummary, factor: float) -> str | None:
    """One line when strict mode got slower by more than ``factor`` against the golden.

    Both arguments are what a golden keeps (``throughput_summary``). First the slowdown ratio
    (strict over default): the current interval's low end must exceed the golden median times
    ``factor``, so a change inside the noise is not a regression. Then, on the same device
    thread count and world size only, strict steps/s falling below the golden's divided by ``factor``.
    """
    cur, gold = current.slowdown_of("strict"), golden.slowdown_of("strict")
    median, golden_median = cur.median, gold.median
    if median and golden_median:
        low = cur.ci_low or median
        if low > golden_median * factor:
            return (f"strict-mode slowdown regressed: {median:.3f}x [{low:.3f}, "
                    f"{cur.ci_high or median:.3f}] against the golden's {golden_median:.3f}x, "
                    f"beyond the allowed factor {factor:g}")

    def machine(t: ThroughputSummary) -> tuple[Any, ...]:
        return t.device, t.threads, t.world_size

    same_machine = machine(current) == machine(golden)
    now, then = current.mode("strict").steps_per_s, golden.mode("strict").steps_per_s
    if same_machine and now and then and now * factor < then:
        return (f"strict-mode throughput regressed: {now:.1f} steps/s against the golden's {then:.1f} "
                f"({then / now:.2f}x slower), beyond the allowed factor {factor:g}")
    return None
