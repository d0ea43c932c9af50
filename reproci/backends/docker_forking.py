"""``--image ... --fork-server``: worker runs forked from a preloaded server inside a container.

Off by default: one container per run stays the default. With it, each model gets a
long-lived server container per launch environment (and set of mounts), started as that
model's first run needs it; every run is forked there from the server, which imported torch
once (``reproci.worker.forkserver``). Measured on this project's machine
(``benchmarks/container_overhead.py``): a container start costs about 0.2 s, a fresh
interpreter's imports about 3 s, so a forked run saves most of a run's fixed cost.

What the runs of one model share, and what they do not: each is still its own process, forked
before any device or op was touched, with its own allocator and, on a GPU, its own CUDA
context (created after the fork). They share the container: its ``/tmp`` (HOME), and so any
cache a run writes there (torch.compile's inductor and Triton caches) is seen by the model's
later runs. Runs of different models never share a container.

The launcher reaches the server through a Unix socket in a host directory mounted at
``/reproci/sock`` (so a local engine only; a remote ``DOCKER_HOST`` falls back to a container
per run, with a warning), passes each run's output pipe to it, and asks it to kill a run
(``{"kill": PID}``): the pids in the container are not this host's.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from .docker_spec import RUN, Bind
from .forking import ForkServer, ServerFailed
from .forkpool import Maker

SOCK = PurePosixPath("/reproci/sock")
CONNECT_TIMEOUT_S = 60.0  # the server binds its socket before it imports torch: this is the interpreter's start


def server_for(make_container: Callable[..., Any], model: str, env: dict[str, str], binds: list[Bind],
               run_dir: Path) -> tuple[tuple, Maker]:
    """The key and maker of the server container for one model's runs with ``env`` and
    ``binds``; ``make_container`` makes a tracked container (DockerBackend._container)."""
    key = ("docker", model, tuple(sorted(env.items())),
           tuple(sorted((str(b.source), str(b.target), b.read_only) for b in binds)))

    def make() -> ForkServer:
        sock_dir = Path(tempfile.mkdtemp(prefix="reproci-fork-"))
        tracked = make_container(
            ["python3", "-m", "reproci.worker.forkserver", "--listen", str(SOCK / "control")], role="fork-server",
            labels={"reproci.run_id": run_dir.name, "reproci.model": model, "reproci.role": "fork-server"},
            environment=env, working_dir=str(RUN), mounts=[*binds, Bind(sock_dir, SOCK, read_only=False)])
        container = tracked.__enter__()

        def stop() -> None:
            tracked.__exit__(None, None, None)
            shutil.rmtree(sock_dir, ignore_errors=True)

        def describe() -> str:
            return (list(container.tail) or ["(no output)"])[-1][:200]

        try:
            container.start()
            return ForkServer(_connect(sock_dir / "control"), stop=stop, describe=describe, kill_by_message=True)
        except BaseException:
            stop()
            raise
    return key, make


def _connect(path: Path) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise ServerFailed(f"the server container did not open {SOCK / 'control'} within {CONNECT_TIMEOUT_S:g} s")
        time.sleep(0.02)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(str(path))
    except OSError as e:
        s.close()
        raise ServerFailed(f"cannot reach the server container's socket ({e}): a remote engine?") from None
    return s
