"""The upgrade blame as ``reproci run`` sees it (``stages.base.Stage``): each UPGRADE_CHANGED model
in the golden's image with one changed package group of the new image at a time, at conclude,
after the golden comparison. In a module of its own because the reports read the package
(``nothing``) and this module reads the reports."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from ...reports import findings
from ..base import Stage, StageRun
from . import conclude


class Blame(Stage):
    """Each UPGRADE_CHANGED model with one changed package group of the new image at a time."""

    name = "blame"

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        conclude(run, document)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        findings.print_blame(document, out)


STAGE = Blame()
