"""Standing fork servers: one preloaded server per launch environment, shared by every reproci
invocation that launches with that environment, where ``REPROCI_FORK_SERVERS`` names a folder.

A server's start (importing torch and what every run imports: about 2 s on a CPU) is then paid
once, not by every ``reproci run``: the next invocation's first run forks at once. A server
stands at ``FOLDER/<key>.sock``, where the key is a digest of everything that makes what a run
would see differ: the interpreter, the whole launch environment (but the launcher's pid), the
worker's code (each file's size and modification time) and the folders on the interpreter's
import path (a package installed or removed changes its folder), so a server never serves a
run that a fresh interpreter would start differently. It outlives the invocation that started
it, kills a launcher's runs as soon as that launcher's socket closes (it ended, or was killed),
and ends after ``IDLE_S`` seconds unused. Two invocations that need the same new server start
it once: the start happens under a lock file beside the socket.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import how_ended
from ..worker.process.forks import IDLE_END
from .forking import READY_TIMEOUT_S, ForkServer, ServerFailed

IDLE_S = 600.0  # a standing server unused this long ends
MAX_SOCKET_PATH = 100  # a Unix socket's path must fit in sun_path (108 bytes on Linux)
PACKAGE = Path(__file__).resolve().parents[1]  # reproci's own folder (its worker is what a server preloads)


def code_stamp() -> list[tuple[str, int, int]]:
    """Each file of the worker package (and the package's ``__init__``): name, size, mtime."""
    files = [PACKAGE / "__init__.py", *sorted((PACKAGE / "worker").rglob("*.py"))]
    return [(str(f.relative_to(PACKAGE)), st.st_size, st.st_mtime_ns) for f in files for st in (f.stat(),)]


def install_stamp(env: dict[str, str]) -> list[tuple[str, int]]:
    """The modification times of the folders a server imports from: this interpreter's path
    (not its first entry, this command's own folder: a run puts its own there) and the
    environment's ``PYTHONPATH``."""
    folders = [*sys.path[1:], *env.get("PYTHONPATH", "").split(os.pathsep)]
    return [(f, os.stat(f).st_mtime_ns) for f in dict.fromkeys(folders) if f and os.path.isdir(f)]


def socket_path(folder: Path, python: str, env: dict[str, str], code_root: Path) -> Path:
    """Where the server for this interpreter, environment and code stands."""
    identity = [os.path.realpath(python), sorted(env.items()), str(code_root), code_stamp(), install_stamp(env)]
    return folder / f"{hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:20]}.sock"


def standing_server(python: str, env: dict[str, str], code_root: Path, folder: Path,
                    idle_s: float = IDLE_S) -> ForkServer:
    """A connection to the standing server for ``env`` in ``folder``, starting the server
    if none answers there; raise ServerFailed if none can start (runs then start fresh)."""
    env = {k: v for k, v in env.items() if k != "REPROCI_PARENT_PID"}  # a server outlives its launcher
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise ServerFailed(f"REPROCI_FORK_SERVERS={folder} cannot be made ({e.strerror}): name a folder this user "
                           "can write, or unset it") from None
    mode = folder.stat()
    if mode.st_uid != os.getuid() or mode.st_mode & 0o022:  # a server there runs whatever it is asked to
        raise ServerFailed(f"REPROCI_FORK_SERVERS={folder} is not this user's alone (another user could stand a "
                           "server there): name a folder only this user can write")
    path = socket_path(folder, python, env, code_root)
    if len(str(path)) > MAX_SOCKET_PATH:
        raise ServerFailed(f"REPROCI_FORK_SERVERS={folder} is too long a path for a Unix socket; name a shorter folder")
    for attempt in (1, 2):
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one start per key, however many invocations need it now
            control = _connect(path) or _start(python, env, code_root, path, idle_s)
        try:
            return ForkServer(control, stop=lambda: None, describe=lambda: _last_words(path))
        except ServerFailed as e:  # connected just as it ended unused: the next one is started
            if attempt == 2 or str(e) != IDLE_END:
                raise
    raise AssertionError("unreachable")


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def _start(python: str, env: dict[str, str], code_root: Path, path: Path, idle_s: float) -> socket.socket:
    """Start a server at ``path`` (a dead one's socket removed first) and connect to it."""
    path.unlink(missing_ok=True)
    with open(path.with_suffix(".log"), "ab") as log:
        proc = subprocess.Popen([python, "-m", "reproci.worker.forkserver", "--stand", str(path), f"{idle_s:g}"],
                                env=env, cwd=str(code_root), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        control = _connect(path)
        if control is not None:
            return control
        if proc.poll() is not None:
            raise ServerFailed(f"the standing fork server {how_ended(proc.returncode)}: {_last_words(path)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise ServerFailed(f"the standing fork server did not listen within {READY_TIMEOUT_S:g} s")
        time.sleep(0.01)


def _last_words(path: Path) -> str:
    try:
        lines = path.with_suffix(".log").read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return (lines or ["(no output)"])[-1][:200]
