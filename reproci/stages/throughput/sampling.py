"""When the throughput stage knows enough: sequential sampling of paired step times.

The modes of a repetition take their steps in turns (reproci.stages.throughput.lockstep), so each
round gives one step of every mode, side by side in time; its ratio to the baseline's
step is one paired sample of the slowdown. As pyperf and asv calibrate, the sampler
decides as the rounds come in:

- warm-up: after the runs' fixed warm-up steps, rounds are dropped until every mode's step
  times have settled (the last ``SETTLE`` within ``SETTLE_SPREAD`` of one another), or for
  at most ``MAX_UNSETTLED`` rounds (and a quarter of a repetition's timed steps);
- then each repetition adds paired ratios until the 95 % interval of the slowdown, over
  every repetition so far, is narrower than the target (a relative half-width: ±2 % in the
  quick profile) with at least ``MIN_ROUNDS`` ratios in this repetition, or until the
  repetition's time is up, or its cap of timed steps;
- repetitions (fresh processes, the modes' order flipped) follow until the interval is
  within the target after at least ``MIN_REPS`` of them (both orders), or the cap, or the
  time budget is spent.

The time budget (``--time-budget``, seconds per model, on the orchestrator's clock) sets a
repetition's length, not a count of steps: repetition k of the first ``MIN_REPS`` times
until k / ``MIN_REPS`` of the budget is spent, later ones until all of it is; a repetition
starts only while the budget left holds the longest start-up seen so far (launch to first
timed round). Each repetition still counts ``MIN_ROUNDS`` ratios, so a figure always
exists; the repetition that is running finishes its profiled steps after the budget.

The slowdown is the median of every counted ratio; its interval is a two-level bootstrap
(repetitions, then the pairs within each), so a difference between processes widens it as
much as the noise between steps does. How it stopped is one of ``STOPS``: settled (the
interval reached its target), budget (the time ran out first) or cap (the repetitions or
timed steps ran out first), said as ``how_stopped`` gives it: "±1.8 %, settled".
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from .result import SampledSlowdown

CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 1000
SETTLE = 3
SETTLE_SPREAD = 0.25  # warm-up effects are several-fold; a shared machine jitters by 10 % and more
MAX_UNSETTLED = 8
MIN_ROUNDS = 8
MIN_REPS = 2
CHECK_GROWTH = 1.25  # the interval is recomputed as a repetition's pairs grow by a quarter: a bootstrap
# of a few hundred pairs takes about 0.1 s on the host, longer than ten GPU steps, and the turns wait for it
TARGETS = {"quick": 0.02, "full": 0.005}  # relative half-width of the 95 % interval, per profile
STOPS = ("settled", "budget", "cap")
Clock = Callable[[], float]


def how_stopped(stop: str, half: float) -> str:
    """'±1.8 %, settled', 'budget spent at ±4.1 %' or 'cap reached at ±3.0 %': the one
    sentence every report and results.json give for how a slowdown's sampling ended."""
    if not math.isfinite(half):  # one repetition of runs one after another: no interval
        return "budget spent before an interval" if stop == "budget" else "cap reached before an interval"
    width = f"±{half * 100:.1f} %"
    return {"settled": f"{width}, settled", "budget": f"budget spent at {width}"}.get(stop, f"cap reached at {width}")


class Budget:
    """Seconds of a model's measurement, counted on the host's clock from when it is made."""

    def __init__(self, seconds: float | None, clock: Clock = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.t0 = clock()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    def holds(self, seconds: float) -> bool:
        """Whether ``seconds`` more fit in the budget (always, without one)."""
        return seconds <= self.left()


def interval(reps: list[list[float]], *, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high) of the pooled ratios: a percentile bootstrap that resamples the
    repetitions, then the ratios within each (a fixed seed: same data, same interval)."""
    arrays = [np.asarray(r, dtype=float) for r in reps if r]
    if not arrays:
        return float("nan"), float("nan"), float("nan")
    med = float(np.median(np.concatenate(arrays)))
    if sum(len(a) for a in arrays) < 2:
        return med, med, med
    rng = np.random.default_rng(seed)
    meds = np.empty(BOOTSTRAP_SAMPLES)
    for b in range(BOOTSTRAP_SAMPLES):
        chosen = rng.integers(len(arrays), size=len(arrays)) if len(arrays) > 1 else (0,)
        meds[b] = np.median(np.concatenate([arrays[j][rng.integers(len(arrays[j]), size=len(arrays[j]))]
                                            for j in chosen]))
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(meds, [tail, 100 - tail])
    return med, float(low), float(high)


def half_width(med: float, low: float, high: float) -> float:
    """The interval's larger distance from the median, relative to it."""
    return max(med - low, high - med) / med if med > 0 else float("inf")


class Sampler:
    """Decides, round by round, when a repetition has timed enough and whether another is needed.

    ``modes``: the modes in spec order; ratios are taken of every mode but ``baseline``
    against it, and the target must hold for each. ``budget``: the model's time
    (``Budget``); None: no time limit, repetitions end at ``max_rounds`` timed steps.
    """

    def __init__(self, modes: tuple[str, ...], baseline: str, *, target: float, max_rounds: int,
                 max_reps: int, budget: Budget | None = None) -> None:
        self.modes = modes
        self.baseline = baseline
        self.others = [m for m in modes if m != baseline]
        self.target = target
        self.max_rounds = max_rounds
        self.max_reps = max_reps
        self.budget = budget or Budget(None)
        self.reps: dict[str, list[list[float]]] = {m: [] for m in self.others}
        self.order: tuple[str, ...] = modes  # the current repetition's specs' modes, in order
        self.unsettled: list[int] = []  # rounds dropped as warm-up, per repetition
        self.times: dict[str, list[float]] = {}
        self.stopped: list[str] = []  # why each repetition ended
        self.startup_s = 0.0  # the longest time from a repetition's launch to its first timed round
        self.budget_spent = False  # the budget, not the target or a cap, ended the sampling
        self.spent_s = 0.0  # seconds of the budget spent when it ended the sampling
        self._rep_started: float | None = None

    def start_rep(self, modes_in_order: tuple[str, ...]) -> None:
        self.order = modes_in_order
        self.times = {m: [] for m in self.modes}
        self.settled = False
        self.next_check = MIN_ROUNDS
        self.unsettled.append(0)
        self._rep_started = self.budget.elapsed()
        for m in self.others:
            self.reps[m].append([])

    def rep_deadline(self) -> float:
        """Seconds into the budget at which the current repetition stops timing: the first
        ``MIN_REPS`` share it (the k-th ends at k / MIN_REPS of it), later ones take the rest."""
        share = min(MIN_REPS, self.max_reps)
        return float(self.budget.seconds or math.inf) * min(len(self.unsettled), share) / share

    def on_round(self, times: list[float | None]) -> bool:
        """One round's step times, in the order the repetition's specs were given. True:
        this repetition has timed enough."""
        by_mode = dict(zip(self.order, times))
        if self._rep_started is not None:  # the first round: how long launch and warm-up took
            self.startup_s = max(self.startup_s, self.budget.elapsed() - self._rep_started)
            self._rep_started = None
        for m, t in by_mode.items():
            self.times[m].append(float(t))  # type: ignore[arg-type]
        if not self.settled:  # at most a quarter of the timed steps go to settling
            self.settled = self._settled() or self.unsettled[-1] >= min(MAX_UNSETTLED, self.max_rounds // 4)
            if not self.settled:
                self.unsettled[-1] += 1
                return False
        base = by_mode[self.baseline]
        for m in self.others:
            self.reps[m][-1].append(by_mode[m] / base)  # type: ignore[operator]
        pairs = len(self.reps[self.others[0]][-1])
        if pairs < MIN_ROUNDS:
            return False
        if pairs >= self.next_check:
            self.next_check = max(pairs + 1, int(pairs * CHECK_GROWTH))
            if self.narrow():
                self.stopped.append("within target")
                return True
        if self.budget.elapsed() >= self.rep_deadline():
            self.budget_spent = self.budget.left() <= 0
            self.spent_s = self.budget.elapsed()
            self.stopped.append("budget" if self.budget_spent else "time share")
            return True
        return False

    def _settled(self) -> bool:
        for t in self.times.values():
            last = t[-SETTLE:]
            if len(last) < SETTLE or max(last) > min(last) * (1 + SETTLE_SPREAD):
                return False
        return True

    def end_rep(self) -> None:
        """The repetition's runs have finished (early, or at their cap of timed steps)."""
        if len(self.stopped) < len(self.unsettled):
            self.stopped.append("cap")

    def narrow(self) -> bool:
        return all(half_width(*interval(self.reps[m])) <= self.target for m in self.others)

    def more_reps(self) -> bool:
        done = len(self.unsettled)
        if done >= self.max_reps:
            return False
        if done and not self.budget.holds(self.startup_s):  # another would not reach its first timed round
            if not self.budget_spent and not self.narrow():
                self.budget_spent, self.spent_s = True, self.budget.elapsed()
            return False
        return done < MIN_REPS or not self.narrow()

    def _budget_text(self) -> str:
        """How the budget ended the sampling: all of it spent, or too little of it left to
        start another repetition ('9.3 s of the time budget of 15 s spent; the 5.7 s left
        cannot hold another repetition's start-up of 8.1 s')."""
        budget = float(self.budget.seconds or math.inf)
        if self.spent_s >= budget:
            return f"time budget of {budget:g} s spent"
        return (f"{self.spent_s:.1f} s of the time budget of {budget:g} s spent; the {budget - self.spent_s:.1f} s "
                f"left cannot hold another repetition's start-up of {self.startup_s:.1f} s")

    def summary(self, mode: str) -> SampledSlowdown:
        """The slowdown of ``mode``, in the shape the stage reports, with how it was sampled."""
        reps = self.reps[mode]
        med, low, high = interval(reps)
        width = (high - low) / med if med else float("inf")
        pairs = sum(len(r) for r in reps)
        half = half_width(med, low, high)
        within = half <= self.target
        stop = "settled" if within else "budget" if self.budget_spent else "cap"
        reason = (f"interval within ±{self.target:.1%} after {pairs} pairs" if within
                  else f"{self._budget_text()} ({len(reps)} repetitions): interval "
                       f"±{half:.1%}, wider than the ±{self.target:.1%} target" if stop == "budget"
                  else f"cap reached ({len(reps)} repetitions of at most {self.max_rounds} steps): "
                       f"interval ±{half:.1%}, wider than the ±{self.target:.1%} target")
        return SampledSlowdown(
            median=med, ci_low=low, ci_high=high, confidence=CONFIDENCE, relative_width=width, noisy=bool(not within),
            ratios=[round(float(np.median(r)), 5) for r in reps if r], pairs=pairs,
            pairs_per_repetition=[len(r) for r in reps], warmup_rounds_dropped=list(self.unsettled),
            target_half_width=self.target, within_target=within, stopped=reason, stop=stop,
            half_width=half if math.isfinite(half) else None, how_stopped=how_stopped(stop, half),
            time_budget_s=self.budget.seconds, method="sequential paired turns")
