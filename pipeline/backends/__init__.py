"""Backends run one worker spec in a fresh process: a local subprocess or a container."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Backend, LaunchResult

if TYPE_CHECKING:
    from ..options import RunOptions


def create(options: "RunOptions") -> Backend:
    """The backend the options ask for (docker is imported only when used)."""
    if options.backend == "local":
        from .local import LocalBackend

        return LocalBackend(options)
    from .docker_backend import DockerBackend

    return DockerBackend(options)


__all__ = ["Backend", "LaunchResult", "create"]
