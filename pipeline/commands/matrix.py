"""``reproci matrix``: the GitHub Actions job matrix, one job per manifest image."""

from __future__ import annotations

from pathlib import Path

import click

from .. import matrix
from .images import manifest_option


@click.command("matrix")
@manifest_option
@click.option("--gpu-only", is_flag=True, help="Only images marked `gpu: true`.")
@click.option("--image", "names", multiple=True,
              help="Only this image (repeatable; `local`: the local backend, no container); unknown names are refused.")
@click.option("--runner-labels", default=",".join(matrix.DEFAULT_RUNNER_LABELS), show_default=True,
              help="Runner labels each job runs on (its `runs_on`): comma-separated, or a JSON array.")
def matrix_cmd(manifest: Path, gpu_only: bool, names: tuple[str, ...], runner_labels: str) -> None:
    """Print the GitHub Actions job matrix (one job per manifest image) as one line of JSON."""
    plan = matrix.build(manifest, gpu_only=gpu_only, names=names, runner_labels=matrix.parse_labels(runner_labels))
    click.echo(matrix.to_json(plan))
