"""What a stage of ``reproci run`` is: the one ``Stage`` interface, the ``StageRun`` every stage
of one invocation shares, and ``per_model``, which runs a stage's work for every model.

A stage has a ``name`` (what ``--stage`` says) and these parts, each with a default that does
nothing, so a stage writes only the ones it has. Every channel a stage appears in is one of them:
golden/, verdicts, reports/ and cluster/ loop over the stages they are handed and never name one.

- ``options``: its frozen options dataclass, each field made by ``settings.declared.setting``: a
  flag of ``reproci run``, a ``reproci.yaml`` key, recorded in the results when it says so, read
  by attribute as ``run.options.of(TheOptions).field``; ``needs``: the stages it starts from
  (added before it when not asked for); ``needs_image``: why it needs ``--image``, when it does;
  ``needs_golden``: why it needs the image's golden, when it does (refused before any run);
- ``run(run, entries)``: its work for every model; its result goes on the model entries under
  its name, which is its part of the results document; ``result``: that section's frozen
  dataclass (``to_json``/``from_json``, by ``reproci.typed``), which its code reads by attribute;
- ``conclude(run, document)``: called once the results document holds every stage's results and
  before the verdicts are counted (its comparison with the golden, where it has one);
- ``exit_code(document, code)``: the run's exit code once this stage had its say (``code``: the
  verdicts' and the stages' before it); a stage whose findings can fail the run changes it;
- ``golden_summary(entry)``: what the image's golden keeps of its result for a model (under its
  name), None for nothing;
- ``golden_lines(name, entry)``: its lines in ``reproci golden show`` for a model of a golden;
- ``terminal(document, out, err)``: its tables and lines in what ``reproci run`` prints;
- ``markdown(document)`` and ``html(document)``: its sections of the Markdown report (the step
  summary shows them too) and of the HTML report, empty where the document holds nothing of it;
- ``markdown_verdicts(document)``: a table of the models' verdicts beside this stage's figures,
  shown in the Markdown report in place of the plain verdict table;
- ``pr_body(document)``: its sections of the golden update's pull-request body;
- ``annotations(document)``: its GitHub workflow-command lines (``::notice ...``);
- ``webhook(document)``: its lines of the webhook's alert, each with the model it is about
  (``(model, line)``): a model it names counts as needing attention;
- ``history(entry)``: its keys of a model's point in the run history (results/history/);
- ``trend(point)``: its fields of a model's point in the trends (``reports.history.TrendPoint``),
  read from that model's point in the run history (what its ``history`` put there);
- ``markdown_trends(trends)`` and ``html_trends(trends)``: its sections of the trends
  (``reports.history.Trends``) in the Markdown and the HTML report;
- ``export(entry)``: its keys of a model in the JSON report;
- ``matrix_columns``: its columns in a merged matrix's step summary (``reproci merge``), each a
  header and the text of a merged model's cell (whose entry keeps this stage's section when it has
  any; the table escapes the text);
- ``commands``: the commands it adds to the ``reproci`` group (``reproci bisect``);
- ``records``: the roles of its runs whose records say what the environment was;
- ``in_golden_update``: False for a stage that explains a failure and has no place in recording
  a golden (``reproci golden update`` leaves its options out).

A stage in a package renders its own parts in its ``report.py`` (``terminal``, ``markdown``,
``html``), each built from the same rows of the results, with the reports' primitives (Markdown
tables in ``reports.mdtable``; ``reports.html``'s ``table``, ``prose``, ``figure`` and ``page``;
``reports.charts``); the package's ``stage.py`` holds its ``Stage``, which names that module
(``report = report``): the default ``terminal``, ``markdown``, ``markdown_verdicts``, ``html``,
``pr_body``, ``webhook``, ``markdown_trends`` and ``html_trends`` call the function of that name in
it, where it has one.
``reports/`` keeps what the whole document shows: the head and verdicts, the warnings, the loss
curves, the trends, the exports.

``reproci.plugins`` composes the stages in the order they run (this package's, then those of the
``reproci.stages`` entry points of installed packages) and the command line hands that tuple
down: the orchestrator, the golden, the verdicts and the reports loop over it.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, TypeVar, cast

import click

from .. import results
from ..document import Document
from ..results import Image, ModelEntry, ResultsDocument
from ..runner import RunContext, background, settle

if TYPE_CHECKING:
    from rich.console import Console

    from ..cluster.merged import MergedModel
    from ..settings.models import ModelRef
    from ..settings.options import RunOptions


@dataclass(frozen=True)
class StageRun:
    """What every stage of one invocation shares: the options, the backend's context, and
    what the results record of the project, the image and its golden."""

    options: RunOptions
    ctx: RunContext
    project_commit: str | None
    image: Image  # the backend's image_info, as the results record it
    old_golden: Any = None  # golden.store.Golden | None


R = TypeVar("R")  # what a stage's run_model returns for a model: its entry, or its section of it


def per_model(run_model: Callable[[StageRun, ModelRef], R], run: StageRun) -> list[R]:
    """``run_model(run, model)`` for every model, in the order given. With ``--jobs`` ≥ 2 the
    models' runs overlap, at most ``jobs`` worker processes at once (a free slot goes to
    whichever run is ready: B beside A, another model's A, a probe)."""
    options = run.options
    if options.jobs < 2 or len(options.models) < 2:
        return [run_model(run, m) for m in options.models]
    shared = dataclasses.replace(run, ctx=dataclasses.replace(run.ctx, slots=threading.BoundedSemaphore(options.jobs)))
    futures = [background(run_model, shared, m) for m in options.models]
    settle(*futures)  # a failure of one model waits for the others' runs to end, so none runs on
    return [f.result() for f in futures]


def attach_results(name: str, run_model: Callable[[StageRun, ModelRef], Mapping[str, Any]], run: StageRun,
                   entries: list[ModelEntry]) -> None:
    """``per_model(run_model, run)``, each model's result on its entry under the stage's name,
    claiming nothing about the verdict (the audit's and the probes' way)."""
    for entry, result in zip(entries, per_model(run_model, run)):
        results.add_section(entry, name, result)


class Stage:
    """The one interface of a stage (see the module's docstring for each part)."""

    name = ""
    checks_reproducibility = False  # whether its verdicts say that the runs reproduce (the determinism stage)
    records: tuple[str, ...] = ()  # the roles of its runs' records that say what the environment was
    options: type[Any] | None = None  # its frozen options dataclass (fields made by settings.declared.setting)
    result: type[Any] | None = None  # its result's dataclass: a model entry's section under its name (reproci.typed)
    needs: tuple[str, ...] = ()  # the stages it starts from, run before it when not asked for
    needs_image: str | None = None  # why it needs --image (said after the flag that asked for it)
    needs_golden: str | None = None  # why it needs the image's golden, refused before any run without one
    in_golden_update = True  # False: it explains a failure, `reproci golden update` leaves its options out
    commands: tuple[click.Command, ...] = ()  # the commands it adds to the reproci group
    matrix_columns: tuple[tuple[str, Callable[[MergedModel], str]], ...] = ()  # header, cell of a merged model
    report: ModuleType | None = None  # its report.py, whose terminal, markdown, markdown_verdicts
    # and html (those it has) are this stage's parts of every report

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        """Nothing before the golden comparison."""

    def conclude(self, run: StageRun, document: ResultsDocument) -> None:
        """Nothing to add once every stage's results are in."""

    def exit_code(self, document: ResultsDocument, code: int) -> int:
        """The exit code as the verdicts and the stages before it made it: nothing to change."""
        return code

    def golden_summary(self, entry: ModelEntry) -> Any:
        """Nothing of it in the golden."""
        return None

    def golden_lines(self, name: str, entry: Mapping[str, Any]) -> list[str]:
        """Nothing of it in ``reproci golden show``."""
        return []

    def terminal(self, document: ResultsDocument, out: Console, err: Console) -> None:
        """Its tables and lines on ``out`` (the results), its warnings on ``err``: its report's
        ``terminal(document, out)``; nothing without one."""
        if (show := getattr(self.report, "terminal", None)) is not None:
            show(document, out)

    def markdown_verdicts(self, document: ResultsDocument) -> list[str]:
        """A verdict table with this stage's figures beside the verdicts: its report's; none without one."""
        return self._drawn("markdown_verdicts", document, [])

    def markdown(self, document: ResultsDocument) -> list[str]:
        """Its sections of the Markdown report: its report's; none without one."""
        return self._drawn("markdown", document, [])

    def html(self, document: ResultsDocument) -> str:
        """Its sections of the HTML report: its report's; none without one."""
        return self._drawn("html", document, "")

    def pr_body(self, document: ResultsDocument) -> list[str]:
        """Its sections of the pull-request body: its report's; none without one."""
        return self._drawn("pr_body", document, [])

    def annotations(self, document: ResultsDocument) -> list[str]:
        """Its workflow-command lines: none (not drawn from its report: there ``annotations`` is the
        ``from __future__ import annotations`` feature)."""
        return []

    def webhook(self, document: ResultsDocument) -> list[tuple[str, str]]:
        """Its lines of the webhook's alert, each with its model: its report's; none without one."""
        return self._drawn("webhook", document, [])

    def history(self, entry: ModelEntry) -> dict[str, Any]:
        """Nothing of it in the run history."""
        return {}

    def trend(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """Nothing of it in the trends."""
        return {}

    def markdown_trends(self, trends: Mapping[str, Any]) -> list[str]:
        """Its sections of the trends in the Markdown report: its report's; none without one."""
        return self._drawn("markdown_trends", trends, [])

    def html_trends(self, trends: Mapping[str, Any]) -> str:
        """Its sections of the trends in the HTML report: its report's; none without one."""
        return self._drawn("html_trends", trends, "")

    def export(self, entry: ModelEntry) -> dict[str, Any]:
        """Nothing of it in the JSON report."""
        return {}

    def _drawn(self, part: str, shown: Any, nothing: R) -> R:
        draw = getattr(self.report, part, None)
        return nothing if draw is None else cast(R, draw(shown))


def composed(options: RunOptions) -> Stages:
    """The stages a run's options were built with (the command line's composition, carried by
    their catalog), in the order they run."""
    return Stages(cast("tuple[Stage, ...]", options.catalog.stages))


class Stages(tuple[Stage, ...]):
    """The stages of ``reproci run`` in the order they run, as ``reproci.plugins`` composes them and
    the command line hands them down."""

    __slots__ = ()

    def selected(self, names: Iterable[str]) -> list[Stage]:
        """The stages ``names`` asks for (``--stage``, or a document's recorded stages), in the order they run."""
        wanted = set(names)
        return [s for s in self if s.name in wanted]

    def ran(self, document: ResultsDocument) -> list[Stage]:
        """The stages a results document says ran, in the order they run."""
        return self.selected(Document.of(document).options.stages or [s.name for s in self[:1]])

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self)
