"""The Docker backend: every worker run in a fresh container of one image.

The only module that imports the Docker SDK. The image brings python3, torch and numpy
(its digest identifies the toolchain alone); reproci brings the worker code, mounted
read-only at run time. Inside a container:

    /reproci/code/pipeline, /reproci/code/reference_models   read-only, on PYTHONPATH
    /reproci/plugins/<id>                                      read-only: a plugin model's directory
    /reproci/run                                               read-write: results/<run_id>
    /tmp                                                       tmpfs, also HOME

A container runs as the invoking user (files it writes are theirs), with no network,
no capabilities, and an environment of the determinism variables, PYTHONPATH and HOME
only: nothing is inherited from the host. Every container carries the labels
``reproci.session`` and ``reproci.pid`` and is removed on success, failure, timeout
and Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from ..errors import InfrastructureError, UsageError
from ..worker.spec import WorkerSpec
from .base import Backend, LaunchResult
from .base import CODE_ROOT

CODE = PurePosixPath("/reproci/code")
RUN = PurePosixPath("/reproci/run")
PLUGINS = PurePosixPath("/reproci/plugins")
CODE_PACKAGES = ("pipeline", "reference_models")  # what the worker imports from the project
LABEL = "reproci"  # every container: reproci=worker|preflight
MIN_PYTHON = (3, 10)
PREFLIGHT_TIMEOUT_S = 120.0
WORKER_EXIT_MISSING = 5  # pipeline.worker: torch or numpy is missing

# Runs in the image before any worker: which python3, and can it find torch and numpy?
# find_spec, not import: the answer comes in well under a second.
_PREFLIGHT = """\
import importlib.util, json, sys
out = {"python": list(sys.version_info[:3]),
       "missing": [n for n in ("torch", "numpy") if importlib.util.find_spec(n) is None]}
if not out["missing"]:
    from importlib import metadata
    for n in ("torch", "numpy"):
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    if sys.argv[1:] == ["cuda"]:
        import torch
        out["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
print("REPROCI-PREFLIGHT " + json.dumps(out), flush=True)
"""


# --- pure translations (no engine needed) -------------------------------------------------

@dataclass(frozen=True)
class Bind:
    source: Path  # host directory
    target: PurePosixPath  # where the container sees it
    read_only: bool = True

    def mount(self) -> docker.types.Mount:
        return docker.types.Mount(target=str(self.target), source=str(self.source), type="bind",
                                  read_only=self.read_only)


def code_binds(code_root: Path = CODE_ROOT) -> list[Bind]:
    """The worker's packages, each mounted read-only under /reproci/code (nothing else of the checkout)."""
    return [Bind(code_root / p, CODE / p) for p in CODE_PACKAGES]


def plugin_target(host_dir: Path) -> PurePosixPath:
    """A stable container directory for a host directory holding plugin code."""
    return PLUGINS / hashlib.sha256(str(host_dir).encode()).hexdigest()[:12]


def _module_root(module: str) -> Path | None:
    """The host file or package directory of a top-level module, if it resolves here."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve() if spec.origin and spec.origin not in ("built-in", "frozen") else None


# Spec fields that hold paths (relative ones resolve against the spec file's directory).
PATH_FIELDS = ("output", "resume_from")


def _path_fields(spec: WorkerSpec) -> list[str]:
    return [f.name for f in dataclasses.fields(spec) if f.name in PATH_FIELDS or f.name.endswith("_path")]


def translate_spec(spec: WorkerSpec, run_dir: Path, *, registry: tuple[str, ...] = ()) -> tuple[WorkerSpec, list[Bind]]:
    """The spec as the container sees it, and the read-only binds its plugin code needs.

    Registry names and relative paths (they resolve against the spec file's directory,
    which is mounted) stay as they are; absolute paths under the run directory move to
    /reproci/run. A plugin file ``/abs/dir/f.py:factory`` becomes
    ``/reproci/plugins/<id>/f.py:factory`` with ``/abs/dir`` mounted there. A plugin
    module ``pkg.mod:factory`` that resolves on this host gets its top-level package
    mounted and put on the worker's sys.path; one that does not is looked for in the image.
    """
    binds: dict[PurePosixPath, Bind] = {}

    def bind(host: Path, target: PurePosixPath) -> None:
        binds.setdefault(target, Bind(host, target))

    model_ref = spec.model_ref
    extra_paths: list[str] = []
    target, sep, factory = model_ref.rpartition(":")
    if model_ref not in registry and sep and target:
        if target.endswith(".py"):
            host = Path(target).expanduser().resolve()
            bind(host.parent, plugin_target(host.parent))
            model_ref = f"{plugin_target(host.parent) / host.name}:{factory}"
        elif (top := target.split(".")[0]) not in CODE_PACKAGES and (root := _module_root(top)) is not None:
            bind(root, plugin_target(root) / root.name)  # the package directory (or module file) alone
            extra_paths.append(str(plugin_target(root)))
    plugin_paths: list[str] = []
    for p in spec.plugin_paths:
        if Path(p).is_absolute():
            host = Path(p).resolve()
            bind(host, plugin_target(host))
            p = str(plugin_target(host))
        plugin_paths.append(p)
    plugin_paths += [p for p in extra_paths if p not in plugin_paths]

    def inside(p: str | None) -> str | None:
        if p is None or not Path(p).is_absolute():
            return p
        try:
            return str(RUN / Path(p).resolve().relative_to(run_dir.resolve()))
        except ValueError:
            raise ValueError(f"spec path {p} is outside the run directory {run_dir}") from None

    paths: dict[str, Any] = {name: inside(getattr(spec, name)) for name in _path_fields(spec)}
    return replace(spec, model_ref=model_ref, plugin_paths=tuple(plugin_paths), **paths), list(binds.values())


def container_path(host: Path, run_dir: Path) -> PurePosixPath:
    """Where a file under the run directory appears in the container."""
    return RUN / PurePosixPath(host.resolve().relative_to(run_dir.resolve()).as_posix())


def environment(spec: WorkerSpec) -> dict[str, str]:
    """The container's whole environment: determinism variables, PYTHONPATH and HOME."""
    from ..worker.launch import launch_environment

    env = launch_environment(seed=spec.seed, threads=spec.threads, strict=spec.mode == "strict")
    env["PYTHONPATH"] = str(CODE)
    env["HOME"] = "/tmp"
    return env


_GPU_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]*$")


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


def container_user(uid: int, gid: int, *, rootless: bool) -> str:
    """The container user whose files on the host belong to the invoking user."""
    return "0:0" if rootless else f"{uid}:{gid}"  # rootless engine: container root is the invoking user


def engine_error(exc: BaseException, host: str) -> InfrastructureError:
    text = str(exc)
    reason = ""
    for needle, short in (("No such file or directory", "no socket there"), ("Connection refused", "connection refused"),
                          ("Permission denied", "permission denied: add your user to the docker group"),
                          ("timed out", "timed out")):
        if needle in text:
            reason = f" ({short})"
            break
    return InfrastructureError(f"cannot reach the Docker engine at {host}{reason}: start dockerd or set DOCKER_HOST")


def start_error(image: str, exc: docker.errors.APIError, gpus: str | None) -> InfrastructureError:
    """The engine refused to start a container: say which of the known causes it is."""
    text = str(exc.explanation or exc)
    if "executable file not found" in text or ("no such file or directory" in text and "python3" in text):
        return InfrastructureError(f"image {image} has no python3 on its PATH; reproci needs an image with "
                                   "python3, torch and numpy (e.g. `reproci images build cpu-torch2.13`)")
    if gpus is not None and any(s in text for s in ("could not select device driver", "nvidia", "NVIDIA",
                                                    "unknown or invalid runtime", "gpu")):
        return InfrastructureError(f"GPUs were requested (--gpus {gpus}) but the Docker engine cannot provide any "
                                   f"({text.strip()[:160]}); install the NVIDIA driver and the NVIDIA Container "
                                   "Toolkit, or run on the CPU without --gpus and --device cuda")
    return InfrastructureError(f"the Docker engine could not start a container of {image}: {text.strip()[:300]}")


def image_digest(attrs: dict[str, Any], reference: str) -> str:
    """The registry digest of the reference's repository if the image has one, else its image ID."""
    if "@" in reference:
        return reference.split("@", 1)[1]
    repo = reference.rsplit(":", 1)[0] if ":" in reference.rsplit("/", 1)[-1] else reference
    digests = attrs.get("RepoDigests") or []
    for d in digests:
        if d.split("@", 1)[0] == repo:
            return d.split("@", 1)[1]
    return digests[0].split("@", 1)[1] if digests else str(attrs["Id"])


# --- the engine -----------------------------------------------------------------------------

def connect(host: str | None = None) -> docker.DockerClient:
    """A client for the engine at DOCKER_HOST (or the default socket); InfrastructureError if it does not answer."""
    where = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        raise engine_error(e, where) from e
    return client


def inspect_image(client: docker.DockerClient, reference: str) -> dict[str, Any] | None:
    """The engine's record of a local image, or None when there is no such image."""
    try:
        return client.api.inspect_image(reference)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as e:
        if e.status_code in (400, 404):  # an invalid reference names no image either
            return None
        raise InfrastructureError(f"the Docker engine could not inspect {reference}: {e.explanation}") from e


class Container:
    """One container, created on enter and removed on exit, whatever happened in between.

    Verbs: start, logs (streamed into a tail), wait (with a timeout), kill.
    """

    def __init__(self, client: docker.DockerClient, image: str, command: list[str], *, display: str,
                 gpus: str | None = None, tail_lines: int = 40, **config: Any) -> None:
        self.client, self.image, self.command, self.config = client, image, command, config
        self.display, self.gpus = display, gpus
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.id: str | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> Container:
        try:
            created = self.client.api.create_container(
                self.image, self.command, **_split_create(self.client, self.config))
        except docker.errors.ImageNotFound as e:
            raise InfrastructureError(f"image {self.display} not found locally; build it with "
                                      f"`reproci images build NAME` or `docker pull {self.display}`") from e
        except docker.errors.APIError as e:
            raise start_error(self.display, e, self.gpus) from e
        except requests.exceptions.ConnectionError as e:
            raise InfrastructureError(f"lost the Docker engine while creating a container: {e}") from e
        self.id = created["Id"]
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def start(self) -> None:
        try:
            self.client.api.start(self.id)
        except docker.errors.APIError as e:
            raise start_error(self.display, e, self.gpus) from e
        self._reader = threading.Thread(target=self._stream, daemon=True)
        self._reader.start()

    def _stream(self) -> None:
        pending = b""
        try:
            for chunk in self.client.api.logs(self.id, stream=True, follow=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                self.tail.extend(line.decode("utf-8", "replace").rstrip() for line in lines)
        except Exception:  # noqa: BLE001 - the container went away; the tail is what we have
            pass
        if pending:
            self.tail.append(pending.decode("utf-8", "replace").rstrip())

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the container was still running after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                result = self.client.api.wait(self.id, timeout=max(1.0, min(left, 60.0)))
                break
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as e:
                if time.monotonic() < deadline and not _is_timeout(e):
                    raise InfrastructureError(f"lost the Docker engine while waiting for a container: {e}") from e
        if self._reader is not None:
            self._reader.join(timeout=5)
        return int(result.get("StatusCode", -1))

    def kill(self) -> None:
        try:
            self.client.api.kill(self.id)
        except docker.errors.APIError:
            pass  # already stopped

    def remove(self) -> None:
        if self.id is None:
            return
        try:
            self.client.api.remove_container(self.id, force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.APIError, requests.exceptions.ConnectionError):
            return  # left for the label sweep in DockerBackend.close
        self.id = None


def _is_timeout(e: BaseException) -> bool:
    return isinstance(e, requests.exceptions.ReadTimeout) or "timed out" in str(e).lower()


def _split_create(client: docker.DockerClient, config: dict[str, Any]) -> dict[str, Any]:
    """create_container keywords: host-config ones go into a HostConfig."""
    host_keys = {"mounts", "network_mode", "tmpfs", "shm_size", "device_requests", "cap_drop", "security_opt",
                 "init"}
    host = {k: v for k, v in config.items() if k in host_keys}
    rest = {k: v for k, v in config.items() if k not in host_keys}
    rest["host_config"] = client.api.create_host_config(**host)
    rest.setdefault("network_disabled", config.get("network_mode") == "none")
    return rest


# --- the backend ------------------------------------------------------------------------------

class DockerBackend(Backend):
    name = "docker"

    def __init__(self, options: Any) -> None:
        from .. import images

        self.options = options
        self.reference, entry = images.resolve(options.image)
        self.gpus: str | None = options.gpus or ("all" if options.device == "cuda" or (entry and entry.gpu) else None)
        self._requests = device_requests(self.gpus)
        self.session = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._live: dict[str, Container] = {}
        self._run_dirs: list[Path] = []
        self._plugin_binds: dict[PurePosixPath, Bind] = {}
        self.client = connect()
        try:
            attrs = inspect_image(self.client, self.reference)
            if attrs is None:
                hint = f"`reproci images build {entry.name}`" if entry else "`reproci images build NAME`"
                raise InfrastructureError(f"image {self.reference} not found locally; build it with {hint} "
                                          f"or `docker pull {self.reference}`")
            self.image_id: str = attrs["Id"]  # containers are made from the ID: a re-tag mid-run changes nothing
            self.digest = image_digest(attrs, self.reference)
            info = self.client.info()
            rootless = any("rootless" in str(s) for s in info.get("SecurityOptions") or [])
            self.user = container_user(os.getuid(), os.getgid(), rootless=rootless)
            self.toolchain = self._preflight()
        except BaseException:
            self.close()
            raise

    # Backend interface

    def image_info(self) -> dict[str, Any]:
        return {"name": self.options.image_name, "reference": self.reference, "digest": self.digest,
                "backend": "docker", "id": self.image_id, "torch": self.toolchain.get("torch"),
                "gpus": self.gpus}

    def prepare_spec(self, spec: WorkerSpec, run_dir: Path) -> WorkerSpec:
        from reference_models import REGISTRY

        run_dir = run_dir.resolve()
        if run_dir not in self._run_dirs:
            self._run_dirs.append(run_dir)
        out, binds = translate_spec(spec, run_dir, registry=tuple(REGISTRY))
        with self._lock:
            for b in binds:
                self._plugin_binds[b.target] = b
        return out

    def launch(self, spec: WorkerSpec, spec_file: Path, *, timeout: float) -> LaunchResult:
        spec_file = spec_file.resolve()
        run_dir = next((d for d in self._run_dirs if spec_file.is_relative_to(d)), spec_file.parent)
        with self._lock:
            binds = code_binds() + list(self._plugin_binds.values()) + [Bind(run_dir, RUN, read_only=False)]
        inner = container_path(spec_file, run_dir)
        labels = {"reproci.run_id": run_dir.name, "reproci.model": spec.model_name, "reproci.role": spec.role}
        t0 = time.monotonic()
        with self._container(["python3", "-m", "pipeline.worker", str(inner)], role="worker", labels=labels,
                             environment=environment(spec), working_dir=str(inner.parent),
                             mounts=[b.mount() for b in binds]) as c:
            c.start()
            code = c.wait(timeout)
            timed_out = code is None
            if timed_out:
                c.kill()
                code = c.wait(30) if c.id else None
        seconds = time.monotonic() - t0
        if code == WORKER_EXIT_MISSING:
            self._raise_if_missing_dependency(spec_file.parent / spec.output)
        return LaunchResult(returncode=-9 if code is None else code, seconds=seconds, timed_out=timed_out,
                            log_tail="\n".join(c.tail))

    def close(self) -> None:
        with self._lock:
            live = list(self._live.values())
        for c in live:
            c.remove()
        try:  # anything this backend created and did not get to record (Ctrl-C mid-create)
            for found in self.client.containers.list(all=True, filters={"label": f"reproci.session={self.session}"}):
                found.remove(force=True)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            pass
        self.client.close()

    # internals

    def _container(self, command: list[str], *, role: str, labels: dict[str, str], **config: Any) -> _Tracked:
        all_labels = {LABEL: role, "reproci.session": self.session, "reproci.pid": str(os.getpid()),
                      "reproci.image": self.reference, **labels}
        c = Container(self.client, self.image_id, command, display=self.reference, gpus=self.gpus,
                      labels=all_labels, user=self.user, network_mode="none", cap_drop=["ALL"],
                      security_opt=["no-new-privileges"], tmpfs={"/tmp": "rw,nosuid,nodev,mode=1777"},
                      shm_size="1g", device_requests=self._requests or None, **config)
        return _Tracked(self, c)

    def _preflight(self) -> dict[str, Any]:
        """One quick container up front: python3 there, torch and numpy findable, GPUs visible if asked for."""
        cuda = self.options.device == "cuda"
        env = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
        with self._container(["python3", "-c", _PREFLIGHT] + (["cuda"] if cuda else []), role="preflight",
                             labels={}, environment=env, working_dir="/tmp") as c:
            c.start()
            code = c.wait(PREFLIGHT_TIMEOUT_S)
            if code is None:
                raise InfrastructureError(f"image {self.reference} did not run `python3 -c ...` within "
                                          f"{PREFLIGHT_TIMEOUT_S:.0f} s; check that the engine is not overloaded")
        line = next((x for x in reversed(c.tail) if x.startswith("REPROCI-PREFLIGHT ")), None)
        if code == 127 or (line is None and any("not found" in x for x in c.tail)):
            raise InfrastructureError(f"image {self.reference} has no python3 on its PATH; reproci needs an image "
                                      "with python3, torch and numpy (e.g. `reproci images build cpu-torch2.13`)")
        if code != 0 or line is None:
            last = (list(c.tail) or ["(no output)"])[-1][:200]
            raise InfrastructureError(f"python3 in image {self.reference} failed a start-up check "
                                      f"(exit {code}): {last}")
        found: dict[str, Any] = json.loads(line.split(" ", 1)[1])
        if tuple(found["python"][:2]) < MIN_PYTHON:
            raise InfrastructureError(f"python3 in image {self.reference} is {'.'.join(map(str, found['python']))}; "
                                      f"the worker needs {'.'.join(map(str, MIN_PYTHON))} or newer")
        if found["missing"]:
            raise InfrastructureError(f"image {self.reference} has python3 but no {' or '.join(found['missing'])}; "
                                      "use an image with torch and numpy (e.g. `reproci images build cpu-torch2.13`)")
        if cuda and not found.get("cuda_devices"):
            raise InfrastructureError(f"--device cuda was asked for but torch in image {self.reference} sees no GPU; "
                                      "check --gpus, the NVIDIA driver and the NVIDIA Container Toolkit")
        return found

    def _raise_if_missing_dependency(self, record_file: Path) -> None:
        try:
            record = json.loads(record_file.read_text())
        except (OSError, json.JSONDecodeError):
            return
        if record.get("error_kind") == "missing-dependency":
            raise InfrastructureError(f"image {self.reference} cannot run the worker: {record.get('message')}; "
                                      "use an image with python3, torch and numpy")


class _Tracked:
    """A backend's container, known to close() while it exists."""

    def __init__(self, backend: DockerBackend, container: Container) -> None:
        self.backend, self.container = backend, container

    def __enter__(self) -> Container:
        c = self.container.__enter__()
        with self.backend._lock:
            self.backend._live[str(c.id)] = c
        return c

    def __exit__(self, *exc: object) -> None:
        cid = str(self.container.id)
        try:
            self.container.__exit__(*exc)
        finally:
            with self.backend._lock:
                self.backend._live.pop(cid, None)


def leftover_containers(label: str) -> list[str]:
    """IDs of containers, in any state, that carry ``label`` (``key`` or ``key=value``)."""
    return [c.id for c in connect().containers.list(all=True, filters={"label": label})]
