"""The variance stage as ``reproci run`` sees it (``stages.base.Stage``): K strict runs per model,
judged against the golden's seed noise; its lines and sections in every report are in ``report.py``.
In a module of its own, beside the package's runs and judgement, as the other stages' are."""

from __future__ import annotations

from typing import Any, Mapping, cast

from ...entry_sections import Variance as VarianceSection
from ...results import ModelEntry
from ..base import Stage, StageRun
from . import report, run_all, variance_summary
from .command import compare_cmd
from .options import VarianceOptions


class Variance(Stage):
    """K seeds per model, judged against the golden's seed noise."""

    name = "variance"
    report = report
    records = ("variance",)
    options = VarianceOptions
    commands = (compare_cmd,)  # reproci compare: is a change inside seed noise?

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        run_all(run, entries)

    def golden_summary(self, entry: ModelEntry) -> VarianceSection | None:
        """Its seeds' metrics (``variance_summary``): the seed noise a later run is judged against.
        Optional: goldens recorded without the variance stage have none."""
        return (variance_summary(entry) or None) if entry.get("variance") else None

    def golden_lines(self, name: str, entry: Mapping[str, Any]) -> list[str]:
        return report.golden_lines(name, cast(VarianceSection, entry.get("variance") or {}))

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        return {"variance": v if isinstance(v := entry.get("variance"), dict) else None}


STAGE = Variance()
