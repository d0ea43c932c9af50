"""The throughput stage as ``reproci run`` sees it (``stages.base.Stage``): strict against default
mode per model; its table and report sections are in ``report.py``. In a module of its own because
its report reads the package (``NOISY_WIDTH``) and this module reads its report."""

from __future__ import annotations

import math

from ...results import ModelEntry, ResultsDocument
from ...settings.declared import BOOLEAN, INTEGER, NUMBER, SECONDS, Option
from ..base import Stage, StageRun
from . import attach, check_regression, report, run_model, throughput_summary

# Seconds per model. On an H200 a quick-profile repetition (two processes launched and warmed up, 30 steps timed)
# took at most about 8 s (conv's and transformer's ten and part of embedding's: 80 s); 15 s a model, plus the last
# repetition's profiled steps and exit, keeps the three reference models within 60 s there
DEFAULT_TIME_BUDGET = 15.0


def _positive(v: float) -> bool:
    return math.isfinite(v) and v > 0


OPTIONS = (
    Option(name="repetitions", group="throughput", type=int, minimum=1, yaml=INTEGER, default=5, convert=int,
           refuse=lambda v: None if v >= 1 else f"must be at least 1 (got {v})",
           help="Throughput stage: interleaved repetitions per mode (at most; default 5)."),
    Option(name="time_budget", group="throughput", type=float, metavar="SECONDS", yaml=SECONDS,
           default=DEFAULT_TIME_BUDGET, convert=float,
           refuse=lambda v: None if _positive(v) else
           f"must be a positive number of seconds, as {DEFAULT_TIME_BUDGET:g} (got {v:g})",
           help="Throughput stage: seconds a model's measurement may take; it stops when the slowdown's interval "
                f"reaches its target or this is spent, and says which (default {DEFAULT_TIME_BUDGET:g})."),
    Option(name="slowdown_factor", group="throughput", type=float, yaml=NUMBER, default=1.25, convert=float,
           refuse=lambda v: None if _positive(v) else f"must be a positive number, as 1.25 (got {v})",
           help="Throughput regression threshold against the golden (default 1.25)."),
    Option(name="slowdown_fails", group="throughput", flag=True, yaml=BOOLEAN, default=False, convert=bool, record=True,
           help="A throughput regression fails the run (exit 3) instead of warning."),
)


class Throughput(Stage):
    """Strict against default mode, per model, in turns; a failed measurement makes the entry an ERROR."""

    name = "throughput"
    report = report
    records = ("throughput",)
    options = OPTIONS

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
            msg = check_regression(current, golden.entry["throughput"], run.options.knob("slowdown_factor"))
            if msg:
                entry["throughput_regression"] = msg
                entry["throughput"]["regression"] = msg


STAGE = Throughput()
