"""The Docker backend: every worker run in a fresh container of one image.

A container runs as the invoking user (files it writes are theirs), with no network,
no capabilities, no privilege gain, a read-only root filesystem, a memory and a process
limit (``--memory``, ``--pids-limit``: a run stopped by one is an ERROR that names it), and an
environment of the determinism variables, PYTHONPATH and HOME only: nothing is inherited
from the host (``docker_spec`` says what is mounted where).
Every container carries the labels ``reproci.session``, ``reproci.host`` and ``reproci.pid``
and is removed on success, failure, timeout and Ctrl-C; ``close`` also sweeps the session's
label for a container it did not get to record. A reproci killed by SIGKILL can do none of
that: the next run on the same host removes the containers whose reproci process is gone.

Before any worker, a preflight container checks the image: python3 there, torch and
numpy findable, GPUs visible when asked for. The image comes resolved in the options
(``reproci.settings.options.build`` looks the manifest up once).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict

from ..errors import InfrastructureError
from ..results import Image
from ..worker import run_record
from ..worker.process.exitcodes import EXIT_MISSING_DEPENDENCY
from ..worker.process.spec import WorkerSpec
from .base import Backend, BackendOptions, LaunchResult, OnStart, OnStep
from .container import Container
from .docker_engine import Engine, device_requests, image_digest, no_python3_error
from .docker_forking import server_for
from .docker_spec import (
    RUN,
    Bind,
    Limits,
    code_binds,
    container_config,
    container_path,
    container_user,
    environment,
    limit_hit,
    translate_spec,
    worker_command,
)
from .forking import ServerFailed, follow, fresh_reason
from .forkpool import ForkServers

LABEL = "reproci"  # every container: reproci=worker|preflight
MIN_PYTHON = (3, 10)
PREFLIGHT_TIMEOUT_S = 120.0
CREATE_WAIT_S = 30.0  # how long close() waits for a create the engine has not answered

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


class _Found(TypedDict):
    """What the preflight container found of the image's python3 (its line's JSON). The versions
    of torch and numpy are there where neither is missing, as in every image it accepts."""

    python: list[int]  # sys.version_info[:3]
    missing: list[str]  # of torch and numpy, those it cannot import
    torch: str | None
    numpy: str | None


class Preflight(_Found, total=False):
    """What the preflight container found (``preflight_verdict``)."""

    cuda_devices: int  # asked with --device cuda: the GPUs torch sees


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, options: BackendOptions) -> None:
        if options.image_reference is None:
            raise ValueError("the Docker backend needs options.image_reference; make the options with options.build")
        self.options = options
        self.reference: str = options.image_reference
        entry = options.image_entry
        self.gpus = requested_gpus(options)
        self._requests = device_requests(self.gpus)
        self.limits = Limits(memory=options.memory, pids=options.pids_limit)
        self.session = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._live: dict[str, Container] = {}
        self._creating = threading.Condition(self._lock)  # notified as each create in flight ends
        self._in_flight = 0  # creates the engine has not answered yet: close() waits for them
        self._run_dirs: list[Path] = []
        self._plugin_binds: dict[PurePosixPath, Bind] = {}
        self.servers = ForkServers() if options.fork_server is True else None  # opt-in: docker_forking.py
        self.engine = Engine.connect()
        self.sweep_orphans()
        try:
            attrs = self.engine.inspect_image(self.reference)
            if attrs is None:
                hint = f"`reproci images build {entry.name if entry is not None else 'NAME'}`"
                raise InfrastructureError(f"image {self.reference} not found locally; build it with {hint} "
                                          f"or `docker pull {self.reference}`")
            self.image_id: str = attrs["Id"]  # containers are made from the ID: a re-tag mid-run changes nothing
            self.digest = image_digest(attrs, self.reference)
            self.user = container_user(os.getuid(), os.getgid(), rootless=self.engine.rootless())
            self.toolchain = self._preflight()
        except BaseException:
            self.close()
            raise

    # Backend interface

    def image_info(self) -> Image:
        return {"name": self.options.image_name, "reference": self.reference, "digest": self.digest,
                "backend": "docker", "id": self.image_id, "torch": self.toolchain["torch"],
                "gpus": self.gpus}

    def prepare_spec(self, spec: WorkerSpec, run_dir: Path) -> WorkerSpec:
        from ..reference_models import REGISTRY

        run_dir = run_dir.resolve()
        if run_dir not in self._run_dirs:
            self._run_dirs.append(run_dir)
        out, binds = translate_spec(spec, run_dir, registry=tuple(REGISTRY))
        with self._lock:
            for b in binds:
                self._plugin_binds[b.target] = b
        return out

    def launch(self, spec: WorkerSpec, spec_file: Path, *, timeout: float,
               on_step: OnStep | None = None, on_start: OnStart | None = None) -> LaunchResult:
        self.refuse_if_closed(spec)
        spec_file = spec_file.resolve()
        run_dir = next((d for d in self._run_dirs if spec_file.is_relative_to(d)), spec_file.parent)
        with self._lock:
            binds = code_binds() + list(self._plugin_binds.values()) + [Bind(run_dir, RUN, read_only=False)]
        inner = container_path(spec_file, run_dir)
        labels = {"reproci.run_id": run_dir.name, "reproci.model": spec.model_name, "reproci.role": spec.role}
        t0 = time.monotonic()
        if self.servers is not None and spec.script is None:  # a script's command starts its own interpreter
            forked = self._forked(spec, binds, run_dir, inner, timeout, on_step, on_start)
            if forked is not None:
                return forked
        with self._container(worker_command(spec, inner), role="worker", labels=labels,
                             environment=environment(spec), working_dir=str(inner.parent), mounts=binds,
                             on_step=on_step) as c:
            self.refuse_if_closed(spec)  # left while the container was made: close() may not have seen it
            c.start()
            if on_start is not None:
                on_start(None)
            code = c.wait(timeout)
            timed_out, at_limit = code is None, code is None and c.at_process_limit(self.limits.pids)  # before the kill
            if timed_out:
                c.kill()
                code = c.wait(30) if c.id else None
            limit = limit_hit(None if timed_out else code, not timed_out and c.oom_killed(), list(c.tail), self.limits,
                              timed_out_at_process_limit=at_limit)
        seconds = time.monotonic() - t0
        if code == EXIT_MISSING_DEPENDENCY:
            self._raise_if_missing_dependency(spec_file.parent / spec.output)
        return LaunchResult(returncode=-9 if code is None else code, seconds=seconds, timed_out=timed_out,
                            log_tail="\n".join(c.tail), launch={"mode": "container"}, limit=limit)

    def _forked(self, spec: WorkerSpec, binds: list[Bind], run_dir: Path, inner: PurePosixPath, timeout: float,
                on_step: OnStep | None, on_start: OnStart | None) -> LaunchResult | None:
        """--fork-server: the run forked in its model's server container, or None where it
        cannot be (it then gets a container of its own)."""
        assert self.servers is not None
        env = environment(spec)
        if fresh_reason(env, world_size=spec.world_size) is not None:
            return None
        t0 = time.monotonic()
        try:
            run = self.servers.start(*server_for(self._container, spec.model_name, env, binds, run_dir), inner,
                                     inner.parent)
        except ServerFailed as e:
            why = f"the fork server container failed: {e}"
            if why not in self.servers.warned:
                self.servers.warned.add(why)
                print(f"warning: {why}; these runs get a container each", file=sys.stderr)
            return None
        if on_start is not None:
            on_start(None)
        code, timed_out, tail = follow(run, timeout, on_step)
        return LaunchResult(returncode=code, seconds=time.monotonic() - t0, timed_out=timed_out, log_tail=tail,
                            launch={"mode": "forked", "in": "container"})

    def close(self) -> None:
        if self.servers is not None:
            self.servers.close()
        self._remove_live()
        with self._creating:  # a run's thread may be creating one now (Ctrl-C mid-create): this process would exit
            self._creating.wait_for(lambda: self._in_flight == 0, timeout=CREATE_WAIT_S)  # before it removed it
        self._remove_live()
        self.engine.remove_labelled(f"reproci.session={self.session}")  # any not recorded
        self.engine.close()

    def _remove_live(self) -> None:
        with self._lock:
            live = list(self._live.values())
        for c in live:
            c.remove()

    def sweep_orphans(self) -> list[str]:
        """Remove the containers of this host's reproci processes that are gone; say so."""
        from ..results import alive

        gone = [(cid, labels) for cid, labels in self.engine.labels_of(f"reproci.host={socket.gethostname()}")
                if str(labels.get("reproci.pid", "")).isdigit() and not alive(int(labels["reproci.pid"]))]
        for cid, labels in gone:
            self.engine.remove(cid)
            print(f"notice: removed container {cid[:12]} ({labels.get('reproci.model', '?')} run "
                  f"{labels.get('reproci.role', labels.get(LABEL, '?'))}): its reproci process {labels['reproci.pid']} "
                  "is gone", file=sys.stderr)
        return [cid for cid, _ in gone]

    # internals

    def _container(self, command: list[str], *, role: str, labels: dict[str, str], **config: Any) -> _Tracked:
        all_labels = {LABEL: role, "reproci.session": self.session, "reproci.pid": str(os.getpid()),
                      "reproci.host": socket.gethostname(),
                      "reproci.image": self.reference, **labels}
        c = Container(self.engine, self.image_id, command, display=self.reference, gpus=self.gpus,
                      labels=all_labels, user=self.user, **container_config(self.limits),
                      device_requests=self._requests or None, **config)
        return _Tracked(self, c)

    def _preflight(self) -> Preflight:
        """One quick container up front; what it found (python, torch, numpy versions)."""
        cuda = self.options.device == "cuda"
        env = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
        with self._container(["python3", "-c", _PREFLIGHT] + (["cuda"] if cuda else []), role="preflight",
                             labels={}, environment=env, working_dir="/tmp") as c:
            c.start()
            code = c.wait(PREFLIGHT_TIMEOUT_S)
        return preflight_verdict(self.reference, code, list(c.tail), cuda=cuda)

    def _raise_if_missing_dependency(self, record_file: Path) -> None:
        try:
            record = run_record.read(record_file)
        except (OSError, ValueError):  # none, not JSON, or another version's record
            return
        if isinstance(record, run_record.FailedRun) and record.error_kind == "missing-dependency":
            raise InfrastructureError(f"image {self.reference} cannot run the worker: {record.message}; "
                                      "use an image with python3, torch and numpy")


def requested_gpus(options: BackendOptions) -> str | None:
    """``--gpus`` as given; else all GPUs for ``--device cuda`` or a manifest image marked ``gpu``; else none."""
    entry = options.image_entry
    if options.gpus:
        return options.gpus
    return "all" if options.device == "cuda" or (entry is not None and entry.gpu) else None


def preflight_verdict(reference: str, code: int | None, tail: list[str], *, cuda: bool) -> Preflight:
    """What the preflight container found, or the InfrastructureError that says what the image lacks."""
    if code is None:
        raise InfrastructureError(f"image {reference} did not run `python3 -c ...` within "
                                  f"{PREFLIGHT_TIMEOUT_S:.0f} s; check that the engine is not overloaded")
    line = next((x for x in reversed(tail) if x.startswith("REPROCI-PREFLIGHT ")), None)
    if code == 127 or (line is None and any("not found" in x for x in tail)):
        raise no_python3_error(reference)
    if code != 0 or line is None:
        last = (tail or ["(no output)"])[-1][:200]
        raise InfrastructureError(f"python3 in image {reference} failed a start-up check (exit {code}): {last}")
    found: Preflight = json.loads(line.split(" ", 1)[1])
    if tuple(found["python"][:2]) < MIN_PYTHON:
        raise InfrastructureError(f"python3 in image {reference} is {'.'.join(map(str, found['python']))}; "
                                  f"the worker needs {'.'.join(map(str, MIN_PYTHON))} or newer")
    if found["missing"]:
        raise InfrastructureError(f"image {reference} has python3 but no {' or '.join(found['missing'])}; "
                                  "use an image with torch and numpy (e.g. `reproci images build cpu-torch2.13`)")
    if cuda and not found.get("cuda_devices"):
        raise InfrastructureError(f"--device cuda was asked for but torch in image {reference} sees no GPU; "
                                  "check --gpus, the NVIDIA driver and the NVIDIA Container Toolkit")
    return found


class _Tracked:
    """A backend's container, known to close() while it exists.

    The engine's create is asked from a thread of its own: Ctrl-C lands in the main thread (the
    preflight's create is made there), and a KeyboardInterrupt raised inside the request would
    leave the engine making a container whose ID never came back, after close() had swept the
    session's label. The thread gets the answer whatever the main thread does, records the
    container, and only then lets close() go on (it waits for the creates in flight)."""

    def __init__(self, backend: DockerBackend, container: Container) -> None:
        self.backend, self.container = backend, container

    def __enter__(self) -> Container:
        b = self.backend
        with b._lock:
            b._in_flight += 1
        made: Future[Container] = Future()
        threading.Thread(target=self._create, args=(made,), daemon=True, name="reproci-create").start()
        return made.result()

    def _create(self, made: Future[Container]) -> None:
        b = self.backend
        try:
            c = self.container.__enter__()
            with b._lock:
                b._live[str(c.id)] = c
            made.set_result(c)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread as it came
            made.set_exception(e)
        finally:
            with b._creating:
                b._in_flight -= 1
                b._creating.notify_all()

    def __exit__(self, *exc: object) -> None:
        cid = str(self.container.id)
        try:
            self.container.__exit__(*exc)
        finally:
            with self.backend._lock:
                self.backend._live.pop(cid, None)
