"""The throughput stage's sequential sampling: when a repetition has timed enough, when
another is needed, and what it says when the cap comes first (pure: step times as given)."""

import numpy as np

from reproci.stages.throughput import sampling
from reproci.stages.throughput.sampling import Sampler

MODES = ("strict", "default")


def _feed(s: Sampler, strict_times, default_times, order=MODES) -> int:
    """Round by round as lockstep hands them out; the rounds it took until it said enough."""
    s.start_rep(order)
    taken = 0
    for ts, td in zip(strict_times, default_times):
        taken += 1
        by = {"strict": ts, "default": td}
        if s.on_round([by[m] for m in order]):
            break
    s.end_rep()
    return taken


def test_a_steady_slowdown_stops_each_repetition_at_the_minimum_and_after_two_repetitions():
    rng = np.random.default_rng(0)
    s = Sampler(MODES, "default", target=0.02, max_rounds=30, max_reps=5)
    reps = 0
    while s.more_reps():
        base = 0.010 * (1 + 0.002 * rng.standard_normal(30))
        taken = _feed(s, base * 1.25, base, MODES if reps % 2 == 0 else MODES[::-1])
        reps += 1
        assert taken < 30
    sd = s.summary("strict")
    assert reps == sampling.MIN_REPS and sd.within_target and not sd.noisy
    assert abs(sd.median - 1.25) < 0.005 and sd.ci_low <= 1.25 <= sd.ci_high
    assert sd.pairs == sum(sd.pairs_per_repetition) and "within ±2.0%" in sd.stopped


def test_noise_wider_than_the_target_runs_to_the_cap_and_says_so():
    rng = np.random.default_rng(1)
    s = Sampler(MODES, "default", target=0.02, max_rounds=20, max_reps=3)
    while s.more_reps():
        _feed(s, 0.01 * rng.uniform(0.5, 1.5, 20), 0.01 * rng.uniform(0.5, 1.5, 20))
    sd = s.summary("strict")
    assert len(sd.pairs_per_repetition) == 3 and not sd.within_target and sd.noisy
    assert sd.stopped.startswith("cap reached (3 repetitions") and "wider than the ±2.0% target" in sd.stopped
    assert s.stopped == ["cap", "cap", "cap"]


def test_rounds_before_the_step_times_settle_are_dropped():
    """A slow start (caches, allocator, in one mode only) would read as a slowdown."""
    s = Sampler(MODES, "default", target=0.02, max_rounds=30, max_reps=1)
    strict = [0.05, 0.03, 0.02, 0.012] + [0.01] * 26
    _feed(s, strict, [0.01] * 30)
    sd = s.summary("strict")
    assert sd.warmup_rounds_dropped == [5] and sd.median == 1.0  # settled once 3 in a row agree


def test_repetitions_that_disagree_widen_the_interval_and_ask_for_more():
    """Fresh processes can differ (memory layout, neighbours): each repetition tight on its
    own, 8 % apart, is not a ±2 % figure."""
    s = Sampler(MODES, "default", target=0.02, max_rounds=30, max_reps=4)
    for k, level in enumerate((1.00, 1.08)):
        _feed(s, [0.01 * level] * 30, [0.01] * 30, MODES if k % 2 == 0 else MODES[::-1])
    assert s.more_reps()
    sd = s.summary("strict")
    assert sd.ci_high - sd.ci_low > 0.04 and not sd.within_target


def test_few_timed_steps_still_leave_pairs_to_count():
    s = Sampler(MODES, "default", target=0.02, max_rounds=8, max_reps=1)
    _feed(s, [0.05, 0.01, 0.03, 0.02, 0.01, 0.04, 0.01, 0.02], [0.01] * 8)
    assert s.summary("strict").pairs >= 6  # settling takes at most a quarter of the timed steps


class _Clock:
    """The orchestrator's clock, moved by hand: a repetition's launch, its rounds, its finish."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _timed(s: Sampler, clock: _Clock, *, startup: float, round_s: float, tail: float, noisy: bool) -> list[float]:
    """Repetitions as the stage runs them, on a hand-moved clock: each launch takes ``startup``
    seconds to its first round, each round ``round_s``, each finish ``tail``. The times at
    which the sampler ended a repetition's timing."""
    rng, ends, k = np.random.default_rng(3), [], 0
    while s.more_reps():
        order = MODES if k % 2 == 0 else MODES[::-1]
        s.start_rep(order)
        clock.t += startup
        for _ in range(s.max_rounds):
            clock.t += round_s
            strict = 0.01 * (rng.uniform(0.5, 1.5) if noisy else 1.2)
            if s.on_round([{"strict": strict, "default": 0.01}[m] for m in order]):
                break
        ends.append(clock.t)
        clock.t += tail
        s.end_rep()
        k += 1
    return ends


def test_the_time_budget_sets_each_repetitions_length_and_ends_the_sampling_and_says_so():
    """Noise that never settles: the budget, not a count of steps, ends each repetition (the
    first at half of it, so both orders fit), no repetition starts that could not reach its
    first timed round, and the figure says 'budget spent at ±x %'."""
    clock = _Clock()
    s = Sampler(MODES, "default", target=0.02, max_rounds=20_000, max_reps=5,
                budget=sampling.Budget(10.0, clock))
    ends = _timed(s, clock, startup=2.0, round_s=0.1, tail=1.0, noisy=True)
    assert len(ends) == 2 and 4.99 < ends[0] < 5.11 and 9.99 < ends[1] < 10.11
    assert s.stopped == ["time share", "budget"]
    sd = s.summary("strict")
    assert sd.stop == "budget" and not sd.within_target and sd.time_budget_s == 10.0
    assert sd.how_stopped == f"budget spent at ±{sd.half_width * 100:.1f} %" and sd.half_width > 0.02
    assert sd.stopped.startswith("time budget of 10 s spent (2 repetitions)")


def test_a_repetition_is_not_started_when_the_budget_left_cannot_hold_its_start_up():
    clock = _Clock()
    s = Sampler(MODES, "default", target=0.02, max_rounds=20_000, max_reps=5,
                budget=sampling.Budget(10.0, clock))
    ends = _timed(s, clock, startup=4.0, round_s=0.05, tail=1.0, noisy=True)
    assert len(ends) == 1 and ends[0] < 6.0  # 10 - 6 s left: not enough for another 4 s launch
    sd = s.summary("strict")
    assert sd.stop == "budget"
    # It says the seconds spent, not the whole budget, and why no repetition followed.
    spent = clock.t
    assert sd.stopped.startswith(f"{spent:.1f} s of the time budget of 10 s spent; the {10 - spent:.1f} s left "
                                    "cannot hold another repetition's start-up of 4.0 s (1 repetitions)")


def test_a_slowdown_that_settles_inside_the_budget_says_settled():
    clock = _Clock()
    s = Sampler(MODES, "default", target=0.02, max_rounds=20_000, max_reps=5,
                budget=sampling.Budget(60.0, clock))
    ends = _timed(s, clock, startup=2.0, round_s=0.05, tail=1.0, noisy=False)
    sd = s.summary("strict")
    assert len(ends) == sampling.MIN_REPS and ends[-1] < 10.0 and sd.stop == "settled"
    assert sd.how_stopped == "±0.0 %, settled" and sd.median == 1.2


def test_how_a_sampling_stopped_is_one_short_sentence():
    assert sampling.how_stopped("settled", 0.018) == "±1.8 %, settled"
    assert sampling.how_stopped("budget", 0.041) == "budget spent at ±4.1 %"
    assert sampling.how_stopped("cap", 0.03) == "cap reached at ±3.0 %"
