"""The backend interface."""

from __future__ import annotations

import abc
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, TypedDict

from ..errors import WorkerFailed
from ..results import Image
from ..worker.process import progress
from ..worker.process.spec import WorkerSpec

# The directory holding reproci's own folder: a checkout's root (with docker/ beside reproci/,
# which an editable install maps to the name reproci), or an install's site-packages (with reproci/).
CODE_ROOT = Path(__file__).resolve().parents[2]


class ManifestImage(Protocol):
    """What a backend reads of a manifest entry (reproci.images.ImageEntry)."""

    @property
    def name(self) -> str: ...

    @property
    def gpu(self) -> bool: ...


OnStep = Callable[[int, int], None]
OnStart = Callable[[float | None], None]


def take_line(line: str, tail: deque[str], on_step: OnStep | None) -> None:
    """One line of a worker's output: a step progress line goes to ``on_step`` (and never
    into the tail, which keeps the last words for an error), any other line to the tail."""
    step = progress.parse(line)
    if step is None:
        tail.append(line)
    elif on_step is not None:
        on_step(*step)


class BackendOptions(Protocol):
    """What a backend reads of the run options (reproci.settings.options.RunOptions, where the
    image is resolved against the manifest once)."""

    @property
    def backend(self) -> str: ...  # "local" or "docker"

    @property
    def image_name(self) -> str: ...  # the golden name, recorded as the image's name

    @property
    def image_reference(self) -> str | None: ...  # what the engine runs; None on the local backend

    @property
    def image_entry(self) -> ManifestImage | None: ...  # the manifest's entry for the image, if it has one

    @property
    def device(self) -> str: ...

    @property
    def gpus(self) -> str | None: ...

    @property
    def fork_server(self) -> bool | None: ...  # fork runs from preloaded servers; None: the backend's default

    @property
    def fork_servers(self) -> Path | None: ...  # a folder of standing servers, shared across invocations

    @property
    def memory(self) -> int: ...  # docker: a container's memory limit in bytes

    @property
    def pids_limit(self) -> int: ...  # docker: a container's processes and threads


# How a run's process started: forked from a server ("forked", "in": "container" for a server in a
# container), a fresh interpreter ("fresh", and why it was not forked) or a container ("container").
Launch = TypedDict("Launch", {"mode": str, "why": str | None, "in": str}, total=False)


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    seconds: float
    timed_out: bool = False
    log_tail: str = ""  # last lines of the worker's stderr/stdout
    launch: Launch | None = None  # how the process started: {"mode": "forked" | "fresh" | "container", ...}
    limit: str | None = None  # the one line naming a container limit that stopped the run (docker_spec.limit_hit)


class Backend(abc.ABC):
    """Runs worker specs, each in a fresh process with the determinism environment set
    before the interpreter starts."""

    name: str = "base"
    closed: bool = False  # set once the backend is left: no new worker may start

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True
        self.close()

    def close(self) -> None:  # noqa: B027 - not abstract: a backend that holds nothing has nothing to release
        """Release everything (processes, containers). Safe to call twice."""

    def refuse_if_closed(self, spec: WorkerSpec) -> None:
        """After the backend is left (Ctrl-C) no worker may start: start nothing, write nothing."""
        if self.closed:
            raise WorkerFailed(f"run {spec.role} not started: the run was interrupted", kind="interrupted")

    @abc.abstractmethod
    def image_info(self) -> Image:
        """{"name", "reference", "digest", "backend"} of what the workers run in."""

    def prepare_spec(self, spec: WorkerSpec, run_dir: Path) -> WorkerSpec:
        """Rewrite host paths in a spec to the paths the worker sees (identity by default)."""
        return spec

    @abc.abstractmethod
    def launch(self, spec: WorkerSpec, spec_file: Path, *, timeout: float,
               on_step: OnStep | None = None, on_start: OnStart | None = None) -> LaunchResult:
        """Run ``python -m reproci.worker spec_file`` to completion or timeout; refused (see
        ``refuse_if_closed``) once the backend is left, even while the run was starting.
        ``on_step(step, stop)`` hears the worker's step progress lines as they come; ``on_start(at)``
        is called as the worker's process really starts (after any fork server's or container's
        start), ``at`` the ``time.monotonic()`` at which it did where the run said (else None: now)."""
