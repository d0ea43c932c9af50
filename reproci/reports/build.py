"""A report's text from a results document and the run history (``reproci report``):
Markdown, self-contained HTML with charts, or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import results
from ..document import Document
from ..errors import ReprociError, ResultsError, UsageError
from ..results import ResultsDocument
from . import history, jsonexport, markdown
from .history import Trends

if TYPE_CHECKING:
    from ..stages.base import Stages

FORMATS = ("md", "html", "json")


def locate(path: Path) -> tuple[ResultsDocument, Path | None]:
    """The results document at ``path`` (a results.json, latest.json, run dir or results dir) and its run dir."""
    if path.is_dir():
        if (path / "results.json").is_file():
            return results.load(path / "results.json"), path
        if (path / "latest.json").is_file():
            path = path / "latest.json"
        else:
            raise ResultsError(f"{path} holds no results.json or latest.json; run `reproci run` first "
                               "or name a results.json")
    doc = results.load(path)
    run_dir = path.parent / str(Document.of(doc).run_id) if path.name == "latest.json" else path.parent
    return doc, run_dir if run_dir.is_dir() else None


def golden_losses(document: ResultsDocument) -> dict[str, list[Any]]:
    """Loss trajectories from the golden file the run was compared with (empty if unreadable)."""
    from ..golden import comparison, store

    outcome = comparison.outcome_of(document)
    file = outcome.file if outcome else None
    if not file or not Path(file).is_file():
        return {}
    try:
        g = store.load(Path(file).parent, Path(file).stem)
    except ReprociError:
        return {}
    return {name: m.view.losses for name, m in (g.models if g else {}).items()}


def render(results_path: Path | None, fmt: str, history_dir: Path | None, stages: Stages) -> str:
    """The report text (each of ``stages`` draws its parts). No RESULTS with --history: a trends-only report."""
    document: ResultsDocument | None = None
    run_dir: Path | None = None
    if results_path is not None or history_dir is None:
        document, run_dir = locate(results_path or Path("results"))
        if history_dir is None and run_dir is not None and (run_dir.parent / history.DIRNAME).is_dir():
            history_dir = run_dir.parent / history.DIRNAME  # the history beside these results
    trends = history.trends(history.load(history_dir), stages) if history_dir is not None else None
    if fmt == "md":
        return markdown_report(document, stages, trends)
    if fmt == "json":
        return jsonexport.render(document, stages, trends)
    try:
        from . import html  # noqa: F401  (matplotlib, for the charts)
    except ImportError as e:
        raise UsageError(f"the HTML report needs matplotlib ({e.name} is missing): pip install 'reproci[report]'") from e
    return html_report(document, stages, trends, run_dir=run_dir, golden_losses=golden_losses(document) if document else None)


def markdown_report(document: ResultsDocument | None, stages: Stages, trends: Trends | None = None) -> str:
    """The Markdown report: the run's facts and verdicts, the warnings, each stage's sections
    in the order the stages run, then each stage's trends."""
    lines: list[str] = []
    if document is not None:
        lead = next((t for stage in stages if (t := stage.markdown_verdicts(document))), [])
        lines += markdown.head(document, lead)
        lines += markdown.warnings(document)
        for stage in stages:
            lines += stage.markdown(document)
    if trends:
        for stage in stages:
            lines += stage.markdown_trends(trends)
    return "\n".join(lines).rstrip() + "\n"


def html_report(document: ResultsDocument | None, stages: Stages, trends: Trends | None = None, *,
                run_dir: Path | None = None, golden_losses: dict[str, list[Any]] | None = None) -> str:
    """The HTML report: the run's facts and verdicts, the warnings, each stage's sections in the
    order the stages run, the loss curves, then each stage's trends."""
    from . import html

    parts = []
    if document is not None:
        parts += [html.head(document), html.warnings(document)]
        parts += [stage.html(document) for stage in stages]
        parts.append(html.losses(document, run_dir, golden_losses or {}))
    if trends:
        parts += [stage.html_trends(trends) for stage in stages]
    return html.page(html.title(document), parts)
