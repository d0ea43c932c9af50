"""A container as a context manager, over the engine's verbs (no SDK here)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from ..errors import InfrastructureError
from .base import OnStep, take_line
from .docker_engine import CreateConfig, Engine

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


class Container:
    """One container, created on enter and removed on exit, whatever happened in between.

    Verbs: start, wait (with a timeout), kill, at_process_limit, oom_killed, remove. Its output is streamed into
    ``tail`` (the last lines) from the moment it starts. ``config`` holds the engine's
    create keywords (labels, user, mounts as binds, environment, ...).
    """

    def __init__(self, engine: Engine, image: str, command: list[str], *, display: str,
                 gpus: str | None = None, tail_lines: int = 40, on_step: OnStep | None = None,
                 **config: Unpack[CreateConfig]) -> None:
        self.engine, self.image, self.command, self.config = engine, image, command, config
        self.display, self.gpus = display, gpus  # how errors name the image, and the --gpus asked for
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.on_step = on_step  # the worker's step progress lines (never in the tail)
        self.id: str | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> Container:
        self.id = self.engine.create(self.image, self.command, display=self.display, gpus=self.gpus,
                                     config=self.config)
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def start(self) -> None:
        self.engine.start(self._id, display=self.display, gpus=self.gpus)
        self._reader = threading.Thread(target=self._stream, daemon=True)
        self._reader.start()

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the container was still running after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                code = self.engine.wait(self._id, max(1.0, min(left, 60.0)))
            except InfrastructureError:
                if time.monotonic() < deadline:
                    raise
                continue  # the engine went away as the time ran out: a timeout like any other
            if code is not None:
                break
        if self._reader is not None:
            self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        self.engine.kill(self._id)

    def at_process_limit(self, limit: int) -> bool:
        """Whether the running container has as many processes and threads as ``limit`` (or the
        limit the engine reports) allows: a fork bomb that tries again when refused waits there."""
        now = self.engine.processes(self._id)
        return now is not None and now[0] >= (now[1] or limit)

    def oom_killed(self) -> bool:
        """Whether the engine says the container's memory limit killed a process of it."""
        return self.engine.oom_killed(self._id)

    def remove(self) -> None:
        if self.id is not None and self.engine.remove(self.id):
            self.id = None  # else left for the label sweep in DockerBackend.close

    @property
    def _id(self) -> str:
        if self.id is None:
            raise RuntimeError("the container is not created (use it as a context manager) or already removed")
        return self.id

    def _stream(self) -> None:
        pending = b""
        try:
            for chunk in self.engine.logs(self._id):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    take_line(line.decode("utf-8", "replace").rstrip(), self.tail, self.on_step)
        except Exception:  # noqa: BLE001 - the container went away; the tail is what we have
            pass
        if pending:
            take_line(pending.decode("utf-8", "replace").rstrip(), self.tail, self.on_step)
