"""The bisection as ``reproci run`` sees it (``stages.base.Stage``): each failing model's check
again, one factor after another turned off, at conclude, once the golden comparison has said
which models drifted. Its rows in every report are in ``report.py``; this module is apart from
the package because its report reads the package (``rows``, ``nothing``) and this module reads
its report."""

from __future__ import annotations

from ...results import ResultsDocument
from ...settings.declared import BOOLEAN, Option
from ..base import Stage, StageRun
from . import conclude, report


class Bisect(Stage):
    """Each failing model's check again, one factor after another turned off."""

    name = "bisect"
    report = report
    needs = ("determinism",)  # it bisects what that stage's verdicts and the golden comparison found
    options = (
        Option(name="bisect", group="bisect", flag=True, yaml=BOOLEAN, adds_stage="bisect",
               help="For each model that fails its check, re-run it with compile, AMP, loader workers, ranks and "
                    "threads turned off one at a time, and name the first change that restores equality."),
    )

    def conclude(self, run: StageRun, document: ResultsDocument) -> None:
        conclude(run, document)


STAGE = Bisect()
