"""``reproci images build|list``: the pinned toolchain images of docker/manifest.yaml."""

from __future__ import annotations

from pathlib import Path

import click

from .. import images

manifest_option = click.option(  # also `reproci matrix --manifest`
    "--manifest", type=click.Path(path_type=Path), default=images.default_manifest,
    help=f"Image manifest to read (default: {images.MANIFEST} under the working directory, "
         "else the one reproci ships).")


@click.group("images")
def images_group() -> None:
    """Build and list the pinned toolchain images of docker/manifest.yaml."""


@images_group.command("build")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Build again even when the image is up to date.")
@manifest_option
def build_cmd(names: tuple[str, ...], force: bool, manifest: Path) -> None:
    """Build the named images (default: all of the manifest); up-to-date images are skipped."""
    for tag in images.build(names, manifest=manifest, force=force):
        click.echo(f"ready: {tag}")


@images_group.command("list")
@manifest_option
def list_cmd(manifest: Path) -> None:
    """Show each image's name, reference, local digest and key package versions."""
    rows, note = images.listing(manifest)
    for line in images.listing_lines(rows, engine_down=note is not None):
        click.echo(line)
    if note:
        click.echo(f"note: digests unknown: {note}", err=True)
