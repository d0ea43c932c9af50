"""``reproci merge``: the per-image shards of a CI matrix, merged into one verdict."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import plugins
from ..atomic import is_stream
from ..cluster.merge_shards import merge_files
from ..reports import github


@click.command("merge")
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Merged results file to write.")
@click.option("--summary", type=click.Path(path_type=Path), envvar="GITHUB_STEP_SUMMARY",
              help="Markdown summary to append to (default: $GITHUB_STEP_SUMMARY when set).")
@click.option("--matrix", help="The `reproci matrix` JSON (or a file): images it lists without results exit 5.")
@click.option("--annotations/--no-annotations", "annotate", default=False, envvar="GITHUB_ACTIONS",
              help="Print GitHub annotations (default: on inside GitHub Actions).")
def merge_cmd(shards: tuple[Path, ...], output: Path, summary: Path | None, matrix: str | None,
              annotate: bool) -> None:
    """Merge per-image results (SHARD: a results.json or a directory holding some) into one verdict."""
    merged, notes = merge_files(shards, output, plugins.stages(), matrix=matrix, summary=summary)
    streamed = is_stream(output)  # the merged file on a stream (-o -, /dev/stdout): merge's own lines beside it
    for note in notes:
        click.echo(f"note: {note}", err=True)
    if annotate:
        for line in github.merged_annotations(merged):
            click.echo(line, err=streamed)
    s = merged["summary"]
    counts = ", ".join(f"{v} {n}" for v, n in s["verdicts"].items()) or "no models"
    if s.get("recorded"):  # NEW before this run, and recorded by it: say so, not only "NEW"
        counts += f" ({s['recorded']} golden{'s' if s['recorded'] > 1 else ''} recorded by these runs)"
    missing = f", no results from {', '.join(merged['missing'])}" if merged["missing"] else ""
    click.echo(f"merged {s['images']} image(s), {s['models']} model(s): {counts}{missing}; "
               f"exit {s['exit_code']}; {output}", err=streamed)
    sys.stdout.flush()
    if s["exit_code"]:
        raise SystemExit(s["exit_code"])
