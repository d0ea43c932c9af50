"""Backends run one worker spec in a fresh process: a local subprocess or a container."""

from __future__ import annotations

from ..errors import InfrastructureError
from .base import Backend, BackendOptions, LaunchResult


def create(options: BackendOptions) -> Backend:
    """The backend the options ask for (docker is imported only when used)."""
    if options.backend == "local":
        from .local import LocalBackend

        return LocalBackend(options)
    try:
        from .docker_backend import DockerBackend
    except ModuleNotFoundError as e:
        if e.name not in ("docker", "requests"):
            raise
        raise InfrastructureError("--image runs workers in containers through the Docker SDK, which is not "
                                  "installed here: pip install docker, or drop --image for the local backend") from e
    return DockerBackend(options)


__all__ = ["Backend", "BackendOptions", "LaunchResult", "create"]
