"""The determinism stage as ``reproci run`` sees it (``stages.base.Stage``): A, B and C per model
make the entries' verdicts; at conclude, the golden comparison. In a module of its own because
the package's helpers (``golden_cause``) import the package."""

from __future__ import annotations

from rich.console import Console

from ... import verdicts
from ...document import Document
from ...golden import check as golden_check
from ...reports.terminal import print_report
from ...results import ModelEntry, ResultsDocument
from ..base import Stage, StageRun, composed, per_model
from . import golden_cause, golden_ops, run_model


class Determinism(Stage):
    """A, B and C per model: the entries' verdicts; then the golden comparison."""

    name = "determinism"
    checks_reproducibility = True
    records = ("A",)

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        entries[:] = per_model(run_model, run)

    def conclude(self, run: StageRun, document: ResultsDocument) -> None:
        """The golden comparison; the per-op hashes a golden update records, the op a drift
        first changed (``golden_ops``), and a re-run that proves a settable cause (``golden_cause``)."""
        ops = None
        if run.options.update_golden and not any(m.verdict in verdicts.FAILING for m in Document.of(document).models):
            ops = golden_ops.record(run, list(run.options.models))
        golden_check.apply(run.options, document, run.ctx.run_dir, run.old_golden, composed(run.options), ops)
        golden_ops.name_changes(run, document)
        golden_cause.confirm(run, document)

    def terminal(self, document: ResultsDocument, out: Console, err: Console) -> None:
        print_report(document, out, err)


STAGE = Determinism()
