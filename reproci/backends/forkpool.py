"""The fork servers of one backend (``ForkServers``), by key, and the local backend's server
process (``local_server``); the protocol and its guarantees are in ``forking``."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Callable

from ..errors import how_ended
from .forking import ForkedRun, ForkServer, ServerFailed, kill_process_group
from .standing_fork_servers import standing_server

MAX_IDLE_SERVERS = 4  # servers kept for keys not in use (each holds torch's pages)


def local_server(python: str, env: dict[str, str], code_root: Path, spawner: ThreadPoolExecutor) -> ForkServer:
    """A server as a subprocess of this interpreter, started with ``env``."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # Started from the spawner's thread, which lives as long as the servers do: the
        # kernel's parent-death signal fires when the *thread* that forked a process ends.
        proc = spawner.submit(
            subprocess.Popen, [python, "-m", "reproci.worker.forkserver", "--fd", str(theirs.fileno())],
            env=env, cwd=str(code_root), pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True).result()
    finally:
        theirs.close()
    said: deque[str] = deque(maxlen=20)
    threading.Thread(target=_drain, args=(proc, said), daemon=True).start()  # never a full pipe

    def stop() -> None:
        kill_process_group(proc)

    def describe() -> str:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return f"it {how_ended(proc.returncode)}; its last output: {(list(said) or ['(none)'])[-1][:200]}"

    server = ForkServer(ours, stop=stop, describe=describe)
    server.proc = proc  # type: ignore[attr-defined]  # for the tests: the process itself
    return server


def _drain(proc: subprocess.Popen[bytes], said: deque[str]) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        said.append(raw.decode("utf-8", "replace").rstrip())


Maker = Callable[[], ForkServer]


class ForkServers:
    """The servers of one backend, by key (the launch environment, and for containers what
    else the server's container fixes), each started as first needed by its ``make``; a
    failure is remembered, so that a key costs at most one failed start."""

    def __init__(self, standing: Path | None = None) -> None:
        self.standing = standing  # a folder of standing servers shared across invocations (``standing``)
        self._servers: OrderedDict[tuple, ForkServer] = OrderedDict()
        self._failed: dict[tuple, str] = {}
        self._retired: list[ForkServer] = []
        self._starting: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reproci-fork-servers")
        self.warned: set[str] = set()
        self.closed = False

    def local(self, python: str, env: dict[str, str], code_root: Path) -> tuple[tuple, Maker]:
        """The key and maker of the local server for ``env``: a standing one where a folder is set."""
        if self.standing is not None:
            folder = self.standing
            return tuple(sorted(env.items())), lambda: standing_server(python, env, code_root, folder)
        return tuple(sorted(env.items())), lambda: local_server(python, env, code_root, self._spawner)

    def server(self, key: tuple, make: Maker) -> ForkServer:
        """The running server for ``key`` (starting it), counted as in use until its run
        ends; or raise ServerFailed."""
        with self._lock:
            starting = self._starting.setdefault(key, threading.Lock())
        with starting:  # runs that need the same new server wait for its one start
            with self._lock:
                if key in self._failed:
                    raise ServerFailed(self._failed[key])
                server = self._servers.get(key)
                if server is not None and server.dead is None:
                    self._servers.move_to_end(key)
                    server.hold(1)
                    return server
                if self.closed:
                    raise ServerFailed("the run was interrupted")
            try:
                server = make()
            except (ServerFailed, OSError) as e:
                with self._lock:
                    self._failed[key] = str(e)
                raise ServerFailed(str(e)) from None
            with self._lock:
                if self.closed:
                    server.close()
                    raise ServerFailed("the run was interrupted")
                self._servers[key] = server
                server.hold(1)
                self._evict()
            return server

    def start(self, key: tuple, make: Maker, spec_file: Path | PurePosixPath, cwd: Path | PurePosixPath) -> ForkedRun:
        """Fork one run (paths as the server sees them) from the server for ``key``; raise
        ServerFailed if none can."""
        server = self.server(key, make)
        try:
            return server.fork(spec_file, cwd)
        except ServerFailed as e:  # gone, or refusing: this key's runs start fresh from now on
            server.hold(-1)
            with self._lock:
                self._failed[key] = str(e)
                if self._servers.get(key) is server:
                    del self._servers[key]
                self._retired.append(server)  # closed with the rest: its live runs end first
            raise
        except BaseException:
            server.hold(-1)
            raise

    def _evict(self) -> None:
        idle = [k for k, s in self._servers.items() if s.active == 0]
        for k in idle[:max(0, len(idle) - MAX_IDLE_SERVERS)]:
            self._servers.pop(k).close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            servers = list(self._servers.values()) + self._retired
            self._servers.clear()
            self._retired = []
        for s in servers:
            s.close()
        self._spawner.shutdown(wait=False)
