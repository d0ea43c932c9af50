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

``--stand PATH IDLE_S`` starts a standing server, shared by the reproci invocations that
launch with the same environment (``backends/standing_fork_servers.py`` finds or starts it): it listens at
PATH for any number of launchers, greets each with the same hello, kills the runs of a
launcher whose socket closes (it ended, or was killed), outlives its launchers, and ends
once no launcher and no run has used it for IDLE_S seconds.

Standard library, torch and numpy only: like the rest of the worker.
"""

from __future__ import annotations

import gc
import os
import random
import runpy
import socket
import sys
import time

from .process.forks import IDLE_END, Forked, Hello, Server, unsafe  # noqa: F401 - unsafe: the check before every fork
from .process.forks import send as _send

# torch._inductor.config: torch.use_deterministic_algorithms imports it (seconds, on a CPU)
PRELOAD = ("torch", "numpy", "torch.optim", "torch._dynamo", "torch._inductor.config", "torch.utils.data",
           "torch.distributed",
           "reproci.worker.train", "reproci.worker.audit.audit", "reproci.worker.audit.oprecord")
EXIT_SETUP = 70  # the child could not be set up (no run started): the launcher starts a fresh process


def preload() -> None:
    """Import what every run imports, and read what cannot change while the server lives
    (the installed packages)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from .process import envinfo

    envinfo.packages()


class Child(Forked):
    """What the forked child runs: its request, and the run's BLAS threads (``openblas_threads.hold``)."""

    blas_threads: str | None


def run_child(request: Child) -> int:
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
        blas_threads = request["blas_threads"]
        if blas_threads:  # the run's BLAS threads, started here, after the fork
            from .process import openblas_threads

            openblas_threads.give(blas_threads)
        sys.argv = ["-m", request["spec"]]
        sys.modules.pop("reproci.worker.__main__", None)  # `-m` runs it as __main__ only, never imported
    except Exception as e:  # noqa: BLE001 - no run started: the launcher starts a fresh process
        print(f"reproci fork server: could not set up the run: {e}", file=sys.stderr)
        return EXIT_SETUP
    _send(status, {"pid": os.getpid(), "started": time.monotonic()})  # the host's clock: its launcher reads it too
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
    listener = bound(argv[1])
    control, _ = listener.accept()
    listener.close()
    return control


def bound(path: str) -> socket.socket:
    """A listening socket at ``path``, which appears bound: a launcher never connects too early."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)
    listener.listen(16)
    return listener


def _refuse_waiting(listener: socket.socket, hello: Hello) -> None:
    """Tell the launchers that connected as a standing server gave up why it did (a failed
    preload), or that it is gone (idle), rather than leaving them to read a closed socket."""
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        _send(conn, hello if not hello.get("ready") else {"ready": False, "reason": IDLE_END})
        conn.close()


def main(argv: list[str]) -> int:
    """``--fd FD`` | ``--listen PATH``: a server of one launcher, dying with it. ``--stand PATH
    IDLE_S``: a standing server at PATH for any launcher, until idle for IDLE_S seconds."""
    from .__main__ import die_with_parent

    standing = len(argv) == 3 and argv[0] == "--stand"
    if not standing:
        die_with_parent()  # with the launcher's pid, then its children's parent is this process
    listener = bound(argv[1]) if standing else None
    control = None if standing else control_socket(argv)
    if control is None and listener is None:
        print("usage: python -m reproci.worker.forkserver (--fd FD | --listen PATH | --stand PATH IDLE_S)",
              file=sys.stderr)
        return 2
    os.environ["REPROCI_PARENT_PID"] = str(os.getpid())
    from .process import openblas_threads

    blas_threads = openblas_threads.hold()  # before numpy loads
    try:
        preload()
        why = None
    except BaseException as e:  # noqa: BLE001 - the launcher falls back to fresh processes
        why = f"preload failed: {type(e).__name__}: {e}"
    gc.collect()
    gc.freeze()  # the imported modules' objects stay out of the children's collections: fewer copied pages
    why = why or unsafe() or (openblas_threads.check() if blas_threads else None)
    hello: Hello = {"ready": why is None, "reason": why, "pid": os.getpid()}
    if control is not None:
        _send(control, hello)
    request = None if why is not None else Server(control, listener=listener, hello=hello,
                                                  idle_s=float(argv[2]) if standing else 0.0).serve()
    if request is None:
        if standing:
            os.unlink(argv[1])
            _refuse_waiting(listener, hello)  # type: ignore[arg-type]
            print(f"reproci fork server {os.getpid()}: {why or 'idle'}, exiting", file=sys.stderr)
        return 0
    from .__main__ import leave

    leave(run_child({**request, "blas_threads": blas_threads}))  # as the run's own interpreter would end


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
