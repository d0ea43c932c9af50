"""The throughput stage as ``reproci run`` sees it (``stages.base.Stage``): strict against default
mode per model; its table and report sections are in ``report.py``. In a module of its own because
its report reads the package (``NOISY_WIDTH``) and this module reads its report."""

from __future__ import annotations

from typing import Any, Mapping

from ... import errors
from ...entry_sections import ThroughputSummary
from ...results import ModelEntry, ResultsDocument
from ..base import Stage, StageRun
from . import attach, check_regression, report, run_model, throughput_summary
from .options import ThroughputOptions

EXPORTED = ("modes", "slowdown", "slowdowns", "top_ops", "regression", "error", "repetitions", "timed_steps",
            "warmup_steps", "device", "threads")  # what the JSON report keeps of a model's result


class Throughput(Stage):
    """Strict against default mode, per model, in turns; a failed measurement makes the entry an ERROR."""

    name = "throughput"
    report = report
    records = ("throughput",)
    options = ThroughputOptions
    matrix_columns = (("strict slowdown", report.slowdown_cell),)

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

    def exit_code(self, document: ResultsDocument, code: int) -> int:
        """With --slowdown-fails, a throughput regression fails a run that passed otherwise, as drift."""
        if (code == errors.EXIT_PASS and (document.get("options") or {}).get("slowdown_fails")
                and any(m.get("throughput_regression") for m in document.get("models") or [])):
            return errors.EXIT_DRIFT
        return code

    def golden_summary(self, entry: ModelEntry) -> ThroughputSummary | None:
        """Its rates and slowdowns (``throughput_summary``), compared by a later run's conclude."""
        return (throughput_summary(entry) or None) if entry.get("throughput") else None

    def history(self, entry: ModelEntry) -> dict[str, Any]:
        """Its rates and slowdowns, as the golden keeps them (None where it did not run)."""
        return {"throughput": throughput_summary(entry) or None}

    def trend(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """Strict mode's slowdown (median, interval, noisy) and both modes' rates of a history point."""
        t = point.get("throughput") or {}
        sd = (t.get("slowdown") or {}).get("strict") or {}
        strict = (t.get("modes") or {}).get("strict") or {}
        default = (t.get("modes") or {}).get("default") or {}
        return {"slowdown": sd.get("median"), "ci_low": sd.get("ci_low"), "ci_high": sd.get("ci_high"),
                "noisy": sd.get("noisy"), "strict_steps_per_s": strict.get("steps_per_s"),
                "default_steps_per_s": default.get("steps_per_s")}

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        t = entry.get("throughput")
        return {"throughput": {k: t.get(k) for k in EXPORTED} if isinstance(t, dict) else None}


STAGE = Throughput()
