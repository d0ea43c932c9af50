"""The stages of ``reproci run``, in the order they run, each one ``stages.base.Stage``.

``STAGES`` is that order: determinism first (it makes the entries the others attach to), then
throughput, variance (which reuses the determinism stage's run A), the op audit, the probes,
the bisection and the upgrade blame (which work at conclude, after the golden comparison).
The orchestrator, ``reproci run`` and the reports loop over it and never name a stage. A new
stage is a module with a ``Stage`` and one entry here, or, defined anywhere, ``register(stage)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from ..golden import check as golden_check
from ..settings import options as options_mod
from ..reports import findings, markdown
from ..reports import variance as variance_report
from ..reports.terminal import print_report, print_throughput, print_warnings
from .base import Stage, StageRun, per_model
from . import audit, bisect, blame, determinism, probes, throughput, variance
from .determinism import golden_cause, golden_ops


class Determinism(Stage):
    """A, B and C per model: the entries' verdicts; then the golden comparison."""

    name = "determinism"
    checks_reproducibility = True
    records = ("A",)

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        entries[:] = per_model(determinism.run_model, run)

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        """The golden comparison; the per-op hashes a golden update records, the op a drift
        first changed (``golden_ops``), and a re-run that proves a settable cause (``golden_cause``)."""
        from .. import verdicts

        ops = None
        if run.options.update_golden and not any(m.get("verdict") in verdicts.FAILING for m in document["models"]):
            ops = golden_ops.record(run, list(run.options.models))
        golden_check.apply(run.options, document, run.ctx.run_dir, run.old_golden, ops)
        golden_ops.name_changes(run, document)
        golden_cause.confirm(run, document)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        print_report(document, out, err)


class Throughput(Stage):
    """Strict against default mode, per model, in turns; a failed measurement makes the entry an ERROR."""

    name = "throughput"
    records = ("throughput",)

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        for model, entry in zip(run.options.models, entries):
            throughput.attach(entry, throughput.run_model(run, model))

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        print_throughput(document, out)

    def markdown_verdicts(self, document: dict[str, Any]) -> list[str]:
        return markdown.throughput(document)

    def html(self, document: dict[str, Any]) -> str:
        from ..reports import html

        return html.throughput(document)


class Variance(Stage):
    """K seeds per model, judged against the golden's seed noise."""

    name = "variance"
    records = ("variance",)

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        variance.run_all(run, entries)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        for line in variance_report.terminal_lines(document):
            out.print(line, highlight=False, markup=False)

    def markdown(self, document: dict[str, Any]) -> list[str]:
        return variance_report.markdown(document)

    def html(self, document: dict[str, Any]) -> str:
        from ..reports import html

        return html.variance(document)


def attach(name: str, run_model: Callable[[StageRun, Any], dict[str, Any]], run: StageRun,
           entries: list[dict[str, Any]]) -> None:
    """Each model's result on its entry under the stage's name, claiming nothing about the
    verdict (``verdicts.document_exit_code`` reads ``--probes-fail``)."""
    for entry, result in zip(entries, per_model(run_model, run)):
        entry[name] = result


class Audit(Stage):
    """The ops each model runs, and what strict determinism does to them on CUDA (``stages.audit``)."""

    name = "audit"

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        attach(self.name, audit.run_model, run, entries)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        findings.print_audit(document, out)

    def markdown(self, document: dict[str, Any]) -> list[str]:
        return markdown.audit_section(document)

    def html(self, document: dict[str, Any]) -> str:
        from ..reports import html

        return html.audit_section(document)


class Probes(Stage):
    """What each model's results depend on, one setting changed at a time (``stages.probes``)."""

    name = "probes"

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        attach(self.name, probes.run_model, run, entries)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        findings.print_probes(document, out)

    def markdown(self, document: dict[str, Any]) -> list[str]:
        return markdown.probes_section(document)

    def html(self, document: dict[str, Any]) -> str:
        from ..reports import html

        return html.probes_section(document)


class Bisect(Stage):
    """Each failing model's check again, one factor after another turned off (``stages.bisect``):
    at conclude, once the golden comparison has said which models drifted."""

    name = "bisect"

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        bisect.conclude(run, document)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        findings.print_bisect(document, out)

    def markdown(self, document: dict[str, Any]) -> list[str]:
        return markdown.bisect_section(document)

    def html(self, document: dict[str, Any]) -> str:
        from ..reports import html

        return html.bisect_section(document)


class Blame(Stage):
    """Each UPGRADE_CHANGED model in the golden's image with one changed package group of the new
    image at a time (``stages.blame``): at conclude, after the golden comparison."""

    name = "blame"

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        blame.conclude(run, document)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        findings.print_blame(document, out)


STAGES: tuple[Stage, ...] = (
    Determinism(), Throughput(), Variance(), Audit(), Probes(), Bisect(), Blame())


def register(stage: Stage) -> None:
    """Add a stage defined outside this package: it runs after the stages before it, and
    ``--stage`` and ``reproci.yaml`` accept its name (``options.STAGES`` grows by it)."""
    global STAGES
    if any(s.name == stage.name for s in STAGES):
        raise ValueError(f"a stage named {stage.name!r} is registered already")
    STAGES = (*STAGES, stage)
    accepted: tuple[str, ...] = options_mod.STAGES  # the names options.py checks --stage against
    vars(options_mod)["STAGES"] = (*accepted, stage.name)


def selected(names: tuple[str, ...]) -> list[Stage]:
    """The stages ``--stage`` asks for, in the order they run."""
    return [s for s in STAGES if s.name in names]


def print_run(document: dict[str, Any], names: tuple[str, ...], out: Console, err: Console, results: Path) -> None:
    """What ``reproci run`` prints: each stage's part in the order they ran; where no stage
    checked reproducibility, the models' warnings and a line saying so; then the results file."""
    stages = selected(names)
    for stage in stages:
        stage.terminal(document, out, err)
    if not any(stage.checks_reproducibility for stage in stages):
        for m in document.get("models", []):
            print_warnings(m, err)
        ran = ", ".join(stage.name for stage in stages)
        out.print(f"determinism not checked ({ran} {'stage' if len(stages) == 1 else 'stages'} only; "
                  "add --stage determinism)", highlight=False, markup=False)
    out.print(f"results: {results}", highlight=False, markup=False)
