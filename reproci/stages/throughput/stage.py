"""The throughput stage as ``reproci run`` sees it (``stages.base.Stage``): strict against default
mode per model; its table and report sections are in ``report.py``. In a module of its own because
its report reads the package (``NOISY_WIDTH``) and this module reads its report."""

from __future__ import annotations

from typing import Any, Mapping

from ... import errors, typed
from ...document import Document
from ...results import ModelEntry, ResultsDocument, add_section
from ..base import Stage, StageRun
from . import attach, check_regression, report, run_model, throughput_summary
from .options import ThroughputOptions
from .result import KeptMode, KeptSlowdown, ThroughputResult, ThroughputSummary, of

EXPORTED = ("modes", "slowdown", "slowdowns", "top_ops", "regression", "error", "repetitions", "timed_steps",
            "warmup_steps", "device", "threads")  # what the JSON report keeps of a model's result


class Throughput(Stage):
    """Strict against default mode, per model, in turns; a failed measurement makes the entry an ERROR."""

    name = "throughput"
    report = report
    records = ("throughput",)
    options = ThroughputOptions
    result = ThroughputResult
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
            t = of(entry)
            current = t.summary() if t is not None else None
            kept = golden.entry.get("throughput") if golden is not None else None
            if t is None or current is None or not kept:
                continue
            msg = check_regression(current, ThroughputSummary.from_json(kept),
                                   run.options.of(ThroughputOptions).slowdown_factor)
            if msg:
                entry["throughput_regression"] = msg
                add_section(entry, self.name, typed.replace(t, regression=msg).to_json())

    def exit_code(self, document: ResultsDocument, code: int) -> int:
        """With --slowdown-fails, a throughput regression fails a run that passed otherwise, as drift;
        not a run that recorded the golden, whose slowdown against the golden it replaces is the
        evidence of the update, as its drift is."""
        doc = Document.of(document)
        updated = bool(doc.golden and doc.golden.get("updated"))
        if (code == errors.EXIT_PASS and doc.options.slowdown_fails and not updated
                and any(m.throughput_regression for m in doc.models)):
            return errors.EXIT_DRIFT
        return code

    def golden_summary(self, entry: ModelEntry) -> dict[str, Any] | None:
        """Its rates and slowdowns (``throughput_summary``), compared by a later run's conclude."""
        summary = throughput_summary(entry)
        return summary.to_json() if summary is not None else None

    def history(self, entry: ModelEntry) -> dict[str, Any]:
        """Its rates and slowdowns, as the golden keeps them (None where it did not run)."""
        summary = throughput_summary(entry)
        return {"throughput": summary.to_json() if summary is not None else None}

    def trend(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """Strict mode's slowdown (median, interval, noisy) and both modes' rates of a history point."""
        kept = point.get("throughput")
        t = ThroughputSummary.from_json(kept) if isinstance(kept, Mapping) else ThroughputSummary()
        sd: KeptSlowdown = t.slowdown_of("strict")
        strict: KeptMode = t.mode("strict")
        return {"slowdown": sd.median, "ci_low": sd.ci_low, "ci_high": sd.ci_high, "noisy": sd.noisy,
                "strict_steps_per_s": strict.steps_per_s, "default_steps_per_s": t.mode("default").steps_per_s}

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        """Its keys of a model in the JSON report, each as results.json has it (None where it has not)."""
        t = of(entry)
        if t is None:
            return {"throughput": None}
        kept = t.to_json()
        return {"throughput": {k: kept.get(k) for k in EXPORTED}}


STAGE = Throughput()
