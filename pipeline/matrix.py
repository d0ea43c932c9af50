"""``reproci matrix``: the GitHub Actions job matrix, generated from the image manifest.

The workflows never copy image names by hand: a planning job runs this command and
feeds its output to ``strategy.matrix``, one job per image of ``docker/manifest.yaml``::

    {"include": [{"image": "cuda12.6-torch2.7", "tag": "reproci/cuda12.6-torch2.7:1",
                  "gpu": true, "device": "cuda", "gpus": "all", "profile": "full",
                  "runs_on": ["self-hosted", "linux", "x64", "gpu"]}, ...]}

This module needs only PyYAML and click, so the planning job can run on a small hosted
runner without torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml

from .errors import ConfigError, UsageError

MANIFEST = Path("docker/manifest.yaml")
MANIFEST_VERSION = 1
DEFAULT_RUNNER_LABELS = ("self-hosted", "linux", "x64", "gpu")


def load_manifest(path: Path) -> dict[str, dict[str, Any]]:
    """The ``images`` mapping of a manifest (NAME -> entry), checked for its format version."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"image manifest {path} does not exist; pass --manifest or run from the project root") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: malformed YAML ({getattr(e, 'problem', e)}); fix the manifest") from e
    if not isinstance(data, dict) or not isinstance(data.get("images"), dict):
        raise ConfigError(f"{path}: expected a mapping with an `images:` mapping of NAME -> entry")
    if data.get("version") != MANIFEST_VERSION:
        raise ConfigError(f"{path}: manifest format version {data.get('version')!r}, this reproci reads "
                          f"{MANIFEST_VERSION}; upgrade reproci or fix `version:`")
    images: dict[str, dict[str, Any]] = {}
    for name, entry in data["images"].items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: image {name!r} must be a mapping (dockerfile, base, tag, gpu, ...)")
        images[str(name)] = entry
    return images


def entry(name: str, image: dict[str, Any], runner_labels: tuple[str, ...]) -> dict[str, Any]:
    """One matrix row: what a job needs to run ``reproci run`` for this image."""
    gpu = bool(image.get("gpu", False))
    return {
        "image": name,
        "tag": image.get("tag"),
        "gpu": gpu,
        "device": "cuda" if gpu else "cpu",
        "gpus": "all" if gpu else "",
        "profile": "full" if gpu else "quick",
        "runs_on": list(runner_labels),
    }


def build(manifest: Path, *, gpu_only: bool = False, names: tuple[str, ...] = (),
          runner_labels: tuple[str, ...] = DEFAULT_RUNNER_LABELS) -> dict[str, list[dict[str, Any]]]:
    """The matrix for the manifest's images (all, the GPU ones, or the named ones, in manifest order)."""
    images = load_manifest(manifest)
    unknown = [n for n in names if n not in images]
    if unknown:
        raise UsageError(f"image(s) {', '.join(unknown)} not in {manifest}; known: {', '.join(images) or '(none)'}")
    if not runner_labels:
        raise UsageError("--runner-labels is empty; give at least one label, e.g. self-hosted,linux,x64,gpu")
    rows = [entry(name, image, runner_labels) for name, image in images.items()
            if (not names or name in names) and (not gpu_only or image.get("gpu"))]
    if not rows:
        what = "GPU images" if gpu_only else "images"
        raise UsageError(f"no {what} selected from {manifest}: GitHub refuses an empty matrix; "
                         "add an image to the manifest or drop --gpu-only")
    return {"include": rows}


def _labels(value: str) -> tuple[str, ...]:
    return tuple(label.strip() for label in value.split(",") if label.strip())


@click.command("matrix")
@click.option("--manifest", type=click.Path(path_type=Path), default=MANIFEST, show_default=True,
              help="Image manifest to read.")
@click.option("--gpu-only", is_flag=True, help="Only images marked `gpu: true`.")
@click.option("--image", "names", multiple=True, help="Only this image (repeatable); unknown names are refused.")
@click.option("--runner-labels", default=",".join(DEFAULT_RUNNER_LABELS), show_default=True,
              help="Comma-separated runner labels each job runs on (its `runs_on`).")
def matrix_cmd(manifest: Path, gpu_only: bool, names: tuple[str, ...], runner_labels: str) -> None:
    """Print the GitHub Actions job matrix (one job per manifest image) as one line of JSON."""
    click.echo(json.dumps(build(manifest, gpu_only=gpu_only, names=names, runner_labels=_labels(runner_labels)),
                          separators=(",", ":")))
