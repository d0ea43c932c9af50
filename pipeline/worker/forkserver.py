"""``python -m reproci.worker.forkserver --fd FD | --listen PATH``: a preloaded server that
forks worker runs.

Started by the local backend once per distinct launch environment, with exactly the
environment a fresh worker would get (``PYTHONHASHSEED``, the thread variables,
``CUBLAS_WORKSPACE_CONFIG``, the CPU ISA caps: whatever is read as the interpreter or a
library starts). It imports what every run imports (torch, numpy, the optimizer machinery
that pulls in ``torch._dynamo``, this package), touches no device, runs no op, sends
``{"ready": true}`` (or why not) on its control socket (AF_UNIX, SOCK_SEQPACKET: the
descriptor ``FD``, or the first connection to ``PATH``), then waits there for requests.

A request is one message: ``{"spec": PATH, "cwd": DIR}`` with two descriptors, a socket on
which this run's status is reported and the write end of the pipe that becomes the run's
stdout and stderr. The server forks; the child makes itself a session leader (a process group
the launcher can kill whole), takes the pipe as fds 1 and 2 and ``/dev/null`` as 0, reseeds
what Python and numpy seed from the OS at start, reports ``{"pid": N}``, and runs
``python -m reproci.worker PATH`` in place (``runpy``), exiting as that interpreter would.
The server reports ``{"status": CODE}`` (a negative CODE: killed by that signal) when the
child ends, or ``{"refused": WHY}`` when it will not fork. ``{"kill": PID}`` kills a run's
process group (a launcher outside the server's pid namespace cannot).

It never forks a process that holds a second thread or a CUDA context: it checks both before
every fork and refuses (the launcher then starts a fresh process). It dies with its launcher
(``die_with_parent``), and its children die with it.

Standard library, torch and numpy only: like the rest of the worker.
"""

from __future__ import annotations

import gc
import json
import os
import random
import runpy
import selectors
import signal
import socket
import sys
import threading
from typing import Any

# torch._inductor.config: torch.use_deterministic_algorithms imports it (seconds, on a CPU)
PRELOAD = ("torch", "numpy", "torch.optim", "torch._dynamo", "torch._inductor.config", "torch.utils.data",
           "torch.distributed",
           "reproci.worker.train", "reproci.worker.audit.audit", "reproci.worker.audit.oprecord")
EXIT_SETUP = 70  # the child could not be set up (no run started): the launcher starts a fresh process


def thread_count() -> int:
    """Threads of this process, as the kernel counts them (OpenMP, BLAS and CUDA threads too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def unsafe() -> str | None:
    """Why this process must not fork now, or None. A fork copies only the calling thread:
    a pool thread's locks would be held for ever in the child, and a CUDA context cannot
    cross a fork."""
    n = thread_count()
    if n > 1 or threading.active_count() > 1:
        return f"the server holds {n} threads"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the server holds a CUDA context"
    return None


def preload() -> None:
    """Import what every run imports, and read what cannot change while the server lives
    (the installed packages)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from .process import envinfo

    envinfo.packages()


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass  # the launcher stopped listening for this run: nothing to tell


class Server:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.runs: dict[int, socket.socket] = {}  # child pid -> its status socket
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.selector = selectors.DefaultSelector()

    def serve(self) -> dict[str, Any] | None:
        """Fork runs until the launcher closes the control socket (returns None), or, in a
        forked child, return its request."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the fd
        self.selector.register(self.control, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.control:
                    try:
                        message, fds, _flags, _addr = socket.recv_fds(self.control, 1 << 16, 2)
                    except InterruptedError:
                        continue
                    if not message:
                        return None  # the launcher is done: children die with this process
                    request = json.loads(message)
                    if "kill" in request:
                        self._kill(int(request["kill"]))
                        continue
                    request = self._fork(request, fds)
                    if request is not None:
                        return request
                else:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._reap()

    def _fork(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any] | None:
        status = socket.socket(fileno=fds[0])
        out = fds[1]
        why = unsafe()
        pid = -1
        if why is None:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as e:
                why = f"fork failed: {e}"
        if why is not None:
            _send(status, {"refused": why})
            status.close()
            os.close(out)
            return None
        if pid == 0:
            self._become_child(status, out)
            return {**request, "status": status}
        os.close(out)
        self.runs[pid] = status
        return None

    def _become_child(self, status: socket.socket, out: int) -> None:
        """Drop everything of the server's: its signal handling, sockets and pipes."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        self.control.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for s in self.runs.values():
            s.close()
        self.runs.clear()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)

    def _kill(self, pid: int) -> None:
        """A run's whole process group, asked for by a launcher that cannot see this pid."""
        if pid in self.runs:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _reap(self) -> None:
        while self.runs:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            sock = self.runs.pop(pid, None)
            if sock is not None:
                _send(sock, {"status": os.waitstatus_to_exitcode(raw)})
                sock.close()


def run_child(request: dict[str, Any]) -> int:
    """In the forked child: become what ``python -m reproci.worker SPEC`` run in ``cwd``
    would be at its start, tell the launcher the pid, and run the worker."""
    from .__main__ import die_with_parent

    status: socket.socket = request["status"]
    try:
        die_with_parent()  # this server is the parent now (REPROCI_PARENT_PID names it)
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
        random.seed()  # as a fresh interpreter does, from the OS
        sys.modules["numpy"].random.seed()
        if request.get("blas_threads"):  # the run's BLAS threads, started here, after the fork
            from .process import blaspool

            blaspool.give(request["blas_threads"])
        sys.argv = ["-m", request["spec"]]
        sys.modules.pop("reproci.worker.__main__", None)  # `-m` runs it as __main__ only, never imported
    except Exception as e:  # noqa: BLE001 - no run started: the launcher starts a fresh process
        print(f"reproci fork server: could not set up the run: {e}", file=sys.stderr)
        return EXIT_SETUP
    _send(status, {"pid": os.getpid()})
    status.close()
    try:
        runpy.run_module("reproci.worker", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def control_socket(argv: list[str]) -> socket.socket | None:
    """``--fd N``: the socket the launcher passed; ``--listen PATH``: bind PATH and take the
    first connection (a server in a container: the launcher connects through a mounted
    directory)."""
    if len(argv) != 2 or argv[0] not in ("--fd", "--listen"):
        return None
    if argv[0] == "--fd":
        return socket.socket(fileno=int(argv[1]))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(argv[1] + ".tmp")
    os.rename(argv[1] + ".tmp", argv[1])  # the path appears bound: the launcher never connects too early
    listener.listen(1)
    control, _ = listener.accept()
    listener.close()
    return control


def main(argv: list[str]) -> int:
    from .__main__ import die_with_parent

    die_with_parent()  # with the launcher's pid, then its children's parent is this process
    control = control_socket(argv)
    if control is None:
        print("usage: python -m reproci.worker.forkserver (--fd FD | --listen PATH)", file=sys.stderr)
        return 2
    os.environ["REPROCI_PARENT_PID"] = str(os.getpid())
    from .process import blaspool

    blas_threads = blaspool.hold()  # before numpy loads
    try:
        preload()
    except BaseException as e:  # noqa: BLE001 - the launcher falls back to fresh processes
        _send(control, {"ready": False, "reason": f"preload failed: {type(e).__name__}: {e}"})
        return 0
    gc.collect()
    gc.freeze()  # the imported modules' objects stay out of the children's collections: fewer copied pages
    why = unsafe() or (blaspool.check() if blas_threads else None)
    _send(control, {"ready": why is None, "reason": why, "pid": os.getpid()})
    if why is not None:
        return 0
    request = Server(control).serve()
    if request is None:
        return 0
    from .__main__ import leave

    leave(run_child({**request, "blas_threads": blas_threads}))  # as the run's own interpreter would end


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
