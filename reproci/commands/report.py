"""``reproci report``: Markdown, HTML or JSON from a results document and the run history."""

from __future__ import annotations

from pathlib import Path

import click

from .. import atomic, plugins
from ..errors import UsageError
from ..reports import build, history


@click.command("report")
@click.argument("results_path", metavar="[RESULTS]", required=False, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(build.FORMATS), default="md", show_default=True,
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
        written = history.rebuild(root, plugins.stages())
        click.echo(f"wrote {len(written)} history file(s) under {root / history.DIRNAME}", err=True)
    text = build.render(results_path, fmt, history_dir, plugins.stages())
    if output is None:
        click.echo(text, nl=False)
    else:
        atomic.write_output(output, text)
        if not atomic.is_stream(output):  # a stream (-, /dev/stdout) carries the report itself
            click.echo(f"report: {output}", err=True)
