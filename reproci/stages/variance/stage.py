"""The variance stage as ``reproci run`` sees it (``stages.base.Stage``): K strict runs per model,
judged against the golden's seed noise; its lines and sections in every report are in ``report.py``.
In a module of its own, beside the package's runs and judgement, as the other stages' are."""

from __future__ import annotations

from ...results import ModelEntry
from ..base import Stage, StageRun
from . import report, run_all
from .options import VarianceOptions


class Variance(Stage):
    """K seeds per model, judged against the golden's seed noise."""

    name = "variance"
    report = report
    records = ("variance",)
    options = VarianceOptions

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        run_all(run, entries)


STAGE = Variance()
