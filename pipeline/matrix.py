"""The GitHub Actions job matrix, generated from the image manifest (``reproci matrix``).

The workflows never copy image names by hand: a planning job runs ``reproci matrix``
and feeds its output to ``strategy.matrix``, one job per image of ``docker/manifest.yaml``::

    {"include": [{"image": "cuda12.6-torch2.7", "tag": "reproci/cuda12.6-torch2.7:1",
                  "gpu": true, "device": "cuda", "gpus": "all", "profile": "full", "world_size": 1,
                  "runs_on": ["self-hosted", "linux", "x64", "gpu"]}, ...]}

This module needs only PyYAML (through ``pipeline.images``), so the planning job can run
on a small hosted runner without torch. The click command is in ``commands/matrix.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import ConfigError, UsageError
from .images import load_manifest

DEFAULT_RUNNER_LABELS = ("self-hosted", "linux", "x64", "gpu")


def on_gpu(image: dict[str, Any]) -> bool:
    """Whether the nightly runs the image on the GPU runner: it needs a GPU (``gpu``), or it
    carries CUDA wheels that run on GPUs when asked and on the CPU otherwise (``cuda``)."""
    return bool(image.get("gpu", False) or image.get("cuda", False))


def entry(name: str, image: dict[str, Any], runner_labels: tuple[str, ...]) -> dict[str, Any]:
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
            if (not names or name in names) and (not gpu_only or on_gpu(image))]
    if not rows:
        what = "GPU images" if gpu_only else "images"
        raise UsageError(f"no {what} selected from {manifest}: GitHub refuses an empty matrix; "
                         "add an image to the manifest or drop --gpu-only")
    return {"include": rows}


def parse_labels(text: str) -> tuple[str, ...]:
    """Comma-separated runner labels, blanks dropped."""
    return tuple(label.strip() for label in text.split(",") if label.strip())


def to_json(matrix: dict[str, list[dict[str, Any]]]) -> str:
    """One line, so a workflow can write it to $GITHUB_OUTPUT."""
    return json.dumps(matrix, separators=(",", ":"))
