"""The variance stage's result: a model entry's ``variance`` section (``reproci.typed``), read by
attribute and written as the JSON it has always been.

What a golden keeps of it (``VarianceSummary``: K, the seeds, the run length and each metric's
spread) is its first part; the result adds the run's outcome, and once a run is judged against a
golden's seeds, the judgement (``AgainstGolden``). ``reproci compare`` reads either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ... import typed
from ...typed import Error

SUMMARY_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class MetricSpread:
    """A metric over K seeds: ``stats.describe`` of its values, and its direction."""

    values: list[float] = field(default_factory=list)  # one per seed, in seed order
    mean: float | None = None
    std: float | None = None  # sample standard deviation; None below two values
    lower_is_better: bool = False  # final_loss, eval_loss: lower; accuracy: higher (stats.lower_is_better)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A metric of this run (B) judged against the golden's seeds (A): ``stats.Judgement.to_dict()``."""

    model: str
    metric: str
    lower_is_better: bool
    k_a: int
    k_b: int
    mean_a: float
    mean_b: float
    std_a: float
    std_b: float
    delta: float  # mean_b - mean_a
    ci_low: float
    ci_high: float
    df: float | None  # Welch–Satterthwaite; None for infinity (no spread on either side)
    inside: bool  # inside seed noise: the interval holds 0
    sentence: str


@dataclass(frozen=True, kw_only=True)
class AgainstGolden:
    """This run's variance judged against the golden's, metric by metric (``stages.variance.against``)."""

    golden_run_id: str | None = None
    golden_k: int | None = None
    k: int | None = None
    comparisons: list[Comparison] = field(default_factory=list)
    skipped: str | None = None  # why nothing was compared (too few seeds on a side)
    golden_values: dict[str, list[float]] | None = typed.key(omit_none=True, default=None)  # metric -> the golden's
    # per-seed values, for the strip chart; left out when skipped



@dataclass(frozen=True, kw_only=True)
class VarianceSummary(typed.Section):
    """What an image's golden keeps of a model's variance: the seed noise a later run is judged against."""

    version: int = SUMMARY_VERSION
    k: int = 0  # seeds
    seeds: list[int] = field(default_factory=list)
    steps: int | None = None
    metrics: dict[str, MetricSpread] = field(default_factory=dict)  # final_loss, then eval_fn's metrics



@dataclass(frozen=True, kw_only=True)
class VarianceResult(VarianceSummary):
    """The variance stage's K seeds of a model (stages.variance): the summary's keys, then the run's."""

    error: Error | None = None  # the first failed seed run; the metrics are empty then
    seconds: float = 0.0  # the runs' wall times added up (they may overlap)
    records: list[str] = field(default_factory=list)  # a record file per seed, relative to the run directory
    final_sha256: list[str | None] | None = typed.key(omit_none=True, default=None)  # per seed; left out on an error
    against_golden: AgainstGolden | None = typed.key(omit_none=True, default=None)  # when the golden has variance

    def summary(self) -> VarianceSummary | None:
        """What a golden file keeps of it; None when it has no metrics (a failed run)."""
        if not self.metrics:
            return None
        return VarianceSummary(k=self.k, seeds=self.seeds, steps=self.steps,
                               metrics={name: MetricSpread(values=m.values, mean=m.mean, std=m.std,
                                                           lower_is_better=m.lower_is_better)
                                        for name, m in self.metrics.items()})


def of(entry: Mapping[str, Any]) -> VarianceResult | None:
    """A model's variance, from its entry; None where the stage did not run for it."""
    section = entry.get("variance")
    return VarianceResult.from_json(section) if isinstance(section, Mapping) else None
