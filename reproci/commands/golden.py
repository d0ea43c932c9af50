"""``reproci golden``: update, show and diff the golden hashes of images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import console
from ..errors import UsageError
from ..golden import store
from ..golden.folder import require_folder
from ..golden.image_diff import diff_goldens
from ..reports.goldens import print_diff, print_golden
from .run import composed_stages, run_and_report, run_command

GOLDENS_DIR = click.option("--goldens-dir", type=click.Path(path_type=Path), default=Path("goldens"), show_default=True,
                           help="Where golden files live.")


@click.group("golden")
def golden_group() -> None:
    """Golden hashes per image: record, inspect, compare."""


@run_command("update", takes=lambda stage: stage.in_golden_update)  # not a stage that explains a failure
def update_cmd(**kwargs: Any) -> None:
    """Run the strict stage and record its hashes as the golden for --image.

    Takes the options of `reproci run` but those of the stages that explain a failure or a drift (they have
    commands of their own). Refuses to record from a run that is not reproducible by itself
    (NONDETERMINISTIC, RESUME_BROKEN, REPLICAS_DIVERGE, ERROR) and says why.
    """
    run_and_report({**kwargs, "update_golden": True})


golden_group.add_command(update_cmd)


def _require(goldens_dir: Path, name: str) -> store.Golden:
    require_folder(goldens_dir)
    g = store.load(goldens_dir, name)
    if g is None:
        known = sorted(p.stem for p in goldens_dir.glob("*.yaml")) if goldens_dir.is_dir() else []
        hint = f"known: {', '.join(known)}" if known else f"record one with `reproci golden update --image {name}`"
        raise UsageError(f"no golden for image {name!r} in {goldens_dir}/ ({hint})")
    return g


@golden_group.command("show")
@click.argument("name")
@GOLDENS_DIR
def show_cmd(name: str, goldens_dir: Path) -> None:
    """Show the golden of image NAME: identity, environment, hashes per model."""
    print_golden(_require(goldens_dir, name), console.stdout(), composed_stages())


@golden_group.command("diff")
@click.argument("name_a")
@click.argument("name_b")
@GOLDENS_DIR
def diff_cmd(name_a: str, name_b: str, goldens_dir: Path) -> None:
    """What differs between the goldens of two images, per model, with the package diff."""
    d = diff_goldens(_require(goldens_dir, name_a), _require(goldens_dir, name_b))
    print_diff(name_a, name_b, d, console.stdout())
