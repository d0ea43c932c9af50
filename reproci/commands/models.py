"""``reproci models``: the reference models and how to add your own."""

from __future__ import annotations

import click


@click.command("models")
def models_cmd() -> None:
    """List the reference models and how to add your own."""
    from ..reference_models import DESCRIPTIONS, REGISTRY

    for name, ref in REGISTRY.items():
        click.echo(f"{name:12} {DESCRIPTIONS.get(name, '')}  ({ref})")
    click.echo("\nYour own model: --model path/to/file.py:factory or --model package.module:factory")
