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


def require_device(options: BackendOptions) -> None:
    """Refuse, before any run, a device the backend can tell no run will have: the local
    backend's torch is this interpreter's. A container's or a cluster's devices are the image's
    and the nodes' (the Docker backend's preflight asks the image's torch)."""
    if options.backend == "local":
        from .local import require_device as local_device

        local_device(options.device)


__all__ = ["Backend", "BackendOptions", "LaunchResult", "create", "require_device"]
