"""The variance stage as ``reproci run`` sees it (``stages.base.Stage``): K strict runs per model,
judged against the golden's seed noise; its lines and sections in every report are in ``report.py``.
In a module of its own, beside the package's runs and judgement, as the other stages' are."""

from __future__ import annotations

from ...results import ModelEntry
from ...settings.declared import INTEGER, Option
from ..base import Stage, StageRun
from . import report, run_all


class Variance(Stage):
    """K seeds per model, judged against the golden's seed noise."""

    name = "variance"
    report = report
    records = ("variance",)
    options = (
        Option(name="seeds", group="variance", type=int, yaml=INTEGER, default=5, convert=int,
               refuse=lambda v: None if v >= 2 else (f"must be at least 2 for a spread (got {v}); "
                                                     "`reproci compare` needs at least 3 on each side"),
               help="Variance stage: strict runs per model, seeds --seed .. --seed + K - 1 (default 5)."),
    )

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        run_all(run, entries)


STAGE = Variance()
