"""The upgrade blame as ``reproci run`` sees it (``stages.base.Stage``): each UPGRADE_CHANGED model
in the golden's image with one changed package group of the new image at a time, at conclude,
after the golden comparison. Its line in what ``reproci run`` prints is in ``report.py``; this
module is apart from the package because its report reads the package (``nothing``) and this
module reads its report."""

from __future__ import annotations

from dataclasses import dataclass

from ...results import ResultsDocument
from ...settings.declared import BOOLEAN, setting
from ..base import Stage, StageRun
from . import conclude, report
from .command import blame_cmd
from .result import Blame as BlameResult


@dataclass(frozen=True, kw_only=True)
class BlameOptions:
    blame: bool = setting(
        False, flag=True, yaml=BOOLEAN, adds_stage="blame",
        help="For each UPGRADE_CHANGED model (--image), run it in the golden's image with one changed package "
             "(group) of the new image at a time, and name the one that alone reproduces the change.")


class Blame(Stage):
    """Each UPGRADE_CHANGED model with one changed package group of the new image at a time."""

    name = "blame"
    report = report
    needs = ("determinism",)  # it explains the UPGRADE_CHANGED verdicts of the golden comparison
    needs_image = ("compares images: name the new one with --image (the golden names the old one); "
                   "the local backend has one environment only")  # it builds images: Docker only
    needs_golden = "compares the new image with the golden, which names the old one"
    options = BlameOptions
    result = BlameResult
    commands = (blame_cmd,)
    in_golden_update = False  # it explains a drift: `reproci blame`

    def conclude(self, run: StageRun, document: ResultsDocument) -> None:
        conclude(run, document)


STAGE = Blame()
