"""Statistics for the variance stage: per-seed summaries, the Student-t quantile, Welch's
interval for a difference of means, and the one decision whether a change is inside seed
noise (``judge``), which ``reproci compare``, the run's golden comparison and the pull-request
body all call.

The t quantile is computed without scipy: the t distribution function comes from the
regularized incomplete beta function (a continued fraction, as in Numerical Recipes §6.4),
and is inverted by bisection to far below 1e-9; tests check it against ``scipy.stats.t``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence, TypedDict

CONFIDENCE = 0.95
MIN_SEEDS = 3  # fewer runs per side give an interval too wide (or undefined) to say anything
LOWER_IS_BETTER_SUFFIXES = ("loss", "error")  # a metric named like these falls when the model improves


def lower_is_better(metric: str) -> bool:
    """A metric's direction, from its name: ``final_loss``, ``eval_loss``, ``top1_error`` fall
    as a model improves; every other metric (``accuracy``, ``auc``) rises."""
    return metric.lower().endswith(LOWER_IS_BETTER_SUFFIXES)


class Spread(TypedDict):
    """Values with their mean and sample standard deviation (``describe``): the variance stage's
    ``MetricSpread`` is this and the metric's direction."""

    values: list[float]
    mean: float | None
    std: float | None


def describe(values: Sequence[float]) -> Spread:
    """Per-seed values with their mean and sample standard deviation (None below two values)."""
    vals = [float(v) for v in values]
    return {"values": vals, "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) >= 2 else None}


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom (any real df > 0)."""
    if math.isinf(df):
        return statistics.NormalDist().cdf(t)
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T ≤ t) = p, by bisection on ``t_cdf``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Welch:
    delta: float  # mean(b) - mean(a)
    low: float
    high: float
    df: float  # Welch–Satterthwaite degrees of freedom (inf when both sides have no spread)
    se: float  # standard error of the difference
    confidence: float = CONFIDENCE


def welch(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Welch:
    """Welch's confidence interval for mean(b) - mean(a): no assumption that the spreads match."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's interval needs at least two values per side")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    delta = statistics.fmean(b) - statistics.fmean(a)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Welch(delta, delta, delta, math.inf, 0.0, confidence)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return Welch(delta, delta - half, delta + half, df, se, confidence)


def number(x: float) -> str:
    return f"{x:.3g}" if x != 0 else "0"


@dataclass(frozen=True)
class Judgement:
    """Whether B's metric moved beyond A's seed-to-seed spread, and the sentence that says so."""

    model: str
    metric: str
    lower_is_better: bool
    k_a: int
    k_b: int
    mean_a: float
    mean_b: float
    std_a: float
    std_b: float
    delta: float
    ci_low: float
    ci_high: float
    df: float
    inside: bool
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["df"] = None if math.isinf(self.df) else self.df  # JSON has no infinity
        return d


def judge(model: str, metric: str, a: Sequence[float], b: Sequence[float]) -> Judgement:
    """Inside seed noise when Welch's 95 % interval for mean(B) - mean(A) holds 0; else B is
    better or worse by the difference, in the metric's direction (``lower_is_better``)."""
    w = welch(a, b)
    lower = lower_is_better(metric)
    interval = f"{w.confidence:.0%} CI [{number(w.low)}, {number(w.high)}]".replace("%", " %")
    inside = w.low <= 0.0 <= w.high
    if inside:
        sentence = f"inside seed noise (Δ = {number(w.delta)}, {interval})"
    else:
        worse = w.delta > 0 if lower else w.delta < 0
        sentence = f"outside seed noise: B is {'worse' if worse else 'better'} by {number(abs(w.delta))} ({interval})"
    return Judgement(model=model, metric=metric, lower_is_better=lower, k_a=len(a), k_b=len(b),
                     mean_a=statistics.fmean(a), mean_b=statistics.fmean(b), std_a=statistics.stdev(a),
                     std_b=statistics.stdev(b), delta=w.delta, ci_low=w.low, ci_high=w.high, df=w.df,
                     inside=inside, sentence=sentence)
