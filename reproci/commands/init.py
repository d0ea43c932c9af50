"""``reproci init``: set a git repository up for reproci (reproci.yaml, a plugin, goldens/, two workflows)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .. import scaffold
from ..cluster import github_matrix


@click.command("init")
@click.option("--adapter", type=click.Choice(list(scaffold.ADAPTERS)), default="plain", show_default=True,
              help="The plugin's template: plain (a torch model of your own), hf (a Hugging Face model as Trainer "
                   "trains it) or lightning (a LightningModule); script: no plugin, your own training script run "
                   "unchanged (reproci.yaml's script: and resume_script: to fill in).")
@click.option("--image", metavar="NAME", help="A manifest image every run trains in (default: the local backend, "
                                              "no container).")
@click.option("--runner-labels", default=",".join(github_matrix.DEFAULT_RUNNER_LABELS), show_default=True,
              help="Labels of your self-hosted runner, comma-separated: the workflows run there.")
@click.option("--model-name", help="The model's name, an identifier (default: the repository folder's name); "
                                   "the plugin is reproci_NAME.py.")
@click.option("--force", is_flag=True, help="Overwrite the files init writes where they exist.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="The repository to set up (default: the top level of the git repository around the "
                   "working directory).")
def init_cmd(adapter: str, image: str | None, runner_labels: str, model_name: str | None, force: bool,
             directory: Path | None) -> None:
    """Set this git repository up for reproci: reproci.yaml, a plugin for your model, goldens/
    and two GitHub workflows that call reproci's reusable ones, pinned to this release.

    Never overwrites a file unless --force; then prints the next three commands to run.
    """
    top = scaffold.repository(directory)
    options = scaffold.InitOptions(directory=top, adapter=adapter, image=None if image == github_matrix.LOCAL else image,
                                   runner_labels=github_matrix.parse_labels(runner_labels),
                                   model_name=model_name or scaffold.identifier(top.name), force=force)
    scaffold.check(options)
    planned = scaffold.files(options, scaffold.default_branch(top))
    replaced = set(scaffold.existing(options, list(planned)))
    ignored = scaffold.ignores(options)
    for path in scaffold.write(options, planned, ignored):
        click.echo(f"{'overwrote' if path in replaced else 'wrote'} {path}")
    for path, text in ignored.items():
        click.echo(f"ignored {', '.join(line for line in text.splitlines()[1:])} in {path}")
    here = "" if Path.cwd().resolve() == top else f", from {os.path.relpath(top)}"
    stand_in = (f"{options.plugin} trains a stand-in model until you answer its TODO(reproci) questions"
                if scaffold.ADAPTERS[adapter] is not None
                else "first answer reproci.yaml's TODO(reproci) questions: your script's two commands")
    click.echo(f"\nNext{here} ({stand_in}):")
    for command, why in zip(scaffold.next_commands(options), scaffold.NEXT_WHY):
        click.echo(f"  # {why}\n  {command}")
