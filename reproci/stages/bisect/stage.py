"""The bisection as ``reproci run`` sees it (``stages.base.Stage``): each failing model's check
again, one factor after another turned off, at conclude, once the golden comparison has said
which models drifted. Its rows in every report are in ``report.py``; this module is apart from
the package because its report reads the package (``rows``, ``nothing``) and this module reads
its report."""

from __future__ import annotations

from dataclasses import dataclass

from ...results import ResultsDocument
from ...settings.declared import BOOLEAN, setting
from ..base import Stage, StageRun
from . import conclude, report
from .command import bisect_cmd
from .result import Bisect as BisectResult


@dataclass(frozen=True, kw_only=True)
class BisectOptions:
    bisect: bool = setting(
        False, flag=True, yaml=BOOLEAN, adds_stage="bisect",
        help="For each model that fails its check, re-run it with compile, AMP, loader workers, ranks and "
             "threads turned off one at a time, and name the first change that restores equality.")


class Bisect(Stage):
    """Each failing model's check again, one factor after another turned off."""

    name = "bisect"
    report = report
    needs = ("determinism",)  # it bisects what that stage's verdicts and the golden comparison found
    options = BisectOptions
    result = BisectResult
    commands = (bisect_cmd,)
    in_golden_update = False  # it explains a failure: `reproci bisect`

    def conclude(self, run: StageRun, document: ResultsDocument) -> None:
        conclude(run, document)


STAGE = Bisect()
