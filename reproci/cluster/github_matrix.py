"""The GitHub Actions job matrix, generated from the image manifest (``reproci matrix``).

The workflows never copy image names by hand: a planning job runs ``reproci matrix``
and feeds its output to ``strategy.matrix``, one job per image of ``docker/manifest.yaml``::

    {"include": [{"image": "cuda12.6-torch2.7", "tag": "reproci/cuda12.6-torch2.7:1",
                  "gpu": true, "device": "cuda", "gpus": "all", "profile": "full", "world_size": 1,
                  "runs_on": ["self-hosted", "linux", "x64", "gpu"]}, ...]}

The name ``local`` is the local backend (no container: the runner's own Python), as
everywhere in reproci: ``--image local`` adds its row, with no tag, device, profile or world
size of its own, so that reproci.yaml decides those.

This module needs only PyYAML (through ``reproci.images``), so the planning job can run
on a small hosted runner without torch. The click command is in ``commands/matrix.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from ..errors import ConfigError, UsageError
from ..images import load_manifest

DEFAULT_RUNNER_LABELS = ("self-hosted", "linux", "x64", "gpu")
LOCAL = "local"  # the local backend's name in results and goldens: a row without a container


class MatrixRow(TypedDict):
    """One job of the matrix: an image and what its ``reproci run`` needs (empty for ``local``:
    reproci.yaml decides)."""

    image: str
    tag: str | None
    gpu: bool
    device: str  # cuda, cpu, or "" (local)
    gpus: str  # "all" on a GPU image
    profile: str
    world_size: int | None  # ranks per run; None for local
    runs_on: list[str]


class Matrix(TypedDict):
    """What ``strategy.matrix`` takes: its rows under ``include``."""

    include: list[MatrixRow]


def on_gpu(image: dict[str, Any]) -> bool:
    """Whether the nightly runs the image on the GPU runner: it needs a GPU (``gpu``), or it
    carries CUDA wheels that run on GPUs when asked and on the CPU otherwise (``cuda``)."""
    return bool(image.get("gpu", False) or image.get("cuda", False))


def entry(name: str, image: dict[str, Any], runner_labels: tuple[str, ...]) -> MatrixRow:
    """One matrix row: what a job needs to run ``reproci run`` for this image."""
    gpu = on_gpu(image)
    world_size = image.get("world_size", 1)  # ranks per run (--world-size): one GPU each on a GPU image
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"image {name!r}: world_size must be a positive integer, got {world_size!r}; fix the manifest")
    return {
        "image": name,
        "tag": image.get("tag"),
        "gpu": gpu,
        "device": "cuda" if gpu else "cpu",
        "gpus": "all" if gpu else "",
        "profile": "full" if gpu else "quick",
        "world_size": world_size,
        "runs_on": list(runner_labels),
    }


def local_entry(runner_labels: tuple[str, ...]) -> MatrixRow:
    """The local backend's row: the job runs ``reproci run --image local`` on the runner itself;
    empty fields leave the device, profile and world size to reproci.yaml."""
    return {"image": LOCAL, "tag": None, "gpu": False, "device": "", "gpus": "", "profile": "", "world_size": None,
            "runs_on": list(runner_labels)}


def build(manifest: Path, *, gpu_only: bool = False, names: tuple[str, ...] = (),
          runner_labels: tuple[str, ...] = DEFAULT_RUNNER_LABELS) -> Matrix:
    """The matrix for the manifest's images (all, the GPU ones, or the named ones, in manifest
    order), after the local backend's row when ``local`` is named."""
    images = load_manifest(manifest)
    unknown = [n for n in names if n not in images and n != LOCAL]
    if unknown:
        raise UsageError(f"image(s) {', '.join(unknown)} not in {manifest}; known: {', '.join(images) or '(none)'}, "
                         f"and {LOCAL} (the local backend)")
    if not runner_labels:
        raise UsageError("--runner-labels is empty; give at least one label, e.g. self-hosted,linux,x64,gpu")
    rows = [local_entry(runner_labels)] if LOCAL in names else []
    rows += [entry(name, image, runner_labels) for name, image in images.items()
             if (not names or name in names) and (not gpu_only or on_gpu(image))]
    if not rows:
        what = "GPU images" if gpu_only else "images"
        raise UsageError(f"no {what} selected from {manifest}: GitHub refuses an empty matrix; "
                         "add an image to the manifest or drop --gpu-only")
    return {"include": rows}


def parse_labels(text: str) -> tuple[str, ...]:
    """Runner labels, comma-separated or as a JSON array (what a workflow's ``runs-on`` takes
    through ``fromJSON``), blanks dropped."""
    if text.lstrip().startswith("["):
        try:
            labels = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--runner-labels {text!r} is not a JSON array of labels ({e.msg}); "
                             'write ["self-hosted", "gpu"] or self-hosted,gpu') from e
        if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
            raise UsageError(f"--runner-labels {text!r} must be an array of strings, such as " '["self-hosted", "gpu"]')
        return tuple(label.strip() for label in labels if label.strip())
    return tuple(label.strip() for label in text.split(",") if label.strip())


def to_json(matrix: Matrix) -> str:
    """One line, so a workflow can write it to $GITHUB_OUTPUT."""
    return json.dumps(matrix, separators=(",", ":"))
