"""Fork servers: one preloaded server per distinct launch environment
(``reproci.worker.forkserver``), each forking the worker runs launched with that environment;
this module is the launcher's side of the protocol (``forkpool`` keeps the servers).

A forked run is a new process, with its own allocator and no CUDA context (the server never
touched a device, and CUDA starts in the child after the fork); what it shares with the
server, copy-on-write, is only the pages of modules both imported. Whatever is read before
the interpreter starts (the hash seed, the thread variables, the cuBLAS workspace, the CPU ISA
caps, a probe's variable) is exact, because the server itself was started with the run's whole
environment: a run whose environment differs gets a server of its own.

Where a server cannot give a run what a fresh interpreter would (more than one thread: the
BLAS libraries start their pools as they load, and a process with threads must not fork), or
a server fails, the run starts as a fresh process and the reason is kept with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path, PurePosixPath
from typing import IO, Callable, TypedDict

from ..worker.process.forks import Hello
from .base import OnStep, take_line

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
READY_TIMEOUT_S = 180.0  # a server that has not imported torch by then is given up


def kill_process_group(proc: subprocess.Popen[bytes], signals: tuple[int, ...] = (signal.SIGKILL,)) -> None:
    """Send each signal to ``proc``'s process group, waiting up to 10 s after each."""
    for sig in signals:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def fresh_reason(env: dict[str, str], *, world_size: int) -> str | None:
    """Why a run with this environment starts as a fresh process without asking a server."""
    if world_size > 1:
        return "torchrun starts the ranks"
    if not hasattr(socket, "send_fds") or not sys.platform.startswith("linux"):
        return "fork servers need Linux"
    return None



class Answer(TypedDict, total=False):
    """A server's message on a run's status socket: the forked run's pid and start, then its exit
    status when it ends (negative: killed by that signal); or why it would not fork."""

    pid: int
    started: float  # time.monotonic() in the run as it started
    status: int
    refused: str


class ServerFailed(Exception):
    """The server could not fork this run (or any): the run starts as a fresh process."""


class ForkedRun:
    """One run forked by a server: a Popen-like handle (stdout, wait, kill, returncode)."""

    def __init__(self, status: socket.socket, stdout: IO[bytes], pid: int, server: "ForkServer",
                 started: float | None = None) -> None:
        self._status = status
        self.stdout = stdout
        self.pid = pid
        self.started = started  # time.monotonic() in the run as it started (one clock for the host)
        self.server = server
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        self._status.settimeout(timeout)
        try:
            data = self._status.recv(1 << 12)
        except socket.timeout:
            raise subprocess.TimeoutExpired("forked worker", timeout or 0.0) from None
        except OSError:
            data = b""
        message: Answer = json.loads(data) if data else {}
        self.returncode = int(message.get("status", -signal.SIGKILL))  # no word: the server died, and the run with it
        self._status.close()
        self.server.hold(-1)
        return self.returncode

    def kill_group(self) -> None:
        self.server.kill(self.pid)


class ForkServer:
    """One server, over its control socket: ``fork`` is safe from several threads. ``stop``
    ends the server (and with it every run it forked); ``kill_by_message`` asks the server to
    kill a run's group (a server in a container: its pids are not this host's)."""

    def __init__(self, control: socket.socket, *, stop: Callable[[], None], describe: Callable[[], str],
                 kill_by_message: bool = False) -> None:
        self.control = control
        self._stop = stop
        self.kill_by_message = kill_by_message
        self.lock = threading.Lock()
        self.active = 0
        self.dead: str | None = None
        hello = self._hello(describe)
        if not hello.get("ready"):
            self.close()
            raise ServerFailed(str(hello.get("reason") or "the server did not start"))

    def _hello(self, describe: Callable[[], str]) -> Hello:
        """The server's first message: ready, or why not (it has imported torch by then)."""
        self.control.settimeout(READY_TIMEOUT_S)
        try:
            data = self.control.recv(1 << 12)
        except socket.timeout:
            return {"reason": f"the server was not ready after {READY_TIMEOUT_S:g} s"}
        except OSError as e:
            reason = str(e)  # e is unbound once the except clause ends: describe() runs after it
            data, describe = b"", (lambda: reason)
        finally:
            self.control.settimeout(None)
        return json.loads(data) if data else {"reason": f"the server stopped: {describe()}"}

    def hold(self, delta: int) -> None:
        """Count a run in (1) or out (-1): a server with runs is never evicted."""
        with self.lock:
            self.active += delta

    def fork(self, spec_file: Path | PurePosixPath, cwd: Path | PurePosixPath) -> ForkedRun:
        """Fork one run of ``spec_file`` in ``cwd``; raise ServerFailed if it cannot start."""
        if self.dead is not None:
            raise ServerFailed(self.dead)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r, w = os.pipe()
        try:
            request = json.dumps({"spec": str(spec_file), "cwd": str(cwd)}).encode()
            with self.lock:
                socket.send_fds(self.control, [request], [theirs.fileno(), w])
        except OSError as e:
            os.close(r)
            ours.close()
            self.dead = f"the server is gone ({e})"
            raise ServerFailed(self.dead) from None
        finally:
            theirs.close()
            os.close(w)
        stdout = os.fdopen(r, "rb")
        ours.settimeout(READY_TIMEOUT_S)
        try:
            data = ours.recv(1 << 12)
        except OSError:
            data = b""
        message: Answer = json.loads(data) if data else {"refused": "the server did not answer"}
        if "pid" not in message:
            ours.close()
            stdout.close()
            raise ServerFailed(str(message.get("refused") or f"the run exited {message.get('status')} as it was set up"))
        return ForkedRun(ours, stdout, int(message["pid"]), self, message.get("started"))

    def kill(self, pid: int) -> None:
        """SIGKILL to a forked run's process group (its loader workers too)."""
        if not self.kill_by_message:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return
        try:
            with self.lock:
                self.control.send(json.dumps({"kill": pid}).encode())
        except OSError:
            pass  # the server is gone, and its runs with it

    def close(self) -> None:
        """Stop the server; its children die with it (they carry PR_SET_PDEATHSIG)."""
        self.dead = self.dead or "closed"
        try:
            self.control.close()
        except OSError:
            pass
        self._stop()


def follow(run: ForkedRun, timeout: float, on_step: OnStep | None) -> tuple[int, bool, str]:
    """Wait for a forked run (killed past ``timeout``, or when this thread is interrupted),
    its output read as it comes: (exit code, timed out, the last lines)."""
    tail: deque[str] = deque(maxlen=40)

    def read() -> None:
        for raw in run.stdout:
            take_line(raw.decode("utf-8", "replace").rstrip(), tail, on_step)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed_out = False
    try:
        run.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        run.kill_group()
    except BaseException:
        run.kill_group()
        raise
    finally:
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            pass
        reader.join(timeout=5)
    return (-signal.SIGKILL if run.returncode is None else run.returncode), timed_out, "\n".join(tail)
