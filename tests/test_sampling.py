"""The throughput stage's sequential sampling: when a repetition has timed enough, when
another is needed, and what it says when the cap comes first (pure: step times as given)."""

import numpy as np

from reproci.stages import sampling
from reproci.stages.sampling import Sampler

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
    assert reps == sampling.MIN_REPS and sd["within_target"] and not sd["noisy"]
    assert abs(sd["median"] - 1.25) < 0.005 and sd["ci_low"] <= 1.25 <= sd["ci_high"]
    assert sd["pairs"] == sum(sd["pairs_per_repetition"]) and "within ±2.0%" in sd["stopped"]


def test_noise_wider_than_the_target_runs_to_the_cap_and_says_so():
    rng = np.random.default_rng(1)
    s = Sampler(MODES, "default", target=0.02, max_rounds=20, max_reps=3)
    while s.more_reps():
        _feed(s, 0.01 * rng.uniform(0.5, 1.5, 20), 0.01 * rng.uniform(0.5, 1.5, 20))
    sd = s.summary("strict")
    assert len(sd["pairs_per_repetition"]) == 3 and not sd["within_target"] and sd["noisy"]
    assert sd["stopped"].startswith("cap reached (3 repetitions") and "wider than the ±2.0% target" in sd["stopped"]
    assert s.stopped == ["cap", "cap", "cap"]


def test_rounds_before_the_step_times_settle_are_dropped():
    """A slow start (caches, allocator, in one mode only) would read as a slowdown."""
    s = Sampler(MODES, "default", target=0.02, max_rounds=30, max_reps=1)
    strict = [0.05, 0.03, 0.02, 0.012] + [0.01] * 26
    _feed(s, strict, [0.01] * 30)
    sd = s.summary("strict")
    assert sd["warmup_rounds_dropped"] == [5] and sd["median"] == 1.0  # settled once 3 in a row agree


def test_repetitions_that_disagree_widen_the_interval_and_ask_for_more():
    """Fresh processes can differ (memory layout, neighbours): each repetition tight on its
    own, 8 % apart, is not a ±2 % figure."""
    s = Sampler(MODES, "default", target=0.02, max_rounds=30, max_reps=4)
    for k, level in enumerate((1.00, 1.08)):
        _feed(s, [0.01 * level] * 30, [0.01] * 30, MODES if k % 2 == 0 else MODES[::-1])
    assert s.more_reps()
    sd = s.summary("strict")
    assert sd["ci_high"] - sd["ci_low"] > 0.04 and not sd["within_target"]


def test_few_timed_steps_still_leave_pairs_to_count():
    s = Sampler(MODES, "default", target=0.02, max_rounds=8, max_reps=1)
    _feed(s, [0.05, 0.01, 0.03, 0.02, 0.01, 0.04, 0.01, 0.02], [0.01] * 8)
    assert s.summary("strict")["pairs"] >= 6  # settling takes at most a quarter of the timed steps
