"""The Docker engine, through the Docker SDK: the only module that imports it.

``Engine`` wraps one client. Whatever the engine says comes out of it as an answer
(None for "no such image", False for "could not remove") or as one
InfrastructureError that names the cause and what to do; no SDK or requests
exception leaves this module. reproci's plain values (binds, ``--gpus``) become SDK
request types here too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any, TypedDict

import docker.errors
import docker.types
import requests.exceptions

import docker

from ..errors import InfrastructureError, UsageError
from .docker_spec import Bind, ContainerConfig

_GPU_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]*$")
_HOST_CONFIG_KEYS = {"mounts", "network_mode", "tmpfs", "shm_size", "device_requests", "cap_drop", "security_opt",
                     "init", "read_only", "mem_limit", "memswap_limit", "pids_limit"}  # create_container keywords
# that belong in its HostConfig


class CreateConfig(ContainerConfig, total=False):
    """A container's create keywords: those every container gets, and its own (binds as ``mounts``)."""

    labels: dict[str, str]
    user: str
    device_requests: list[docker.types.DeviceRequest] | None
    environment: dict[str, str]
    working_dir: str
    mounts: list[Bind]


class ImageInspect(TypedDict, total=False):
    """The engine's record of a local image (``GET /images/{name}/json``): the keys reproci reads."""

    Id: str  # sha256:...
    RepoDigests: list[str]  # repository@sha256:..., one for each registry the image came from or went to


class ContainerSummary(TypedDict, total=False):
    """A container as the engine lists it (``GET /containers/json``): the keys reproci reads."""

    Id: str
    Labels: dict[str, str] | None


class WaitResponse(TypedDict, total=False):
    """The engine's answer once a container stops (``POST /containers/{id}/wait``)."""

    StatusCode: int


class ContainerState(TypedDict, total=False):
    """A container's ``State``, as the engine's inspect says it (the key reproci reads)."""

    OOMKilled: bool


class PidsStats(TypedDict, total=False):
    """A container's processes and threads, and its limit on them (the stats' ``pids_stats``)."""

    current: int
    limit: int


class Stats(TypedDict, total=False):
    """A container's stats (``GET /containers/{id}/stats``): the section reproci reads."""

    pids_stats: PidsStats


class Engine:
    """One connection to the Docker engine; every verb translates the engine's errors."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    @classmethod
    def connect(cls, host: str | None = None) -> Engine:
        """The engine at DOCKER_HOST (or the default socket); InfrastructureError if it does not answer."""
        where = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        try:
            client = docker.DockerClient(base_url=host) if host else docker.from_env()
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise engine_error(e, where) from e
        return cls(client)

    def inspect_image(self, reference: str) -> ImageInspect | None:
        """The engine's record of a local image, or None when there is no such image."""
        try:
            found: ImageInspect = self.client.api.inspect_image(reference)
            return found
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as e:
            if e.status_code in (400, 404):  # an invalid reference names no image either
                return None
            raise InfrastructureError(f"the Docker engine could not inspect {reference}: {e.explanation}") from e

    def rootless(self) -> bool:
        """Whether the engine runs rootless (container root is then the invoking user)."""
        info = self.client.info()
        return any("rootless" in str(s) for s in info.get("SecurityOptions") or [])

    def create(self, image: str, command: list[str], *, display: str, gpus: str | None, config: CreateConfig) -> str:
        """Create (not start) a container; its ID. ``display`` and ``gpus`` word the errors."""
        try:
            created = self.client.api.create_container(image, command, **self._create_args(config))
        except docker.errors.ImageNotFound as e:
            raise InfrastructureError(f"image {display} not found locally; build it with "
                                      f"`reproci images build NAME` or `docker pull {display}`") from e
        except docker.errors.APIError as e:
            raise start_error(display, e, gpus) from e
        except requests.exceptions.ConnectionError as e:
            raise InfrastructureError(f"lost the Docker engine while creating a container: {e}") from e
        return str(created["Id"])

    def start(self, cid: str, *, display: str, gpus: str | None) -> None:
        try:
            self.client.api.start(cid)
        except docker.errors.APIError as e:
            raise start_error(display, e, gpus) from e

    def logs(self, cid: str) -> Iterator[bytes]:
        """The container's output as it comes, until it stops (raises whatever the stream raises)."""
        yield from self.client.api.logs(cid, stream=True, follow=True)

    def wait(self, cid: str, timeout: float) -> int | None:
        """The exit code, or None if the container still runs after ``timeout`` seconds."""
        try:
            result: WaitResponse = self.client.api.wait(cid, timeout=timeout)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as e:
            if isinstance(e, requests.exceptions.ReadTimeout) or "timed out" in str(e).lower():
                return None
            raise InfrastructureError(f"lost the Docker engine while waiting for a container: {e}") from e
        return int(result.get("StatusCode", -1))

    def oom_killed(self, cid: str) -> bool:
        """Whether the kernel killed a process of the (stopped) container for its memory limit."""
        try:
            state: ContainerState = self.client.api.inspect_container(cid)["State"]
            return bool(state.get("OOMKilled"))
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False  # gone, or the engine with it: no answer is no evidence

    def processes(self, cid: str) -> tuple[int, int | None] | None:
        """The (running) container's processes and threads now and its limit on them, as the
        engine's stats say; None where it says nothing."""
        try:
            stats: Stats = self.client.api.stats(cid, stream=False, one_shot=True)
            pids: PidsStats = stats.get("pids_stats") or {}
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return None  # gone, or the engine with it: no answer is no evidence
        current, limit = pids.get("current"), pids.get("limit")
        if not isinstance(current, int):
            return None
        return current, limit if isinstance(limit, int) else None

    def kill(self, cid: str) -> None:
        try:
            self.client.api.kill(cid)
        except docker.errors.APIError:
            pass  # already stopped

    def remove(self, cid: str) -> bool:
        """Remove a container in any state; False if the engine could not (the label sweep gets it later)."""
        try:
            self.client.api.remove_container(cid, force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.APIError, requests.exceptions.ConnectionError):
            return False
        return True

    def _listed(self, label: str) -> list[ContainerSummary]:
        """The engine's list entries (``Id``, ``Labels``, ``State``...) of every container, in any state, that
        carries ``label``, in one call. ``containers.list`` would inspect each entry afterwards, and a container
        removed between the two calls (a probe finishing, another run's clean-up) would fail the whole list."""
        return self.client.api.containers(all=True, filters={"label": label})

    def labelled(self, label: str) -> list[str]:
        """IDs of containers, in any state, that carry ``label`` (``key`` or ``key=value``)."""
        return [c["Id"] for c in self._listed(label)]

    def labels_of(self, label: str) -> list[tuple[str, dict[str, str]]]:
        """(ID, labels) of every container, in any state, that carries ``label``."""
        try:
            return [(c["Id"], dict(c.get("Labels") or {})) for c in self._listed(label)]
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return []

    def remove_labelled(self, label: str) -> None:
        """Remove every container that carries ``label``, as far as the engine still answers."""
        try:
            ids = self.labelled(label)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return
        for cid in ids:
            self.remove(cid)  # one already gone, or one the engine refuses, does not stop the others

    def output(self, image: str, command: list[str], timeout: float = 300) -> str:
        """What ``command`` prints in a fresh, networkless container of ``image`` (removed after)."""
        try:
            out = self.client.containers.run(image, command, remove=True, network_disabled=True, stdout=True,
                                             stderr=False, user="root")
        except docker.errors.ContainerError as e:
            raise InfrastructureError(f"`{' '.join(command[:2])} ...` failed in {image}: "
                                      f"{(e.stderr or b'').decode(errors='replace').strip()[-300:]}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise InfrastructureError(f"the Docker engine could not run {image}: {e}") from e
        return out.decode(errors="replace")

    def build(self, context: str, tag: str, labels: dict[str, str]) -> str:
        """Build the Dockerfile in ``context`` offline (no network) as ``tag``; the image ID."""
        try:
            image, _ = self.client.images.build(path=context, tag=tag, labels=labels, rm=True, forcerm=True,
                                                network_mode="none", pull=False)
        except docker.errors.BuildError as e:
            said = " ".join(str(c.get("stream") or c.get("error") or "").strip() for c in e.build_log)[-400:]
            raise InfrastructureError(f"building {tag} failed: {said}") from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise InfrastructureError(f"the Docker engine could not build {tag}: {e}") from e
        return str(image.id)

    def remove_image(self, reference: str) -> bool:
        """Remove an image by tag or ID; False if the engine could not."""
        try:
            self.client.images.remove(reference, force=True, noprune=False)
        except docker.errors.ImageNotFound:
            pass
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False
        return True

    def images_labelled(self, label: str) -> list[str]:
        """Tags (else IDs) of the local images that carry ``label``."""
        try:
            return [(i.tags or [i.id])[0] for i in self.client.images.list(filters={"label": label})]
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return []

    def image_ids_labelled(self, label: str) -> list[str]:
        """IDs of every local image that carries ``label``, untagged and intermediate build images included."""
        try:
            return [i.id for i in self.client.images.list(all=True, filters={"label": label})]
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return []

    def close(self) -> None:
        self.client.close()

    def _create_args(self, config: CreateConfig) -> dict[str, Any]:
        """create_container keywords: host-config ones go into a HostConfig, binds become mounts."""
        host = {k: v for k, v in config.items() if k in _HOST_CONFIG_KEYS}
        binds = config.get("mounts")
        if binds:
            host["mounts"] = [mount(b) for b in binds]
        rest = {k: v for k, v in config.items() if k not in _HOST_CONFIG_KEYS}
        rest["host_config"] = self.client.api.create_host_config(**host)
        return rest  # network_mode "none": no network but the loopback interface, where torchrun's ranks meet


def mount(bind: Bind) -> docker.types.Mount:
    return docker.types.Mount(target=str(bind.target), source=str(bind.source), type="bind",
                              read_only=bind.read_only)


def device_requests(gpus: str | None) -> list[docker.types.DeviceRequest]:
    """``--gpus`` as the engine's device requests: all, a count N, or ids (``0,1``, ``device=2``, UUIDs)."""
    if gpus is None or not str(gpus).strip():
        return []
    text = str(gpus).strip()
    caps = [["gpu"]]
    if text == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=caps)]
    if text.isdigit():
        if int(text) == 0:
            raise UsageError("--gpus 0 asks for no GPU; drop --gpus for a CPU run, or use --gpus device=0 for GPU 0")
        return [docker.types.DeviceRequest(count=int(text), capabilities=caps)]
    ids = [t.strip() for t in text.removeprefix("device=").split(",")]
    if not ids or not all(_GPU_ID.match(t) for t in ids):
        raise UsageError(f"--gpus {text!r} is not all, a count or GPU ids; use e.g. --gpus all, --gpus 2, --gpus 0,1")
    return [docker.types.DeviceRequest(device_ids=ids, capabilities=caps)]


def image_digest(attrs: ImageInspect, reference: str) -> str:
    """The registry digest of the reference's repository if the image has one, else its image ID."""
    if "@" in reference:
        return reference.split("@", 1)[1]
    repo = reference.rsplit(":", 1)[0] if ":" in reference.rsplit("/", 1)[-1] else reference
    digests = attrs.get("RepoDigests") or []
    for d in digests:
        if d.split("@", 1)[0] == repo:
            return d.split("@", 1)[1]
    return digests[0].split("@", 1)[1] if digests else str(attrs["Id"])


def engine_error(exc: BaseException, host: str) -> InfrastructureError:
    """The engine did not answer: one line naming where it was looked for and the likely cause."""
    text = str(exc)
    reason = ""
    for needle, short in (("No such file or directory", "no socket there"), ("Connection refused", "connection refused"),
                          ("Permission denied", "permission denied: add your user to the docker group"),
                          ("timed out", "timed out")):
        if needle in text:
            reason = f" ({short})"
            break
    return InfrastructureError(f"cannot reach the Docker engine at {host}{reason}: start dockerd or set DOCKER_HOST")


def no_python3_error(image: str) -> InfrastructureError:
    return InfrastructureError(f"image {image} has no python3 on its PATH; reproci needs an image with "
                               "python3, torch and numpy (e.g. `reproci images build cpu-torch2.13`)")


def start_error(image: str, exc: docker.errors.APIError, gpus: str | None) -> InfrastructureError:
    """The engine refused to start a container: say which of the known causes it is."""
    text = str(exc.explanation or exc)
    if "executable file not found" in text or ("no such file or directory" in text and "python3" in text):
        return no_python3_error(image)
    if gpus is not None and any(s in text for s in ("could not select device driver", "nvidia", "NVIDIA",
                                                    "unknown or invalid runtime", "gpu")):
        return InfrastructureError(f"GPUs were requested (--gpus {gpus}) but the Docker engine cannot provide any "
                                   f"({text.strip()[:160]}); install the NVIDIA driver and the NVIDIA Container "
                                   "Toolkit, or run on the CPU without --gpus and --device cuda")
    return InfrastructureError(f"the Docker engine could not start a container of {image}: {text.strip()[:300]}")
