"""``reproci pr-body``: a golden update's evidence as a pull-request description."""

from __future__ import annotations

from pathlib import Path

import click

from .. import atomic, plugins, results
from ..reports import prbody


@click.command("pr-body")
@click.argument("results_path", metavar="RESULTS", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), help="File to write (default: stdout).")
@click.option("--require-reproducible", is_flag=True,
              help="Refuse (exit 1) unless every model's runs A, B and C agreed and the golden was recorded.")
def pr_body_cmd(results_path: Path, output: Path | None, require_reproducible: bool) -> None:
    """Render a golden update's evidence (RESULTS: results.json or its run directory) as Markdown."""
    doc = results.load(results_path)
    if require_reproducible:
        prbody.require_reproducible(doc, results_path, plugins.stages())
    body = prbody.render(doc, plugins.stages())
    if output is None:
        click.echo(body, nl=False)
    else:
        atomic.write_output(output, body)
        if not atomic.is_stream(output):  # a stream (-, /dev/stdout) carries the body itself
            click.echo(f"pull-request body: {output}")
