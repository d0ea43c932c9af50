"""The throughput stage as ``reproci run`` sees it (``stages.base.Stage``): strict against default
mode per model; its table and report sections are in ``report.py``. In a module of its own because
its report reads the package (``NOISY_WIDTH``) and this module reads its report."""

from __future__ import annotations

from ...results import ModelEntry, ResultsDocument
from ..base import Stage, StageRun
from . import attach, check_regression, report, run_model, throughput_summary
from .options import ThroughputOptions


class Throughput(Stage):
    """Strict against default mode, per model, in turns; a failed measurement makes the entry an ERROR."""

    name = "throughput"
    report = report
    records = ("throughput",)
    options = ThroughputOptions

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        for model, entry in zip(run.options.models, entries):
            attach(entry, run_model(run, model))

    def conclude(self, run: StageRun, document: ResultsDocument) -> None:
        """The cost compared with the golden's run, whichever stages ran beside it: strict mode
        slower than the golden's by more than --slowdown-factor is a warning on the entry (or fails
        the run, with --slowdown-fails)."""
        if run.old_golden is None:
            return
        for entry in document["models"]:
            golden = run.old_golden.models.get(entry["model"])
            current = throughput_summary(entry)
            if golden is None or not current or not golden.entry.get("throughput"):
                continue
            msg = check_regression(current, golden.entry["throughput"], run.options.of(ThroughputOptions).slowdown_factor)
            if msg:
                entry["throughput_regression"] = msg
                entry["throughput"]["regression"] = msg


STAGE = Throughput()
