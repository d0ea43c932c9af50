"""The statistics of the variance stage against scipy.stats (skipped where scipy is not
installed: it is in the [test] extra) and against values worked by hand."""

from __future__ import annotations

import math

import pytest

from reproci import stats


@pytest.fixture(scope="module")
def scipy_stats():
    """scipy.stats, the reference; the hand-worked checks below run without it."""
    return pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("df", [1, 1.5, 2, 2.7, 3, 4, 5.5, 8, 13.2, 30, 120, 5000])
@pytest.mark.parametrize("p", [0.5, 0.6, 0.9, 0.95, 0.975, 0.995, 0.025, 0.001])
def test_t_quantile_matches_scipy(p: float, df: float, scipy_stats) -> None:
    expected = scipy_stats.t.ppf(p, df)
    assert stats.t_quantile(p, df) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_t_quantile_by_hand_and_limits() -> None:
    assert stats.t_quantile(0.975, 1) == pytest.approx(12.7062047, abs=1e-6)  # tan(pi * 0.475)
    assert stats.t_quantile(0.975, 4) == pytest.approx(2.7764451, abs=1e-6)  # the table value
    assert stats.t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError):
        stats.t_quantile(1.0, 3)


@pytest.mark.parametrize("a,b", [
    ([1.0, 1.2, 0.9, 1.1], [1.5, 1.3, 1.6, 1.45, 1.7]),
    ([0.81, 0.80, 0.83], [0.79, 0.84, 0.80]),
    ([2.30, 2.31, 2.29, 2.35, 2.28], [2.2, 2.6, 2.1, 2.9, 2.4]),  # unequal spreads: where Welch matters
])
def test_welch_interval_matches_scipy(a: list[float], b: list[float], scipy_stats) -> None:
    w = stats.welch(a, b)
    res = scipy_stats.ttest_ind(b, a, equal_var=False)
    ci = res.confidence_interval(0.95)
    assert (w.low, w.high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert w.df == pytest.approx(res.df, rel=1e-12)


def test_welch_by_hand() -> None:
    # a: mean 2, var 1; b: mean 4, var 1; K = 3 each: se = sqrt(2/3), df = 4, t = 2.776445
    w = stats.welch([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    assert w.delta == 2.0 and w.df == pytest.approx(4.0)
    assert (w.low, w.high) == pytest.approx((2 - 2.776445 * math.sqrt(2 / 3), 2 + 2.776445 * math.sqrt(2 / 3)), abs=1e-5)


def test_identical_runs_are_inside_and_a_shift_without_spread_is_outside() -> None:
    same = stats.judge("conv", "final_loss", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    assert same.inside and same.sentence == "inside seed noise (Δ = 0, 95 % CI [0, 0])"
    shifted = stats.judge("conv", "final_loss", [1.0, 1.0, 1.0], [1.5, 1.5, 1.5])
    assert not shifted.inside and shifted.to_dict()["df"] is None  # JSON-safe


def test_the_sentence_follows_the_metric_direction() -> None:
    low, high = [1.0, 1.1, 0.9, 1.05], [2.0, 2.1, 1.9, 2.05]
    assert stats.judge("m", "final_loss", low, high).sentence.startswith("outside seed noise: B is worse by 1 (95 % CI [")
    assert stats.judge("m", "accuracy", low, high).sentence.startswith("outside seed noise: B is better by 1 (95 % CI [")
    assert stats.judge("m", "top1_error", high, low).sentence.startswith("outside seed noise: B is better")
    inside = stats.judge("m", "accuracy", [0.5, 0.7, 0.6], [0.55, 0.75, 0.62])
    assert inside.inside and inside.sentence.startswith("inside seed noise (Δ = 0.04, 95 % CI [-")


def test_direction_by_name() -> None:
    assert [stats.lower_is_better(n) for n in ("final_loss", "eval_loss", "Error", "accuracy", "r2")] == [
        True, True, True, False, False]
