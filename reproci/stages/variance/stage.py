"""The variance stage as ``reproci run`` sees it (``stages.base.Stage``): K strict runs per model,
judged against the golden's seed noise; its lines and sections in every report are in ``report.py``.
In a module of its own, beside the package's runs and judgement, as the other stages' are."""

from __future__ import annotations

from typing import Any, Mapping

from ...results import ModelEntry
from ..base import Stage, StageRun
from . import report, run_all
from .command import compare_cmd
from .options import VarianceOptions
from .result import VarianceResult, VarianceSummary
from .result import of as variance_of


class Variance(Stage):
    """K seeds per model, judged against the golden's seed noise."""

    name = "variance"
    report = report
    records = ("variance",)
    options = VarianceOptions
    result = VarianceResult
    commands = (compare_cmd,)  # reproci compare: is a change inside seed noise?

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        run_all(run, entries)

    def golden_summary(self, entry: ModelEntry) -> dict[str, Any] | None:
        """Its seeds' metrics (``VarianceResult.summary``): the seed noise a later run is judged against.
        Optional: goldens recorded without the variance stage have none."""
        kept = v.summary() if (v := variance_of(entry)) is not None else None
        return kept.to_json() if kept is not None else None

    def golden_lines(self, name: str, entry: Mapping[str, Any]) -> list[str]:
        kept = entry.get("variance")
        return report.golden_lines(name, VarianceSummary.from_json(kept)) if isinstance(kept, Mapping) else []

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        return {"variance": v.to_json() if (v := variance_of(entry)) is not None else None}


STAGE = Variance()
