"""The stages of ``reproci run``, each one interface the orchestrator loops over.

A stage has a ``name`` (what ``--stage`` says), ``run(run, entries)``, which does its work
for every model and puts its result on the model entries, ``conclude(run, document)``,
called once the results document holds every stage's results and before the verdicts are
counted (the determinism stage compares with the golden there), and ``terminal(document, out,
err)``, its part of what ``reproci run`` prints (``print_run`` loops over the stages that ran
and ends with the results file). ``STAGES`` is the order they
run in: determinism first (it makes the entries the others attach to), then throughput,
variance (which reuses the determinism stage's run A), the op audit, the probes, the
bisection and the upgrade blame (which work at conclude, after the golden comparison). A new
stage is a new entry here, not a branch in the orchestrator.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from ..golden import check as golden_check
from ..options import RunOptions
from ..reports import findings
from ..reports import variance as variance_report
from ..reports.terminal import print_report, print_throughput, print_warnings
from ..runner import RunContext, background, settle
from . import audit, bisect, blame, determinism, golden_cause, golden_ops, probes, throughput, variance


@dataclass(frozen=True)
class StageRun:
    """What every stage of one invocation shares: the options, the backend's context, and
    what the results record of the project, the image and its golden."""

    options: RunOptions
    ctx: RunContext
    project_commit: str | None
    image: dict[str, Any]
    old_golden: Any = None  # golden.store.Golden | None


def per_model(run_model: Callable[..., dict[str, Any]], run: StageRun) -> list[dict[str, Any]]:
    """``run_model`` for every model, in the order given. With ``--jobs`` ≥ 2 the models' runs
    overlap, at most ``jobs`` worker processes at once (a free slot goes to whichever run
    is ready: B beside A, another model's A, a probe)."""
    options, ctx = run.options, run.ctx
    kw = {"project_commit": run.project_commit, "image": run.image}
    if options.jobs < 2 or len(options.models) < 2:
        return [run_model(options, ctx, m, **kw) for m in options.models]
    shared = dataclasses.replace(ctx, slots=threading.BoundedSemaphore(options.jobs))
    futures = [background(run_model, options, shared, m, **kw) for m in options.models]
    settle(*futures)  # a failure of one model waits for the others' runs to end, so none runs on
    return [f.result() for f in futures]


class Stage:
    """The one interface of a stage: its name, its work per model, its work once every stage's
    results are in, and its lines in the terminal report."""

    name = ""
    checks_reproducibility = False  # whether its verdicts say that the runs reproduce (the determinism stage)

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        """Nothing to add once every stage's results are in."""

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        """Its tables and lines on ``out`` (the results), its warnings on ``err``; nothing by default."""


class Determinism(Stage):
    """A, B and C per model: the entries' verdicts; then the golden comparison."""

    name = "determinism"
    checks_reproducibility = True

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        entries[:] = per_model(determinism.run_model, run)

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        """The golden comparison; the per-op hashes a golden update records, the op a drift
        first changed (``golden_ops``), and a re-run that proves a settable cause (``golden_cause``)."""
        from .. import verdicts

        options, commit, image = run.options, run.project_commit, run.image
        ops = None
        if options.update_golden and not any(m.get("verdict") in verdicts.FAILING for m in document["models"]):
            ops = golden_ops.record(options, run.ctx, list(options.models), project_commit=commit, image=image)
        golden_check.apply(options, document, run.ctx.run_dir, run.old_golden, ops)
        golden_ops.name_changes(options, run.ctx, document, run.old_golden, project_commit=commit, image=image)
        golden_cause.confirm(options, run.ctx, document, run.old_golden, project_commit=commit, image=image)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        print_report(document, out, err)


class Throughput(Stage):
    """Strict against default mode, per model, in turns; a failed measurement makes the entry an ERROR."""

    name = "throughput"

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        for model, entry in zip(run.options.models, entries):
            throughput.attach(entry, throughput.run_model(run.options, run.ctx, model,
                                                          project_commit=run.project_commit, image=run.image))

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        print_throughput(document, out)


class Variance(Stage):
    """K seeds per model, judged against the golden's seed noise."""

    name = "variance"

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        variance.run_all(run.options, run.ctx, entries, project_commit=run.project_commit, image=run.image,
                         old_golden=run.old_golden)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        for line in variance_report.terminal_lines(document):
            out.print(line, highlight=False, markup=False)


class Attached(Stage):
    """A stage whose per-model result goes on the entry under the stage's name, claiming
    nothing about the verdict (``verdicts.document_exit_code`` reads ``--probes-fail``)."""

    def __init__(self, name: str, run_model: Callable[..., dict[str, Any]],
                 terminal: Callable[[dict[str, Any], Console], None]) -> None:
        self.name, self._run_model, self._terminal = name, run_model, terminal

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        for entry, result in zip(entries, per_model(self._run_model, run)):
            entry[self.name] = result

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        self._terminal(document, out)


class Bisect(Stage):
    """Each failing model's check again, one factor after another turned off (``stages.bisect``):
    at conclude, once the golden comparison has said which models drifted."""

    name = "bisect"

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        """Nothing before the golden comparison."""

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        bisect.conclude(run.options, run.ctx, document, run.old_golden, project_commit=run.project_commit,
                        image=run.image)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        findings.print_bisect(document, out)


class Blame(Stage):
    """Each UPGRADE_CHANGED model in the golden's image with one changed package group of the new
    image at a time (``stages.blame``): at conclude, after the golden comparison."""

    name = "blame"

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        """Nothing before the golden comparison."""

    def conclude(self, run: StageRun, document: dict[str, Any]) -> None:
        blame.conclude(run.options, run.ctx, document, run.old_golden, project_commit=run.project_commit,
                       image=run.image)

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        findings.print_blame(document, out)


STAGES: tuple[Stage, ...] = (Determinism(), Throughput(), Variance(), Attached("audit", audit.run_model, findings.print_audit),
                             Attached("probes", probes.run_model, findings.print_probes), Bisect(), Blame())


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
