"""When the throughput stage knows enough: sequential sampling of paired step times.

The modes of a repetition take their steps in turns (reproci.stages.lockstep), so each
round gives one step of every mode, side by side in time; its ratio to the baseline's
step is one paired sample of the slowdown. As pyperf and asv calibrate, the sampler
decides as the rounds come in:

- warm-up: after the runs' fixed warm-up steps, rounds are dropped until every mode's step
  times have settled (the last ``SETTLE`` within ``SETTLE_SPREAD`` of one another), or for
  at most ``MAX_UNSETTLED`` rounds (and a quarter of a repetition's timed steps);
- then each repetition adds paired ratios until the 95 % interval of the slowdown, over
  every repetition so far, is narrower than the target (a relative half-width: ±2 % in the
  quick profile) with at least ``MIN_ROUNDS`` ratios in this repetition, or until the
  repetition's cap of timed steps;
- repetitions (fresh processes, the modes' order flipped) follow until the interval is
  within the target after at least ``MIN_REPS`` of them (both orders), or the cap.

The slowdown is the median of every counted ratio; its interval is a two-level bootstrap
(repetitions, then the pairs within each), so a difference between processes widens it as
much as the noise between steps does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 1000
SETTLE = 3
SETTLE_SPREAD = 0.25  # warm-up effects are several-fold; a shared machine jitters by 10 % and more
MAX_UNSETTLED = 8
MIN_ROUNDS = 8
MIN_REPS = 2
TARGETS = {"quick": 0.02, "full": 0.005}  # relative half-width of the 95 % interval, per profile


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
    against it, and the target must hold for each.
    """

    def __init__(self, modes: tuple[str, ...], baseline: str, *, target: float, max_rounds: int,
                 max_reps: int) -> None:
        self.modes = modes
        self.baseline = baseline
        self.others = [m for m in modes if m != baseline]
        self.target = target
        self.max_rounds = max_rounds
        self.max_reps = max_reps
        self.reps: dict[str, list[list[float]]] = {m: [] for m in self.others}
        self.order: tuple[str, ...] = modes  # the current repetition's specs' modes, in order
        self.unsettled: list[int] = []  # rounds dropped as warm-up, per repetition
        self.times: dict[str, list[float]] = {}
        self.stopped: list[str] = []  # why each repetition ended

    def start_rep(self, modes_in_order: tuple[str, ...]) -> None:
        self.order = modes_in_order
        self.times = {m: [] for m in self.modes}
        self.settled = False
        self.unsettled.append(0)
        for m in self.others:
            self.reps[m].append([])

    def on_round(self, times: list[float | None]) -> bool:
        """One round's step times, in the order the repetition's specs were given. True:
        this repetition has timed enough."""
        by_mode = dict(zip(self.order, times))
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
        if len(self.reps[self.others[0]][-1]) >= MIN_ROUNDS and self.narrow():
            self.stopped.append("within target")
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
        return done < MIN_REPS or not self.narrow()

    def summary(self, mode: str) -> dict[str, Any]:
        """The slowdown of ``mode``, in the shape the stage reports, with how it was sampled."""
        reps = self.reps[mode]
        med, low, high = interval(reps)
        width = (high - low) / med if med else float("inf")
        pairs = sum(len(r) for r in reps)
        within = half_width(med, low, high) <= self.target
        reason = (f"interval within ±{self.target:.1%} after {pairs} pairs" if within
                  else f"cap reached ({len(reps)} repetitions of at most {self.max_rounds} steps): "
                       f"interval ±{half_width(med, low, high):.1%}, wider than the ±{self.target:.1%} target")
        return {"median": med, "ci_low": low, "ci_high": high, "confidence": CONFIDENCE, "relative_width": width,
                "noisy": bool(not within), "ratios": [round(float(np.median(r)), 5) for r in reps if r],
                "pairs": pairs, "pairs_per_repetition": [len(r) for r in reps],
                "warmup_rounds_dropped": list(self.unsettled), "target_half_width": self.target,
                "within_target": within, "stopped": reason, "method": "sequential paired turns"}
