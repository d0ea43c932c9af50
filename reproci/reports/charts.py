"""Charts for the HTML report, drawn with matplotlib and returned as PNG bytes."""

from __future__ import annotations

import io
from typing import Any, Mapping, Protocol

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402

from .history import TrendPoint  # noqa: E402

DPI = 100


class SeedValues(Protocol):
    """A metric over the seeds (the variance stage's ``MetricSpread``): what its strip draws."""

    @property
    def values(self) -> list[float]: ...

    @property
    def lower_is_better(self) -> bool: ...


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def slowdown_bars(rows: list[dict[str, Any]]) -> bytes:
    """Strict-mode slowdown per model with its confidence interval as error bars.

    ``rows``: {"model", "median", "ci_low", "ci_high", "noisy"}.
    """
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(rows), 3.2))
    x = list(range(len(rows)))
    med = [r["median"] for r in rows]
    err = [[r["median"] - r["ci_low"] for r in rows], [r["ci_high"] - r["median"] for r in rows]]
    colors = ["#d9a441" if r.get("noisy") else "#4c72b0" for r in rows]
    ax.bar(x, med, color=colors, width=0.6)
    ax.errorbar(x, med, yerr=err, fmt="none", ecolor="black", capsize=5)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, [r["model"] + (" (noisy)" if r.get("noisy") else "") for r in rows])
    ax.set_ylabel("strict / default step time")
    ax.set_title("Cost of strict determinism (median, 95 % CI)")
    low = min([r["ci_low"] for r in rows] + [1.0])
    ax.set_ylim(bottom=max(0.0, low - 0.1))
    return _png(fig)


def slowdown_history(series: dict[str, list[TrendPoint]], title: str) -> bytes:
    """Slowdown over runs, one line per model; ``series``: model -> points from history.trends."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    runs = sorted({(str(p["created"]), str(p["run_id"])) for pts in series.values() for p in pts})
    index = {run_id: i for i, (_, run_id) in enumerate(runs, start=1)}  # one x per run of the image
    for model, points in sorted(series.items()):
        pts = [(p, s) for p in points if (s := p["slowdown"]) is not None]
        if not pts:
            continue
        x = [index[str(p["run_id"])] for p, _ in pts]
        y = [s for _, s in pts]
        err = [[s - (p["ci_low"] or s) for p, s in pts], [(p["ci_high"] or s) - s for p, s in pts]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=model)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("run (oldest first)")
    ax.set_ylabel("strict slowdown")
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="small")
    return _png(fig)


def seed_strip(model: str, metrics: Mapping[str, SeedValues], golden: dict[str, list[float]]) -> bytes:
    """One strip per metric: each seed's value as a dot, the mean as a bar, ±1 std as a band;
    beside it the golden's seeds when there are any. ``metrics``: name -> its values and direction."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.6 * len(metrics) + 0.6, 3.0), squeeze=False)
    for ax, (name, m) in zip(axes[0], metrics.items()):
        strips = ([("golden", golden[name])] if golden.get(name) else []) + [("this run", m.values)]
        for x, (label, values) in enumerate(strips):
            color = "#888888" if label == "golden" else "#4c72b0"
            mean = sum(values) / len(values)
            std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
            ax.fill_between([x - 0.25, x + 0.25], mean - std, mean + std, color=color, alpha=0.15)
            ax.hlines(mean, x - 0.25, x + 0.25, color=color, linewidth=2)
            ax.plot([x] * len(values), values, "o", color="black", markersize=4)
        ax.set_xticks(range(len(strips)), [label for label, _ in strips])
        ax.set_xlim(-0.6, len(strips) - 0.4)
        ax.set_title(f"{name} ({'lower' if m.lower_is_better else 'higher'} is better)", fontsize="small")
    fig.suptitle(f"{model}: one dot per seed, mean and ±1 std", y=1.04)
    return _png(fig)


def loss_curves(model: str, series: dict[str, tuple[list[int], list[float]]]) -> bytes:
    """Loss per step of each run (A, B, C, golden); identical curves draw on top of each other."""
    fig, ax = plt.subplots(figsize=(7, 3.0))
    styles = {"A": ("-", 2.5), "B": ("--", 1.8), "C": (":", 2.2), "golden": ("-.", 1.5)}
    for name, (steps, losses) in series.items():
        ls, lw = styles.get(name, ("-", 1.2))
        ax.plot(steps, losses, linestyle=ls, linewidth=lw, label=f"run {name}" if name != "golden" else "golden")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{model}: loss per step")
    ax.legend(fontsize="small")
    return _png(fig)
