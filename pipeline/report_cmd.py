"""``reproci report``: Markdown, HTML or JSON from a results document and the run history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from . import results
from .errors import ReprociError, ResultsError, UsageError
from .reports import FORMATS, history, jsonexport, markdown


def locate(path: Path) -> tuple[dict[str, Any], Path | None]:
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
    run_dir = path.parent / str(doc.get("run_id")) if path.name == "latest.json" else path.parent
    return doc, run_dir if run_dir.is_dir() else None


def golden_losses(document: dict[str, Any]) -> dict[str, list[Any]]:
    """Loss trajectories from the golden file the run was compared with (empty if unreadable)."""
    from . import golden

    file = (document.get("golden") or {}).get("file")
    if not file or not Path(file).is_file():
        return {}
    try:
        g = golden.load(Path(file).parent, Path(file).stem)
    except ReprociError:
        return {}
    return {name: m.entry.get("losses") or [] for name, m in (g.models if g else {}).items()}


def build(results_path: Path | None, fmt: str, history_dir: Path | None) -> str:
    """The report text. No RESULTS with --history: a trends-only report."""
    document: dict[str, Any] | None = None
    run_dir: Path | None = None
    if results_path is not None or history_dir is None:
        document, run_dir = locate(results_path or Path("results"))
        if history_dir is None and run_dir is not None and (run_dir.parent / history.DIRNAME).is_dir():
            history_dir = run_dir.parent / history.DIRNAME  # the history beside these results
    trends = history.trends(history.load(history_dir)) if history_dir is not None else None
    if fmt == "md":
        return markdown.render(document, trends)
    if fmt == "json":
        return jsonexport.render(document, trends)
    try:
        from .reports import html
    except ImportError as e:
        raise UsageError(f"the HTML report needs matplotlib ({e.name} is missing): pip install 'reproci[report]'") from e
    return html.render(document, trends, run_dir=run_dir, golden_losses=golden_losses(document) if document else None)


@click.command("report")
@click.argument("results_path", metavar="[RESULTS]", required=False, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True,
              help="md: for $GITHUB_STEP_SUMMARY and PR comments; html: one self-contained file with charts; "
                   "json: for machines.")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="File to write (default: stdout).")
@click.option("--history", "history_dir", type=click.Path(path_type=Path),
              help="History folder for trends (default: RESULTS' history/ folder when present). "
                   "Alone, without RESULTS: a trends-only report.")
@click.option("--rebuild-history", is_flag=True,
              help="First write a history file for every complete run under RESULTS (a results folder).")
def report_cmd(results_path: Path | None, fmt: str, output: Path | None, history_dir: Path | None,
               rebuild_history: bool) -> None:
    """Report a run: throughput per mode, slowdown with its interval, top ops, verdicts, loss curves,
    and slowdown trends from the run history.

    RESULTS is a results.json, a run folder or a results folder (default: ./results, its latest run).
    Append Markdown to a GitHub step summary with: reproci report >> "$GITHUB_STEP_SUMMARY".
    """
    if rebuild_history:
        root = results_path or Path("results")
        if not root.is_dir():
            raise UsageError(f"--rebuild-history needs a results folder; {root} is not one")
        written = history.rebuild(root)
        click.echo(f"wrote {len(written)} history file(s) under {root / history.DIRNAME}", err=True)
    text = build(results_path, fmt, history_dir)
    if output is None:
        click.echo(text, nl=False)
    else:
        results.atomic_write_text(output, text)
        click.echo(f"report: {output}", err=True)
